"""The interface between a model and the scorer, and the adapter for Flax NNX modules.

The scorer never imports Flax. It sees a `LanguageModel`: a pure function from
`(params, tokens, positions, segment_ids)` to either final hidden states plus an unembedding
matrix (`HiddenStates`) or to `Logits`, and the abstract params tree with the logical axis names of
every weight. A user's own Linen or NNX model plugs in by building one of these.

Params are a nested dict with string keys (the form Orbax stores), leaves `jax.Array`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
from flax import nnx


class HiddenStates(NamedTuple):
    """hidden: `[batch, seq, embed]`; unembedding: `[embed, vocab]` (logits = hidden @ it)."""

    hidden: jax.Array
    unembedding: jax.Array


class Logits(NamedTuple):
    """logits: `[batch, seq, vocab]` (any float dtype; the scorer upcasts to float32)."""

    logits: jax.Array


ApplyFn = Callable[[Any, jax.Array, jax.Array, jax.Array], HiddenStates | Logits]


@dataclasses.dataclass(frozen=True)
class LanguageModel:
    """What the scorer needs of a model.

    Attributes:
      apply: `(params, tokens [B,T] int32, positions [B,T] int32, segment_ids [B,T] int32)` ->
        `HiddenStates` or `Logits`. Pure and jit-compatible; segment 0 marks padding, and a token
        attends only to earlier tokens of its own segment.
      abstract_params: the params tree with `jax.ShapeDtypeStruct` leaves.
      logical_axes: the same tree with a tuple of logical axis names per leaf.
      vocab_size: number of token ids the model scores.
      max_positions: the longest window the model supports.
      description: JSON-able architecture, stored beside checkpoints.
    """

    apply: ApplyFn
    abstract_params: Any
    logical_axes: Any
    vocab_size: int
    max_positions: int
    description: dict[str, Any]


def _str_keys(tree: Any) -> Any:
    if isinstance(tree, dict):
        return {str(k): _str_keys(v) for k, v in tree.items()}
    return tree


def from_nnx(
    module_fn: Callable[[], nnx.Module],
    vocab_size: int,
    max_positions: int,
    description: dict[str, Any],
) -> LanguageModel:
    """Adapts an NNX module whose `__call__(tokens, positions, segment_ids)` returns hidden states
    and whose `unembedding()` returns `[embed, vocab]`.

    The module is built abstractly (`nnx.eval_shape`): no weights are allocated here. Each
    `nnx.Param` should carry `logical_axes=(...)` metadata, one name per dim.
    """
    abstract_module = nnx.eval_shape(module_fn)
    graphdef, state = nnx.split(abstract_module, nnx.Param)
    leaves_with_paths, treedef = jax.tree_util.tree_flatten_with_path(
        state, is_leaf=lambda x: isinstance(x, nnx.Variable)
    )
    paths = [tuple(str(getattr(k, "key", k)) for k in path) for path, _ in leaves_with_paths]

    def nested(values: list[Any]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for path, value in zip(paths, values, strict=True):
            node = out
            for key in path[:-1]:
                node = node.setdefault(key, {})
            node[path[-1]] = value
        return out

    variables = [v for _, v in leaves_with_paths]
    abstract_params = nested([jax.ShapeDtypeStruct(v.shape, v.dtype) for v in variables])
    logical_axes = nested([tuple(v.get_metadata().get("logical_axes") or ()) for v in variables])

    def apply(params, tokens, positions, segment_ids):
        leaves = []
        for path, var in zip(paths, variables, strict=True):
            node = params
            for key in path:
                node = node[key]
            leaves.append(var.replace(node))
        model = nnx.merge(graphdef, jax.tree.unflatten(treedef, leaves))
        return HiddenStates(model(tokens, positions, segment_ids), model.unembedding())

    return LanguageModel(
        apply=apply,
        abstract_params=abstract_params,
        logical_axes=logical_axes,
        vocab_size=vocab_size,
        max_positions=max_positions,
        description=description,
    )


def params_of_nnx(module: nnx.Module) -> dict[str, Any]:
    """The params of a concrete NNX module, as the string-keyed dict `LanguageModel` uses."""
    return _str_keys(nnx.to_pure_dict(nnx.state(module, nnx.Param)))


def weight_paths(params: Any) -> dict[str, Any]:
    """The leaves of a params tree by their `/`-joined names (`layers/0/attn/q`), in tree order."""
    flat = jax.tree_util.tree_flatten_with_path(params)[0]
    return {"/".join(str(getattr(k, "key", k)) for k in path): leaf for path, leaf in flat}


def nest_weights(flat: dict[str, Any]) -> dict[str, Any]:
    """The params tree of `/`-joined names (the inverse of `weight_paths`)."""
    tree: dict[str, Any] = {}
    for name, leaf in flat.items():
        node = tree
        *parents, last = name.split("/")
        for p in parents:
            node = node.setdefault(p, {})
        node[last] = leaf
    return tree


def build(description: dict[str, Any], dtype: Any, attention: str = "xla") -> LanguageModel:
    """The `LanguageModel` for a stored architecture description.

    `description["family"]` picks the module: `llama` (`ppl_jax.models.llama`, which also covers
    Hugging Face Mistral and Qwen2) or `gpt2` (`ppl_jax.models.gpt2`); the rest of the dict is that
    family's config (`LlamaConfig.to_dict()`, `GPT2Config.to_dict()`, or `ppl_jax.checkpoints.hf.read_description`).

    Args:
      description: the JSON-able architecture.
      dtype: the params' dtype (`jnp.float32` or `jnp.bfloat16`).
      attention: the attention implementation, `xla`, `cudnn` or `splash`
        (`ppl_jax.models.attention`).

    Raises:
      CheckpointError: for a description of an unknown family or with unknown keys.
    """
    from ppl_jax.errors import CheckpointError
    from ppl_jax.models.gpt2 import GPT2, GPT2Config
    from ppl_jax.models.llama import Llama, LlamaConfig

    family = description.get("family")
    if family == "llama":
        cfg = LlamaConfig.from_dict(description)
        module_fn = lambda: Llama(cfg, nnx.Rngs(0), dtype, attention)  # noqa: E731
    elif family == "gpt2":
        cfg = GPT2Config.from_dict(description)
        module_fn = lambda: GPT2(cfg, nnx.Rngs(0), dtype, attention)  # noqa: E731
    else:
        raise CheckpointError(
            f"unknown model family {family!r} in the checkpoint (supported: llama, gpt2)."
        )
    return from_nnx(module_fn, cfg.vocab_size, cfg.max_positions, cfg.to_dict())
