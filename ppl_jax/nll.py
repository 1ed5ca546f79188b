"""Per-token negative log-likelihood, predictive entropy and top-1 correctness, memory-bounded.

From final hidden states `h [B, T, D]` and the unembedding `W [D, V]`, the logits `h @ W` are
never materialised whole: a `lax.scan` over vocabulary blocks of `block` columns keeps, per token,
a running maximum `m`, `s = sum exp(l - m)` and `t = sum exp(l - m) * (l - m)` (the online
log-sum-exp of Milakov & Gimelshein 2018, "Online normalizer calculation for softmax"), in
float32 with float32 matmul outputs. Then

- NLL = logsumexp(l) - l[target], with logsumexp = m + log s;
- predictive entropy H = log s - t / s (nats), centred on `m` to avoid cancellation;
- correct = (l[target] is the largest logit), ties counting as correct.

The target's logit is picked from the block that holds it (`take_along_axis`, no one-hot), so it
is the very number the maximum was taken over. The largest temporary is `[B, T, block]`,
independent of the vocabulary size.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from ppl_jax.model import HiddenStates, Logits

VOCAB_BLOCK = 4096


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
    num_full, rest = divmod(v, block)

    def logits_of(first: int | jax.Array, width: int) -> jax.Array:
        w = jax.lax.dynamic_slice_in_dim(unembedding, first, width, axis=1)
        return jnp.einsum("btd,dv->btv", hidden, w, preferred_element_type=jnp.float32)

    def target_logit(logits, first, previous):
        index = targets - first
        inside = (index >= 0) & (index < logits.shape[-1])
        safe = jnp.clip(index, 0, logits.shape[-1] - 1)[..., None]
        return jnp.where(inside, jnp.take_along_axis(logits, safe, axis=-1)[..., 0], previous)

    def update(carry, logits, first):
        m, s, t, tl = carry
        m_new = jnp.maximum(m, jnp.max(logits, axis=-1))
        shift = m - m_new  # <= 0
        scale = jnp.exp(shift)
        centred = logits - m_new[..., None]
        e = jnp.exp(centred)
        t = scale * (t + s * shift) + jnp.sum(e * centred, axis=-1)
        s = s * scale + jnp.sum(e, axis=-1)
        return m_new, s, t, target_logit(logits, first, tl)

    # The first block starts the running sums; full blocks follow in a scan, then the remainder
    # (its own shape), so no block needs a validity mask.
    logits = logits_of(0, block)
    m = jnp.max(logits, axis=-1)
    centred = logits - m[..., None]
    e = jnp.exp(centred)
    carry = (
        m,
        jnp.sum(e, axis=-1),
        jnp.sum(e * centred, axis=-1),
        target_logit(logits, 0, jnp.zeros(targets.shape, jnp.float32)),
    )
    if num_full > 1:
        carry, _ = jax.lax.scan(
            lambda c, k: (update(c, logits_of(k * block, block), k * block), None),
            carry,
            jnp.arange(1, num_full, dtype=jnp.int32),
        )
    if rest:
        carry = update(carry, logits_of(num_full * block, rest), num_full * block)
    m, s, t, tl = carry
    log_s = jnp.log(s)
    return TokenStats(m + log_s - tl, log_s - t / s, tl >= m)


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
