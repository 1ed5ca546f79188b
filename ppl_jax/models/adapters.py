"""Flax models as `LanguageModel`s: `from_linen` and `from_nnx`, each in one of two forms.

- `returns="logits"` (the default): the module's `__call__(tokens)` returns logits `[batch, seq,
  vocab]`. Such a model knows nothing of positions or segments: it sees each row from position 0,
  and a token attends to every earlier token of its row. So windows are never packed into one row
  for it (`honours_segments` defaults to False) unless the model says it keeps segments apart, in
  which case its `__call__` must take `segment_ids` (and may take `positions`), and the evaluator
  checks the claim on one row before scoring (`ppl_jax.evaluation.evaluator`).
- `returns="hidden_states"`: `__call__(tokens, positions, segment_ids)` returns the final hidden
  states `[batch, seq, embed]` and `unembedding()` the `[embed, vocab]` output matrix (a
  `logit_softcap` attribute, if any, is the final-logit soft-cap); the scorer then computes the
  logits in vocabulary blocks, never all at once (`HiddenStates`). ppl_jax's own families are
  built this way (`ppl_jax.models.registry.build`); `honours_segments` defaults to True.

Params are the module's own tree (Linen: the `params` collection; NNX: the `nnx.Param` state as
a pure dict, `nnx.to_pure_dict` form), so the checkpoint a training loop saved restores with the
`identity` mapping (`ppl_jax.checkpoints.mapping.presets`). Weights are replicated unless the
module's params carry logical axis names (`nn.with_logical_partitioning`, `nnx.Param(...,
sharding=...)`/`logical_axes=...`).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from flax import linen as nn
from flax import nnx

from ppl_jax.models.interface import HiddenStates, LanguageModel, Logits

RETURNS = ("logits", "hidden_states")


def _call_kwargs(fn: Callable, positions: Any, segment_ids: Any) -> dict[str, Any]:
    params = inspect.signature(fn).parameters
    kwargs = {}
    if "positions" in params:
        kwargs["positions"] = positions
    if "segment_ids" in params:
        kwargs["segment_ids"] = segment_ids
    return kwargs


def _qualified(cls: type) -> str:
    """`pkg.mod.Class` of a module class (`LanguageModel.origin`)."""
    return f"{cls.__module__}.{cls.__qualname__}"


def _axes(leaf: Any) -> tuple[str, ...]:
    names = getattr(leaf, "names", None)  # nn.LogicallyPartitioned
    return tuple(names) if names else ()


def _honours(returns: str, honours_segments: bool | None) -> bool:
    if returns not in RETURNS:
        raise ValueError(f"returns={returns!r} is not one of {', '.join(RETURNS)}")
    return returns == "hidden_states" if honours_segments is None else bool(honours_segments)


def from_linen(
    module: nn.Module,
    vocab_size: int,
    max_positions: int,
    *,
    returns: str = "logits",
    honours_segments: bool | None = None,
    description: dict[str, Any] | None = None,
    dtype: Any = jnp.float32,
) -> LanguageModel:
    """A Linen module as a `LanguageModel`.

    Args:
      module: the module (not initialised: its params are only traced, `jax.eval_shape`).
      vocab_size: the number of token ids it scores (its logits' last dimension).
      max_positions: the longest row it takes.
      returns: `logits` (`__call__(tokens)` returns `[batch, seq, vocab]`) or `hidden_states`
        (`__call__(tokens, positions, segment_ids)` returns `[batch, seq, embed]`, and the
        method `unembedding()` the `[embed, vocab]` matrix); see the module docstring.
      honours_segments: it takes `segment_ids` and keeps segments apart (packing allowed);
        default False for `logits`, True for `hidden_states`.
      description: a JSON-able description kept with results (default: the module's repr).
      dtype: the params' dtype (a float params leaf is cast; the module computes as it does).

    Returns:
      A `LanguageModel` whose params are the module's `params` collection.

    Raises:
      ValueError: an unknown `returns`.
    """
    honours = _honours(returns, honours_segments)
    tokens = jnp.zeros((1, min(8, max_positions)), jnp.int32)
    ones = jnp.ones_like(tokens)
    if returns == "hidden_states":
        kwargs = {"positions": tokens, "segment_ids": ones}
    else:
        kwargs = _call_kwargs(module.__call__, tokens, ones)
    variables = jax.eval_shape(lambda: module.init(jax.random.key(0), tokens, **kwargs))
    boxed = variables["params"]
    is_box = lambda x: isinstance(x, nn.LogicallyPartitioned)  # noqa: E731
    flat = jax.tree_util.tree_flatten_with_path(boxed, is_leaf=is_box)[0]
    names = {_path(p): _axes(leaf) for p, leaf in flat}
    abstract = jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, _cast(x.dtype, dtype)), nn.unbox(boxed)
    )
    logical = _logical(abstract, names)

    def apply(params, tokens, positions, segment_ids):
        if returns == "hidden_states":
            hidden = module.apply({"params": params}, tokens, positions, segment_ids)
            unembedding = module.apply({"params": params}, method="unembedding")
            return HiddenStates(hidden, unembedding, getattr(module, "logit_softcap", None))
        call = _call_kwargs(module.__call__, positions, segment_ids)
        return Logits(module.apply({"params": params}, tokens, **call))

    return LanguageModel(
        apply=apply,
        abstract_params=abstract,
        logical_axes=logical,
        vocab_size=vocab_size,
        max_positions=max_positions,
        description=description or {"family": "linen", "module": repr(module)[:2000]},
        honours_segments=honours,
        origin=f"ppl_jax.from_linen({_qualified(type(module))})",
    )


def from_nnx(
    module_fn: Callable[[], nnx.Module],
    vocab_size: int,
    max_positions: int,
    *,
    returns: str = "logits",
    honours_segments: bool | None = None,
    description: dict[str, Any] | None = None,
    dtype: Any = jnp.float32,
) -> LanguageModel:
    """An NNX module as a `LanguageModel`.

    Args:
      module_fn: builds the module (called under `nnx.eval_shape`: no weights are allocated).
        Each `nnx.Param` may carry `logical_axes=(...)` (or `sharding=(...)`) metadata, one name
        per dim; weights without it are replicated.
      vocab_size: the number of token ids it scores (its logits' last dimension).
      max_positions: the longest row it takes.
      returns: `logits` (`__call__(tokens)`, taking `positions` and `segment_ids` when its
        signature names them, returns `[batch, seq, vocab]`) or `hidden_states`
        (`__call__(tokens, positions, segment_ids)` returns `[batch, seq, embed]`,
        `unembedding()` the `[embed, vocab]` matrix, and a `logit_softcap` attribute, if any,
        the final-logit soft-cap); see the module docstring.
      honours_segments: it keeps segments apart (packing allowed); default False for `logits`,
        True for `hidden_states`.
      description: a JSON-able description kept with results (default: the module's name).
      dtype: the params' dtype (a float params leaf is cast; the module computes as it does).

    Returns:
      A `LanguageModel` whose params are the module's `nnx.Param` state as a pure dict with
        string keys, the tree a training loop saves (`params_of_nnx`).

    Raises:
      ValueError: an unknown `returns`.
    """
    honours = _honours(returns, honours_segments)
    abstract_module = nnx.eval_shape(module_fn)
    graphdef, state, rest = nnx.split(abstract_module, nnx.Param, ...)
    pure = _str_keys(nnx.to_pure_dict(state))
    abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, _cast(x.dtype, dtype)), pure)
    flat = jax.tree_util.tree_flatten_with_path(
        state, is_leaf=lambda x: isinstance(x, nnx.Variable)
    )
    axes = {}
    for path, var in flat[0]:
        meta = var.get_metadata() if hasattr(var, "get_metadata") else {}
        axes[_path(path)] = tuple(meta.get("logical_axes") or meta.get("sharding") or ())
    logical = _logical(abstract, axes)
    call = type(abstract_module).__call__

    paths = [[str(getattr(k, "key", k)) for k in path] for path, _ in flat[0]]
    variables = [v for _, v in flat[0]]

    def apply(params, tokens, positions, segment_ids):
        leaves = []
        for path, var in zip(paths, variables, strict=True):
            node = params
            for key in path:
                node = node[key]
            leaves.append(var.replace(node))
        model = nnx.merge(graphdef, jax.tree.unflatten(flat[1], leaves), rest)
        if returns == "hidden_states":
            hidden = model(tokens, positions, segment_ids)
            return HiddenStates(hidden, model.unembedding(), getattr(model, "logit_softcap", None))
        return Logits(model(tokens, **_call_kwargs(call, positions, segment_ids)))

    return LanguageModel(
        apply=apply,
        abstract_params=abstract,
        logical_axes=logical,
        vocab_size=vocab_size,
        max_positions=max_positions,
        description=description or {"family": "nnx", "module": type(abstract_module).__name__},
        honours_segments=honours,
        origin=f"ppl_jax.from_nnx({_qualified(type(abstract_module))})",
    )


def params_of_nnx(module: nnx.Module) -> dict[str, Any]:
    """The params of a concrete NNX module, as the string-keyed dict `from_nnx` uses."""
    return _str_keys(nnx.to_pure_dict(nnx.state(module, nnx.Param)))


def _path(path: Any) -> str:
    return "/".join(str(getattr(k, "key", getattr(k, "idx", k))) for k in path)


def _logical(abstract: Any, names: dict[str, tuple]) -> Any:
    """One logical name per dim for each leaf (None: replicated), as `abstract` is nested."""

    def leaf(path, x):
        given = names.get(_path(path), ())
        return tuple(given) if len(given) == len(x.shape) else (None,) * len(x.shape)

    return jax.tree_util.tree_map_with_path(leaf, abstract)


def _cast(stored: Any, want: Any) -> Any:
    return want if jnp.issubdtype(stored, jnp.floating) else stored


def _str_keys(tree: Any) -> Any:
    if isinstance(tree, dict):
        return {str(k): _str_keys(v) for k, v in tree.items()}
    return tree
