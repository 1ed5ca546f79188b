"""Flax NNX modules as `LanguageModel`s (`from_nnx`), and the registry of the model families
ppl_jax builds from an architecture description (`build`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
from flax import nnx

from ppl_jax.errors import CheckpointError
from ppl_jax.models.gpt2 import GPT2, GPT2Config
from ppl_jax.models.gpt_neox import GPTNeoX, GPTNeoXConfig
from ppl_jax.models.interface import HiddenStates, LanguageModel
from ppl_jax.models.llama import LlamaConfig
from ppl_jax.models.mixture import MixtureLlama

# The family registry: a description's `family` -> (its config class, its NNX module). The
# Hugging Face model types each family reads are in `ppl_jax.checkpoints.hf.MODEL_TYPES`.
FAMILIES = {
    "llama": (LlamaConfig, MixtureLlama),  # Llama, with MoE layers where the config has them
    "gpt2": (GPT2Config, GPT2),
    "gpt_neox": (GPTNeoXConfig, GPTNeoX),
}


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
    and whose `unembedding()` returns `[embed, vocab]` (and whose `logit_softcap` attribute, if
    any, is the final-logit soft-cap: `HiddenStates.logit_softcap`).

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
        hidden = model(tokens, positions, segment_ids)
        return HiddenStates(hidden, model.unembedding(), getattr(model, "logit_softcap", None))

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


def build(description: dict[str, Any], dtype: Any, attention: str = "xla") -> LanguageModel:
    """The `LanguageModel` for a stored architecture description.

    `description["family"]` picks the module in `FAMILIES`: `llama` (`ppl_jax.models.llama`,
    which also covers Hugging Face Mistral, Qwen2, Qwen3, OLMo 2/3, Gemma 2/3 and Phi-3 by its
    flags, and the mixtures of experts of `ppl_jax.models.mixture`), `gpt2` (`ppl_jax.models.gpt2`) or `gpt_neox` (`ppl_jax.models.gpt_neox`); the rest of
    the dict is that family's config (`LlamaConfig.to_dict()`, `GPT2Config.to_dict()`,
    `GPTNeoXConfig.to_dict()`, or `ppl_jax.checkpoints.hf.read_description`).

    Args:
      description: the JSON-able architecture.
      dtype: the params' dtype (`jnp.float32` or `jnp.bfloat16`).
      attention: the attention implementation, `xla`, `cudnn` or `splash`
        (`ppl_jax.models.attention`).

    Raises:
      CheckpointError: for a description of an unknown family or with unknown keys.
    """
    family = description.get("family")
    if family not in FAMILIES:
        raise CheckpointError(
            f"unknown model family {str(family)[:40]!r} in the checkpoint (supported: "
            f"{', '.join(FAMILIES)})."
        )
    config_class, module_class = FAMILIES[family]
    cfg = config_class.from_dict(description)
    module_fn = lambda: module_class(cfg, nnx.Rngs(0), dtype, attention)  # noqa: E731
    model = from_nnx(module_fn, cfg.vocab_size, cfg.max_positions, cfg.to_dict())
    # A family's layers are per token or by positions, attention is `attend` and recurrences go
    # through `ppl_jax.models.context.pass_state`: right under the context axis's token order
    # (`LanguageModel.context_parallel`), unless its module says `context_parallel = False`.
    return dataclasses.replace(
        model, context_parallel=bool(getattr(module_class, "context_parallel", True))
    )
