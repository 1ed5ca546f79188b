"""Per-token negative log-likelihood, predictive entropy and top-1 correctness, memory-bounded;
optionally the top-k alternatives and the divergence from a reference model.

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

Optional outputs, computed in the same scan:

- top-k: `lax.top_k` of each block's logits merged with the carried top-k (global ids); the
  log-probabilities are `l - logsumexp(l)` with the final `m` and `s`.
- a reference model's logits `r` over the same vocabulary, scanned block by block beside the
  model's: its own `m_r`, `s_r`, target logit and argmax, and the KL terms below, rescaled like
  `s_r` when `m_r` moves.

KL(reference || model) without cancellation. With `d = r - l` per vocabulary entry and any
constant `c` (here `d` at the reference's largest logit of the first block), `e = d - c` and
`p` the reference's distribution,

    KL = E_p[d] - (logsumexp(r) - logsumexp(l)) = E_p[e] + log E_p[exp(-e)]
       = E_p[g(e)] + h(E_p[expm1(-e)]),   g(e) = e + expm1(-e) >= 0,   h(b) = log1p(b) - b,

since `logsumexp(l) - logsumexp(r) = log E_p[exp(-d)]` (plus the model's mass on ids the reference
rules out). The scan carries `G = sum exp(r - m_r) g(e)`, `B = sum exp(r - m_r) expm1(-e)` and
`D`, the model's mass where the reference has none (all scaled by `exp(c - m_r)`);
`KL = G / s_r + h(B / s_r) + D / s_r`. Where `|b| = |B / s_r| >= 1` (models far apart, the
reference's top token much less likely under the model) that form would cancel in turn, and the
direct `U / s_r - (logsumexp(r) - logsumexp(l))`, `U = sum exp(r - m_r) (r - l)`, is taken (the
two log-sum-exps as `(m_r - m) + (log s_r - log s)`): its error, about 1e-7 of the terms, is
small beside a KL of that size. Every term of `G` is
non-negative and `g`, `h` are evaluated by their Taylor series near 0, so nothing large cancels:
between nearly identical models (KL about 1e-6) the per-token KL is within about 1e-9 of
float64 computed from the same float32 logits, where `E_p[d] - (difference of log-sum-exps)` in
float32 was off by up to 4e-7 (`benchmarks/bench_kl.py`). A model against itself gives exactly 0.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from ppl_jax.models.interface import HiddenStates, Logits

VOCAB_BLOCK = 4096
MAX_TOP_K = 20


class TokenStats(NamedTuple):
    """Per target, each `[batch, seq]` unless said otherwise.

    Attributes:
      nll: float32, nats, `-log p(target)`.
      entropy: float32, nats, the entropy of the predictive distribution.
      correct: bool, the target's logit is the largest (blocked path: ties count as correct;
        `Logits` path: the target is the lowest id among the largest).
      top_ids: with `top_k = k > 0`, `[batch, seq, k] int32`, the k most probable ids, largest
        logit first, ties towards the lower id (as a stable argsort of `-logits`); else None.
      top_logprobs: with `top_k > 0`, `[batch, seq, k] float32`, natural-log probabilities of
        `top_ids`, normalised over the whole vocabulary; else None.
      kl: with a reference, float32, nats, KL(reference || model) =
        `sum_v p_ref(v) (log p_ref(v) - log p_model(v))`, within about 1e-9 of float64 from
        the same logits where the distributions nearly agree (see the module docstring); never
        below 0 but by rounding of `h`. Else None.
      reference_nll: with a reference, float32, nats, the reference's `-log p_ref(target)`.
      same_top1: with a reference, bool, both models' argmax ids equal (argmax: the lowest id
        among the largest logits).
    """

    nll: jax.Array
    entropy: jax.Array
    correct: jax.Array
    top_ids: jax.Array | None = None
    top_logprobs: jax.Array | None = None
    kl: jax.Array | None = None
    reference_nll: jax.Array | None = None
    same_top1: jax.Array | None = None


def vocab_size(output: HiddenStates | Logits) -> int:
    """The ids a model's output scores (its logits' last axis)."""
    return output.logits.shape[-1] if isinstance(output, Logits) else output.unembedding.shape[1]


def _leading_shape(output: HiddenStates | Logits) -> tuple[int, ...]:
    if isinstance(output, Logits):
        return output.logits.shape[:-1]
    return output.hidden.shape[:-1]


def _softcap(logits: jax.Array, cap: float | None) -> jax.Array:
    """`cap * tanh(logits / cap)` (Gemma 2's final-logit soft-cap, as transformers computes it),
    or `logits` when `cap` is None."""
    return logits if cap is None else jnp.tanh(logits / cap) * cap


def _full_logits(output: HiddenStates | Logits) -> jax.Array:
    if isinstance(output, Logits):
        return output.logits.astype(jnp.float32)
    logits = jnp.einsum(
        "btd,dv->btv", output.hidden, output.unembedding, preferred_element_type=jnp.float32
    )
    return _softcap(logits, output.logit_softcap)


def _block_source(output: HiddenStates | Logits) -> Callable[[int | jax.Array, int], jax.Array]:
    """`(first, width) -> [B, T, width] float32`: the logits of vocabulary columns
    `[first, first + width)`, computed from hidden states or sliced from logits."""
    if isinstance(output, Logits):

        def sliced(first, width):
            block = jax.lax.dynamic_slice_in_dim(output.logits, first, width, axis=-1)
            return block.astype(jnp.float32)

        return sliced

    def matmul(first, width):
        w = jax.lax.dynamic_slice_in_dim(output.unembedding, first, width, axis=1)
        logits = jnp.einsum("btd,dv->btv", output.hidden, w, preferred_element_type=jnp.float32)
        return _softcap(logits, output.logit_softcap)

    return matmul


def _from_logits(
    logits: jax.Array, targets: jax.Array, top_k: int = 0, reference: jax.Array | None = None
) -> TokenStats:
    """Full-vocabulary statistics; `reference`: the reference's `[B, T, V] float32` logits."""
    logits = logits.astype(jnp.float32)
    log_probs = jax.nn.log_softmax(logits, axis=-1)
    nll = -jnp.take_along_axis(log_probs, targets[..., None], axis=-1)[..., 0]
    entropy = -jnp.sum(
        jnp.exp(log_probs) * jnp.where(jnp.isneginf(log_probs), 0.0, log_probs), axis=-1
    )
    correct = jnp.argmax(logits, axis=-1) == targets
    stats = TokenStats(nll, entropy, correct)
    if top_k:
        _, top_ids = jax.lax.top_k(logits, top_k)
        top_logprobs = jnp.take_along_axis(log_probs, top_ids, axis=-1)
        stats = stats._replace(top_ids=top_ids, top_logprobs=top_logprobs)
    if reference is not None:
        ref_log_probs = jax.nn.log_softmax(reference, axis=-1)
        m_r = jnp.max(reference, axis=-1)
        g_sum, b_sum, d_sum, s_r, u_sum = _kl_terms(
            reference, logits, _kl_shift(reference, logits), m_r
        )
        lse_gap = (m_r + jnp.log(s_r)) - jax.nn.logsumexp(logits, axis=-1)
        stats = stats._replace(
            kl=_kl(g_sum, b_sum, d_sum, s_r, u_sum, lse_gap),
            reference_nll=-jnp.take_along_axis(ref_log_probs, targets[..., None], axis=-1)[..., 0],
            same_top1=jnp.argmax(reference, axis=-1) == jnp.argmax(logits, axis=-1),
        )
    return stats


def _target_logit(logits, targets, first, previous):
    index = targets - first
    inside = (index >= 0) & (index < logits.shape[-1])
    safe = jnp.clip(index, 0, logits.shape[-1] - 1)[..., None]
    return jnp.where(inside, jnp.take_along_axis(logits, safe, axis=-1)[..., 0], previous)


def _top_k_start(logits, k):
    values, ids = jax.lax.top_k(logits, k)
    return values, ids.astype(jnp.int32)


def _top_k_update(carry, logits, first, k):
    # The carried entries hold lower ids than this block's, and each part is sorted by
    # (value descending, id ascending); top_k puts the lower index first among equal values, so
    # ties go to the lower global id.
    values, ids = carry
    block_values, block_ids = jax.lax.top_k(logits, min(k, logits.shape[-1]))
    values = jnp.concatenate([values, block_values], axis=-1)
    ids = jnp.concatenate([ids, block_ids.astype(jnp.int32) + first], axis=-1)
    values, where = jax.lax.top_k(values, k)
    return values, jnp.take_along_axis(ids, where, axis=-1)


def _lowest_argmax(logits):
    """`[B, T] int32`: the lowest column holding the row's largest logit. (A minimum over
    column numbers where the logit equals the maximum, which XLA computes faster than the
    value-and-index reduction of `jnp.argmax`, ties resolved alike.)"""
    top = jnp.max(logits, axis=-1, keepdims=True)
    column = jax.lax.broadcasted_iota(jnp.int32, logits.shape, logits.ndim - 1)
    return jnp.min(jnp.where(logits == top, column, logits.shape[-1] - 1), axis=-1)


def _argmax_update(old_id, old_max, logits, first):
    """The running argmax id: a later block takes over only with a strictly larger logit."""
    better = jnp.max(logits, axis=-1) > old_max
    return jnp.where(better, _lowest_argmax(logits) + first, old_id)


_SERIES = 0.25  # |e| below which g is summed as its Taylor series (to e^8: 3e-10 relative)
# |b| below which h is (to b^8: 2e-15 relative); above, log1p(b) - b loses at most 2 eps / |b|
# relative, 7e-10 absolute.
_H_SERIES = 0.01


def _g_series(x):
    """`x + expm1(-x)` near 0: `sum_{k=2..8} (-x)^k / k!` (the rest below 3e-10 relative for
    `|x| < _SERIES`)."""
    y = -x
    return y * y * (1 / 2 + y * (1 / 6 + y * (1 / 24 + y * (1 / 120 + y * (1 / 720 + y * (
        1 / 5040 + y * (1 / 40320)))))))  # fmt: skip


def _h(b):
    """`log1p(b) - b`, accurate near 0: `sum_{k=2..8} (-1)^(k+1) b^k / k` for `|b| < _H_SERIES`."""
    series = -b * b * (1 / 2 - b * (1 / 3 - b * (1 / 4 - b * (1 / 5 - b * (1 / 6 - b * (
        1 / 7 - b * (1 / 8)))))))  # fmt: skip
    return jnp.where(jnp.abs(b) < _H_SERIES, series, jnp.log1p(b) - b)


def _kl_terms(ref, logits, c, m_r):
    """`(G, B, D, s, U)` of one block (see the module docstring): `sum w g(e)`, `sum w expm1(-e)`,
    `D = sum q` over the columns the reference rules out, `sum w` and `U = sum w (r - l)`, with `w = exp(r - m_r)` and `e = r - l - c`. `w exp(-e)` is computed as
    `q = exp(l + c - m_r)` (no overflow where `e` is very negative), so that `w expm1(-e) = q - w`
    (its rounding, about 1e-7 of `w`, reaches KL only through `h(b) ~ b^2`) and, away from 0,
    `w g(e) = w (e - 1) + q`; near 0 `w g(e)` is `w` times the series. A column the reference
    rules out (`w = 0`) adds 0."""
    shifted = ref - m_r[..., None]
    w = jnp.exp(shifted)
    q = jnp.exp(logits + (c - m_r)[..., None])
    e = ref - logits - c[..., None]
    live = w > 0
    gw = jnp.where(jnp.abs(e) < _SERIES, w * _g_series(e), w * (e - 1.0) + q)
    return (
        jnp.sum(jnp.where(live, gw, 0.0), axis=-1),
        jnp.sum(q - w, axis=-1),  # every column: logsumexp(l) sums them all
        jnp.sum(jnp.where(live, 0.0, q), axis=-1),
        jnp.sum(w, axis=-1),
        jnp.sum(jnp.where(live, w * (ref - logits), 0.0), axis=-1),  # U: for the direct form
    )


def _kl_shift(ref, logits):
    """`c [B, T]`: `r - l` at the reference's largest logit (lowest such column)."""
    at = _lowest_argmax(ref)[..., None]
    return (jnp.take_along_axis(ref, at, axis=-1) - jnp.take_along_axis(logits, at, axis=-1))[
        ..., 0
    ]


def _kl(g_sum, b_sum, d_sum, s_r, u_sum, lse_gap):
    """KL(reference || model) from the scan's sums (see the module docstring): the form without
    cancellation where `|b| < 1`, else (models far apart, where it would cancel instead) the
    direct `U / s_r - (logsumexp(r) - logsumexp(l))`, `lse_gap` the latter difference."""
    b = b_sum / s_r
    return jnp.where(jnp.abs(b) < 1.0, g_sum / s_r + _h(b) + d_sum / s_r, u_sum / s_r - lse_gap)


def _reference_start(ref, logits, targets):
    m_r = jnp.max(ref, axis=-1)
    c = _kl_shift(ref, logits)
    g_sum, b_sum, d_sum, s_r, u_sum = _kl_terms(ref, logits, c, m_r)
    return (
        m_r,
        s_r,
        (g_sum, b_sum, d_sum, u_sum),
        c,
        _target_logit(ref, targets, 0, jnp.zeros(targets.shape, jnp.float32)),
        _lowest_argmax(ref),
        _lowest_argmax(logits),
    )


def _reference_update(carry, ref, logits, targets, first, model_max):
    """`model_max`: the model's running maximum before this block."""
    m_r, s_r, sums, c, tl_r, arg_r, arg_m = carry
    m_new = jnp.maximum(m_r, jnp.max(ref, axis=-1))
    scale = jnp.exp(m_r - m_new)
    g_block, b_block, d_block, s_block, u_block = _kl_terms(ref, logits, c, m_new)
    block_sums = (g_block, b_block, d_block, u_block)
    return (
        m_new,
        s_r * scale + s_block,
        tuple(x * scale + y for x, y in zip(sums, block_sums, strict=True)),
        c,
        _target_logit(ref, targets, first, tl_r),
        _argmax_update(arg_r, m_r, ref, first),
        _argmax_update(arg_m, model_max, logits, first),
    )


def _blocked(
    hidden: jax.Array,
    unembedding: jax.Array,
    targets: jax.Array,
    block: int,
    top_k: int = 0,
    reference: HiddenStates | Logits | None = None,
    logit_softcap: float | None = None,
) -> TokenStats:
    v = unembedding.shape[1]
    block = min(block, v)
    num_full, rest = divmod(v, block)
    logits_of = _block_source(HiddenStates(hidden, unembedding, logit_softcap))
    ref_of = None if reference is None else _block_source(reference)

    def target_logit(logits, first, previous):
        return _target_logit(logits, targets, first, previous)

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

    def update_all(carry, first, width):
        base, top, ref = carry
        logits = logits_of(first, width)
        if top is not None:
            top = _top_k_update(top, logits, first, top_k)
        if ref is not None:
            ref = _reference_update(ref, ref_of(first, width), logits, targets, first, base[0])
        return update(base, logits, first), top, ref

    # The first block starts the running sums; full blocks follow in a scan, then the remainder
    # (its own shape), so no block needs a validity mask. With top_k > block, the first block is
    # widened to whole blocks holding at least top_k columns, so the carried top-k is always full.
    first_blocks = 1 if top_k <= block else -(-top_k // block)
    first_width = min(first_blocks * block, v)
    if first_width == v:
        first_blocks, rest = num_full, 0
    logits = logits_of(0, first_width)
    m = jnp.max(logits, axis=-1)
    centred = logits - m[..., None]
    e = jnp.exp(centred)
    base = (
        m,
        jnp.sum(e, axis=-1),
        jnp.sum(e * centred, axis=-1),
        target_logit(logits, 0, jnp.zeros(targets.shape, jnp.float32)),
    )
    top = _top_k_start(logits, top_k) if top_k else None
    ref = None if ref_of is None else _reference_start(ref_of(0, first_width), logits, targets)
    carry = (base, top, ref)
    if num_full > first_blocks:
        carry, _ = jax.lax.scan(
            lambda c, k: (update_all(c, k * block, block), None),
            carry,
            jnp.arange(first_blocks, num_full, dtype=jnp.int32),
        )
    if rest:
        carry = update_all(carry, num_full * block, rest)
    (m, s, t, tl), top, ref = carry
    log_s = jnp.log(s)
    stats = TokenStats(m + log_s - tl, log_s - t / s, tl >= m)
    if top is not None:
        stats = stats._replace(top_ids=top[1], top_logprobs=top[0] - (m + log_s)[..., None])
    if ref is not None:
        m_r, s_r, (g_sum, b_sum, d_sum, u_sum), _, tl_r, arg_r, arg_m = ref
        log_s_r = jnp.log(s_r)
        lse_gap = (m_r - m) + (log_s_r - log_s)
        stats = stats._replace(
            kl=_kl(g_sum, b_sum, d_sum, s_r, u_sum, lse_gap),
            reference_nll=m_r + log_s_r - tl_r,
            same_top1=arg_r == arg_m,
        )
    return stats


def _check(output, targets, top_k, reference) -> None:
    vocab = vocab_size(output)
    integer = isinstance(top_k, int | np.integer) and not isinstance(top_k, bool)
    if not (integer and 0 <= top_k <= min(MAX_TOP_K, vocab)):
        raise ValueError(
            f"top_k={top_k!r} is out of range: give an integer from 0 to "
            f"{min(MAX_TOP_K, vocab)} (at most {MAX_TOP_K} and at most the vocabulary, {vocab})."
        )
    if reference is None:
        return
    if vocab_size(reference) != vocab:
        raise ValueError(
            f"The reference model scores {vocab_size(reference)} token ids but the model "
            f"scores {vocab}: compare models that share one tokenizer and vocabulary."
        )
    if _leading_shape(reference) != tuple(targets.shape):
        raise ValueError(
            f"The reference model's output covers {_leading_shape(reference)} positions but the "
            f"targets are {tuple(targets.shape)}: run both models on the same batch."
        )


def token_stats(
    output: HiddenStates | Logits,
    targets: jax.Array,
    block: int = VOCAB_BLOCK,
    top_k: int = 0,
    reference: HiddenStates | Logits | None = None,
) -> TokenStats:
    """NLL, predictive entropy and top-1 correctness of each target; optionally the top-k ids
    and their log-probabilities, and the divergence from a reference model.

    Args:
      output: the model's `HiddenStates` (scored in vocabulary blocks, memory-bounded) or
        `Logits` (already materialised by the model; log-softmax in float32).
      targets: `[batch, seq] int32` token ids, each in `[0, vocab)`.
      block: vocabulary columns per block.
      top_k: static int in `[0, 20]`, at most the vocabulary size: how many most probable ids
        to return per target (0: none).
      reference: the reference model's output for the same batch (`HiddenStates` or `Logits`,
        any hidden width and dtype, the same vocabulary), or None. With `HiddenStates` output it
        is scanned in the same vocabulary blocks (sliced, if `Logits`); with `Logits` output its
        full logits are formed too.

    Returns:
      `TokenStats`: `nll`, `entropy`, `correct`, each `[batch, seq]`; with `top_k > 0` also
      `top_ids` and `top_logprobs` `[batch, seq, top_k]`; with a reference also `kl`,
      `reference_nll` and `same_top1` `[batch, seq]`; the fields not asked for are None. With
      neither option the three statistics are exactly those computed without the options.

    Raises:
      ValueError: `top_k` out of range, or a reference with another vocabulary size or
        batch and sequence shape.
    """
    _check(output, targets, top_k, reference)
    top_k = int(top_k)
    if isinstance(output, Logits):
        ref_logits = None if reference is None else _full_logits(reference)
        return _from_logits(output.logits, targets, top_k, ref_logits)
    return _blocked(
        output.hidden, output.unembedding, targets, block, top_k, reference, output.logit_softcap
    )


def token_nll(output: HiddenStates | Logits, targets: jax.Array) -> jax.Array:
    """`[batch, seq] float32`: the negative log-likelihood (nats) of each target."""
    return token_stats(output, targets).nll
