"""The one-row check that a model which claims to keep segments apart does (docs/protocols.md).

Packing (`ppl_jax.plans.layout`) puts several windows into one row as segments and relies on the
model to keep them apart: a token attends only to earlier tokens of its own segment, at the
positions given (`LanguageModel.honours_segments`). A model that ignores `segment_ids` would let
the second window see the first and give other numbers without a word. Before the first packed
batch, `check` scores one row twice: two segments packed, and the second segment alone in a row
of the same width (padding after it). Where the second segment's log-probabilities differ by more
than `TOLERANCE`, the model is refused.

Segments attend to nothing of each other, so the two computations differ only in rounding (the
masked keys add exact zeros to the softmax; the sums over keys may group other terms): about
1e-7 in float32 and 1e-3 in bfloat16 on the log-probabilities, while a model that lets the second
segment see the first differs by about 1e-2 or more (tested).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from ppl_jax.errors import ConfigError
from ppl_jax.models.interface import HiddenStates, LanguageModel
from ppl_jax.models.layers import packed

# The largest difference of a log-probability (nats) taken for rounding, per compute dtype.
TOLERANCE = {jnp.dtype(jnp.float32): 1e-5, jnp.dtype(jnp.bfloat16): 2e-2}
WIDTH = 16  # positions of the row (or the model's positions, if fewer)


def log_probs(model: LanguageModel, params: Any, tokens, positions, segments) -> jax.Array:
    """`[batch, seq, vocab] float32` log-probabilities of the model's next-token distribution."""
    out = model.apply(params, tokens, positions, segments)
    if isinstance(out, HiddenStates):
        logits = jnp.einsum(
            "bte,ev->btv",
            out.hidden,
            out.unembedding,
            preferred_element_type=jnp.float32,
        )
        cap = getattr(out, "logit_softcap", None)
        if cap:
            logits = cap * jnp.tanh(logits / cap)
    else:
        logits = out.logits
    return jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)


def difference(model: LanguageModel, params: Any, mesh: Mesh, width: int = WIDTH) -> float:
    """The largest absolute difference (nats) of the second segment's log-probabilities, packed
    after a first segment against alone in its row (see the module docstring)."""
    width = max(4, min(width, model.max_positions))
    first = width // 2
    second = width - first
    rng = np.random.default_rng(0)
    ids = rng.integers(0, model.vocab_size, size=width).astype(np.int32)
    packed_tokens = ids[None, :]
    packed_pos = np.concatenate([np.arange(first), np.arange(second)])[None, :].astype(np.int32)
    packed_seg = np.concatenate([np.ones(first), np.full(second, 2)])[None, :].astype(np.int32)
    alone_tokens = np.concatenate([ids[first:], np.zeros(first, np.int32)])[None, :]
    alone_pos = np.concatenate([np.arange(second), np.zeros(first)])[None, :].astype(np.int32)
    alone_seg = np.concatenate([np.ones(second), np.zeros(first)])[None, :].astype(np.int32)

    def diff(params, a, b):
        lp_packed = log_probs(model, params, *a)[:, first:]
        lp_alone = log_probs(model, params, *b)[:, :second]
        return jnp.max(jnp.abs(lp_packed - lp_alone))

    replicated = NamedSharding(mesh, PartitionSpec())
    fn = jax.jit(diff, out_shardings=replicated)
    value = fn(
        params, (packed_tokens, packed_pos, packed_seg), (alone_tokens, alone_pos, alone_seg)
    )
    return float(np.asarray(jax.device_get(value)))


def check(model: LanguageModel, params: Any, mesh: Mesh) -> None:
    """Refuses a model that claims to keep segments apart but does not (module docstring).

    Raises:
      ConfigError: the second segment's log-probabilities change when a first segment precedes
        it, naming the difference and the fix (`honours_segments=False`, or eval.packing=false).
    """
    dtypes = {jnp.dtype(leaf.dtype) for leaf in packed.leaves(params)}
    tolerance = max(TOLERANCE.get(d, 2e-2) for d in dtypes) if dtypes else 1e-5
    found = difference(model, params, mesh)
    if not found <= tolerance:
        raise ConfigError(
            f"the model says it keeps packed windows apart (LanguageModel.honours_segments), but "
            f"a window's log-probabilities change by {found:.3g} nats when another window "
            f"precedes it in the row (segment_ids ignored?); build the LanguageModel with "
            f"honours_segments=False, or set --config.eval.packing=false."
        )
