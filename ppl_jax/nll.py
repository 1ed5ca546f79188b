"""Per-token negative log-likelihood, predictive entropy and top-1 correctness, memory-bounded.

From final hidden states `h [B, T, D]` and the unembedding `W [D, V]`, the logits `h @ W` are
never materialised whole: a `lax.scan` over vocabulary blocks of `block` columns keeps, per token,
a running maximum `m`, `s = sum exp(l - m)` and `t = sum exp(l - m) * (l - m)` (the online
log-sum-exp of Milakov & Gimelshein 2018, "Online normalizer calculation for softmax"), in
float32 with float32 matmul outputs. Then

- NLL = logsumexp(l) - l[target], with logsumexp = m + log s;
- predictive entropy H = log s - t / s (nats), centred on `m` to avoid cancellation;
- correct = (argmax l == target), the first maximum winning ties.

The target's logit is a dot product with its own column of `W` (a gather, no one-hot). The
largest temporary is `[B, T, block]`, independent of the vocabulary size.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from ppl_jax.model import HiddenStates, Logits

VOCAB_BLOCK = 8192


class TokenStats(NamedTuple):
    """Per target, each `[batch, seq]`: nll (float32, nats), entropy (float32, nats), correct
    (bool, top-1)."""

    nll: jax.Array
    entropy: jax.Array
    correct: jax.Array


def _from_logits(logits: jax.Array, targets: jax.Array) -> TokenStats:
    logits = logits.astype(jnp.float32)
    log_probs = jax.nn.log_softmax(logits, axis=-1)
    nll = -jnp.take_along_axis(log_probs, targets[..., None], axis=-1)[..., 0]
    entropy = -jnp.sum(
        jnp.exp(log_probs) * jnp.where(jnp.isneginf(log_probs), 0.0, log_probs), axis=-1
    )
    correct = jnp.argmax(logits, axis=-1) == targets
    return TokenStats(nll, entropy, correct)


def _blocked(
    hidden: jax.Array, unembedding: jax.Array, targets: jax.Array, block: int
) -> TokenStats:
    v = unembedding.shape[1]
    block = min(block, v)
    num_blocks = -(-v // block)
    # Block k covers columns [k*block, (k+1)*block); the last block starts at v - block instead
    # (no padded copy of W) and ignores the columns an earlier block already covered.
    target_logit = jnp.einsum(
        "btd,dbt->bt",
        hidden,
        jnp.take(unembedding, targets, axis=1),
        preferred_element_type=jnp.float32,
    )
    shape = targets.shape
    init = (
        jnp.full(shape, -jnp.inf, jnp.float32),  # running max
        jnp.zeros(shape, jnp.float32),  # sum exp(l - m)
        jnp.zeros(shape, jnp.float32),  # sum exp(l - m) * (l - m)
        jnp.zeros(shape, jnp.int32),  # argmax so far
    )

    def body(carry, k):
        m, s, t, best = carry
        nominal = k * block
        first = jnp.minimum(nominal, v - block)
        w_blk = jax.lax.dynamic_slice_in_dim(unembedding, first, block, axis=1)
        logits = jnp.einsum("btd,dv->btv", hidden, w_blk, preferred_element_type=jnp.float32)
        valid = first + jnp.arange(block) >= nominal
        logits = jnp.where(valid, logits, -jnp.inf)
        blk_max = jnp.max(logits, axis=-1)
        blk_arg = jnp.argmax(logits, axis=-1).astype(jnp.int32) + first
        m_new = jnp.maximum(m, blk_max)
        shift = jnp.where(jnp.isfinite(m), m - m_new, 0.0)  # <= 0; 0 before the first block
        scale = jnp.exp(shift)
        centred = jnp.where(valid, logits - m_new[..., None], 0.0)
        e = jnp.where(valid, jnp.exp(centred), 0.0)
        t = scale * (t + s * shift) + jnp.sum(e * centred, axis=-1)
        s = s * scale + jnp.sum(e, axis=-1)
        best = jnp.where(blk_max > m, blk_arg, best)  # strictly greater: first maximum wins
        return (m_new, s, t, best), None

    (m, s, t, best), _ = jax.lax.scan(body, init, jnp.arange(num_blocks, dtype=jnp.int32))
    log_s = jnp.log(s)
    return TokenStats(m + log_s - target_logit, log_s - t / s, best == targets)


def token_stats(
    output: HiddenStates | Logits, targets: jax.Array, block: int = VOCAB_BLOCK
) -> TokenStats:
    """NLL, predictive entropy and top-1 correctness of each target.

    Args:
      output: the model's `HiddenStates` (scored in vocabulary blocks, memory-bounded) or
        `Logits` (already materialised by the model; log-softmax in float32).
      targets: `[batch, seq] int32` token ids, each in `[0, vocab)`.
      block: vocabulary columns per block.

    Returns:
      `TokenStats`, each `[batch, seq]`.
    """
    if isinstance(output, Logits):
        return _from_logits(output.logits, targets)
    return _blocked(output.hidden, output.unembedding, targets, block)


def token_nll(output: HiddenStates | Logits, targets: jax.Array) -> jax.Array:
    """`[batch, seq] float32`: the negative log-likelihood (nats) of each target."""
    return token_stats(output, targets).nll
