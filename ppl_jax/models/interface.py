"""The interface between a model and the scorer (no Flax: `ppl_jax.models.adapters` adapts modules).

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

from ppl_jax.models.layers import packed


class HiddenStates(NamedTuple):
    """hidden: `[batch, seq, embed]`; unembedding: `[embed, vocab]` (logits = hidden @ it);
    logit_softcap: None, or `c` for logits `c * tanh((hidden @ unembedding) / c)` (Gemma 2's
    final-logit soft-cap), applied by the scorer to each vocabulary block in float32."""

    hidden: jax.Array
    unembedding: jax.Array
    logit_softcap: float | None = None


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
      honours_segments: whether `apply` keeps each segment to itself (a token attends only to
        earlier tokens of its own segment, positions as given). Only then are several windows
        packed into one row (`BatchSpec.packing`); a model that claims it but does not is refused
        by a one-row check before scoring (`ppl_jax.evaluation.evaluator`). True for ppl_jax's
        own families; set it False for a model that ignores `segment_ids`.
      context_parallel: whether `apply` is right when each row's tokens come in the context
        axis's load-balanced order, split over `mesh.context` (`ppl_jax.models.layers.context`):
        every layer per token or by positions, attention through
        `ppl_jax.models.layers.attention.attend`, sequence-carrying layers through
        `ppl_jax.models.layers.context.pass_state`. Only then does the scorer run the model with
        `mesh.context > 1`. True for ppl_jax's own families (set when they are built); False by
        default (a user's own model).
      origin: who built it, for the records (`ppl_jax.outputs.model_record`): `family:<name>`
        for ppl_jax's own families (`ppl_jax.models.registry.build`),
        `ppl_jax.from_nnx(<module>.<Class>)` or `ppl_jax.from_linen(...)` for an adapted
        module, the `module:function` of a `checkpoint.architecture` entry point; "" unknown.
    """

    apply: ApplyFn
    abstract_params: Any
    logical_axes: Any
    vocab_size: int
    max_positions: int
    description: dict[str, Any]
    honours_segments: bool = True
    context_parallel: bool = False
    origin: str = ""


def weight_paths(params: Any) -> dict[str, Any]:
    """The leaves of a params tree by their `/`-joined names (`layers/0/attn/q`), in tree order
    (a packed quantized weight, `ppl_jax.models.layers.packed.Packed`, as one leaf)."""
    flat = jax.tree_util.tree_flatten_with_path(params, is_leaf=packed.is_packed)[0]
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
