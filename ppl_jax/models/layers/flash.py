"""Flash attention in plain JAX: query blocks against key blocks with an online softmax.

The `xla` implementation of `ppl_jax.models.layers.attention.attend` (Dao et al. 2022,
"FlashAttention"; the online softmax of Milakov & Gimelshein 2018). Queries are cut into blocks of
`block_q`, keys and values into blocks of `block_k`; for each query block a `lax.fori_loop` runs
over the key blocks it may see, keeping per query the running maximum `m`, the running denominator
`denom` and the unnormalised output `acc`, all float32 (scores and statistics are float32 whatever
the input dtype; probabilities are cast to the value dtype for the product with the values, as the
former query-blocked path did). Memory is linear in the window: the largest temporaries are one
block pair's `[B, KV, G, block_q, block_k]` scores and the `[B, KV, G, T, Dv]` float32 accumulator,
never a `[T, T]` matrix; the program is the same size whatever `T` (lax loops, not Python-unrolled
block pairs), so a 65,536- or 1,048,576-token window compiles as fast as a short one.

The mask (`ppl_jax.models.layers.attention`), for query `i` and key `j` of the same row:

    visible(i, j) = seg[i] == seg[j] and pos[j] <= pos[i]
                    and (window is None or pos[i] - pos[j] < window)
                    and (chunk is None or pos[i] // chunk == pos[j] // chunk)

**Skipping.** Before the loops, each block is summarised per row by the smallest and largest
`(segment id, position)` pair of its real tokens (segment id > 0), and a key block is *possibly
live* for a query block if, in some row, nothing rules out a visible pair between them
(`key_ranges`); it is computed only if it lies between the query block's first and last
possibly-live key block. The test is conservative (it never drops a visible pair), so the result is exact for
any order of the row's tokens; it is tight when each segment's tokens lie in order and in one
run, as the scorer lays them out (and as the context axis restores keys before attending): then
a query block visits only the key blocks from its window's (or chunk's, or segment's) start to
its own diagonal. Queries of padding (segment 0) see no key and get zeros.

Sinks (GPT-OSS): one logit per query head joins the softmax's denominator and is dropped
(transformers' `eager_attention_forward` for `gpt_oss`), added once after the key loop.

`update` is also the step of the ring over the context axis (`ppl_jax.models.layers.context`): the
state `(m, denom, acc)` is carried from one shard of keys to the next, and `finish` divides once.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

# Block sizes. Measured on a 2-core CPU (GPT-2 small, T=1023; BENCHMARKS.md) and, for GPU, chosen
# as the former query block (512) there.
BLOCK_Q = 128
BLOCK_K = 256
GPU_BLOCK_Q = 512
GPU_BLOCK_K = 512

# A masked score, and `m` before any key: -inf, so that a visible -inf is not taken for masked.
_MASKED = -float("inf")
_BIG = np.iinfo(np.int32).max


class State(NamedTuple):
    """The running softmax of `T` queries, heads grouped as `[B, KV, G, T]`.

    m: float32, the largest score seen (-inf before any).
    denom: float32, `sum exp(s - m)` over the visible keys seen.
    acc: `[B, KV, G, T, Dv]` float32, `sum exp(s - m) v` over them.
    """

    m: jax.Array
    denom: jax.Array
    acc: jax.Array


def block_sizes(t: int, s: int, platform: str | None = None) -> tuple[int, int]:
    """`(block_q, block_k)` for `t` queries against `s` keys on `platform`: the defaults above,
    at most the (8-rounded) lengths themselves."""
    gpu = (platform or jax.default_backend()) == "gpu"
    bq, bk = (GPU_BLOCK_Q, GPU_BLOCK_K) if gpu else (BLOCK_Q, BLOCK_K)
    return min(bq, _round_up(t, 8)), min(bk, _round_up(s, 8))


def _round_up(n: int, m: int) -> int:
    return -(-n // m) * m


def init(b: int, kv: int, g: int, t: int, dv: int) -> State:
    """The state before any key: `m = -inf`, `l = 0`, `acc = 0`."""
    return State(
        jnp.full((b, kv, g, t), _MASKED, jnp.float32),
        jnp.zeros((b, kv, g, t), jnp.float32),
        jnp.zeros((b, kv, g, t, dv), jnp.float32),
    )


def split_heads(q: jax.Array, kv_heads: int, scale: float) -> jax.Array:
    """`[B, T, H, D]` -> `[B, KV, G, T, D]`, times `scale` in `q.dtype` (as the former path)."""
    b, t, h, d = q.shape
    q = q * jnp.asarray(scale, q.dtype)
    return q.reshape(b, t, kv_heads, h // kv_heads, d).transpose(0, 2, 3, 1, 4)


def _summary(seg: jax.Array, pos: jax.Array, block: int) -> tuple[jax.Array, ...]:
    """Per row and block of `[B, n * block]` ids, over the real tokens (segment id > 0): the
    smallest and the largest `(segment id, position)` pair in lexicographic order, as four
    `[B, n]` arrays `(seg_lo, pos_lo, seg_hi, pos_hi)` (an empty block gets
    `(BIG, BIG, -1, -1)`), and whether every token of the block is real."""
    b, t = seg.shape
    seg = seg.reshape(b, t // block, block)
    pos = pos.reshape(b, t // block, block)
    real = seg > 0
    seg_lo = jnp.min(jnp.where(real, seg, _BIG), axis=-1)
    seg_hi = jnp.max(jnp.where(real, seg, -1), axis=-1)
    pos_lo = jnp.min(jnp.where(real & (seg == seg_lo[..., None]), pos, _BIG), axis=-1)
    pos_hi = jnp.max(jnp.where(real & (seg == seg_hi[..., None]), pos, -1), axis=-1)
    return seg_lo, pos_lo, seg_hi, pos_hi, jnp.all(real, axis=-1)


def _before(a_seg, a_pos, b_seg, b_pos) -> jax.Array:
    """`(a_seg, a_pos) < (b_seg, b_pos)` in lexicographic order."""
    return (a_seg < b_seg) | ((a_seg == b_seg) & (a_pos < b_pos))


def key_ranges(
    q_seg, q_pos, k_seg, k_pos, block_q: int, block_k: int, window, chunk
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """`(first, end, full)`: `[T // block_q] int32` each, the key blocks each query block visits,
    from the first to the last possibly-live one, over all rows (`first == end` when none is);
    and `[T // block_q, S // block_k] bool`, the block pairs whose every query sees every key
    in every row (one segment, no padding, all keys before all queries and within the window
    and chunk), which skip the mask.

    A visible pair has equal segments and `pos[j] <= pos[i]`, so in the lexicographic order of
    `(segment, position)` the key is at most the query, and (with a window) after
    `(segment, pos[i] - window)`, and (with chunks) in the query's `(segment, pos // chunk)`. A
    key block is possibly live for a query block if their segment ranges overlap and its
    smallest pair is at most the query block's largest, its largest after the query block's
    smallest minus the window, and its largest chunk pair at least the query block's smallest:
    necessary conditions, exact for the scorer's rows (segments in order, positions
    0, 1, 2, ... in each)."""
    q_lo_s, q_lo_p, q_hi_s, q_hi_p, q_dense = (
        x[:, :, None] for x in _summary(q_seg, q_pos, block_q)
    )
    k_lo_s, k_lo_p, k_hi_s, k_hi_p, k_dense = (
        x[:, None, :] for x in _summary(k_seg, k_pos, block_k)
    )
    live = (q_lo_s <= k_hi_s) & (k_lo_s <= q_hi_s) & ~_before(q_hi_s, q_hi_p, k_lo_s, k_lo_p)
    one = (q_lo_s == q_hi_s) & (q_hi_s == k_lo_s) & (k_lo_s == k_hi_s)
    full = q_dense & k_dense & one & (k_hi_p <= q_lo_p)
    if window is not None:
        live &= _before(q_lo_s, q_lo_p - window, k_hi_s, k_hi_p)
        full &= q_hi_p - k_lo_p < window
    if chunk is not None:
        live &= ~_before(k_hi_s, k_hi_p // chunk, q_lo_s, q_lo_p // chunk)
        full &= k_lo_p // chunk == q_hi_p // chunk
    full = jnp.all(full, axis=0)  # [nq, nk]
    live = jnp.any(live, axis=0)
    nk = live.shape[1]
    any_live = jnp.any(live, axis=1)
    first = jnp.argmax(live, axis=1).astype(jnp.int32)
    end = (nk - jnp.argmax(live[:, ::-1], axis=1)).astype(jnp.int32)
    return jnp.where(any_live, first, 0), jnp.where(any_live, end, 0), full


def visible(q_seg, q_pos, k_seg, k_pos, window, chunk) -> jax.Array:
    """The mask `[B, Tq, Tk]` of `attend` (above; segment 0 sees nothing)."""
    qs, qp = q_seg[:, :, None], q_pos[:, :, None]
    ks, kp = k_seg[:, None, :], k_pos[:, None, :]
    mask = (qs == ks) & (kp <= qp) & (qs > 0)
    if window is not None:
        mask &= qp - kp < window
    if chunk is not None:
        mask &= qp // chunk == kp // chunk
    return mask


def update(
    state: State,
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    q_seg: jax.Array,
    q_pos: jax.Array,
    k_seg: jax.Array,
    k_pos: jax.Array,
    *,
    window: int | None = None,
    chunk: int | None = None,
    softcap: float | None = None,
    block_q: int = BLOCK_Q,
    block_k: int = BLOCK_K,
) -> State:
    """The state after the queries also saw these keys (the ring's step).

    Args:
      state: the queries' `State` so far (`init` for none).
      q: `[B, KV, G, T, Dk]`, already scaled (`split_heads`); k: `[B, S, KV, Dk]`;
        v: `[B, S, KV, Dv]`.
      q_seg, q_pos: `[B, T] int32`; k_seg, k_pos: `[B, S] int32` (segment 0: padding).
      window, chunk, softcap: the mask's window and chunk, the scores' soft-cap (see `attend`).
      block_q, block_k: block sizes; `T` and `S` are padded up to multiples of them.

    Returns:
      The new `State` (`[B, KV, G, T]`, ...).
    """
    t = q.shape[3]
    pad = _round_up(t, block_q) - t
    if pad:
        state = State(
            jnp.pad(state.m, ((0, 0),) * 3 + ((0, pad),), constant_values=_MASKED),
            jnp.pad(state.denom, ((0, 0),) * 3 + ((0, pad),)),
            jnp.pad(state.acc, ((0, 0),) * 3 + ((0, pad), (0, 0))),
        )
    options = dict(window=window, chunk=chunk, softcap=softcap, block_q=block_q, block_k=block_k)
    state = _sweep(q, k, v, q_seg, q_pos, k_seg, k_pos, state, **options)
    return State(state.m[..., :t], state.denom[..., :t], state.acc[..., :t, :]) if pad else state


def _sweep(q, k, v, q_seg, q_pos, k_seg, k_pos, out, *, window, chunk, softcap, block_q,
           block_k, sinks=None):  # fmt: skip
    """The loops over query blocks and their key blocks. `out` is a `State` of the padded
    queries (updated and returned), or the `[B, KV, G, Tp, Dv]` output buffer: then each query
    block starts from `init` and is finished (`sinks` added) as soon as its keys are seen, so no
    float32 state of the whole row is kept."""
    b, kv, g, t, _ = q.shape
    s = k.shape[1]
    tp, sp = _round_up(t, block_q), _round_up(s, block_k)
    if tp != t:
        q = jnp.pad(q, ((0, 0),) * 3 + ((0, tp - t), (0, 0)))
        q_seg = jnp.pad(q_seg, ((0, 0), (0, tp - t)))
        q_pos = jnp.pad(q_pos, ((0, 0), (0, tp - t)))
    if sp != s:
        k = jnp.pad(k, ((0, 0), (0, sp - s), (0, 0), (0, 0)))
        v = jnp.pad(v, ((0, 0), (0, sp - s), (0, 0), (0, 0)))
        k_seg = jnp.pad(k_seg, ((0, 0), (0, sp - s)))
        k_pos = jnp.pad(k_pos, ((0, 0), (0, sp - s)))
    k = k.transpose(0, 2, 1, 3)  # [B, KV, S, Dk]
    v = v.transpose(0, 2, 1, 3)
    first, end, full = key_ranges(q_seg, q_pos, k_seg, k_pos, block_q, block_k, window, chunk)
    carried = isinstance(out, State)

    def query_block(i, out):
        q0 = i * block_q
        qb = jax.lax.dynamic_slice_in_dim(q, q0, block_q, axis=3)
        qs = jax.lax.dynamic_slice_in_dim(q_seg, q0, block_q, axis=1)
        qp = jax.lax.dynamic_slice_in_dim(q_pos, q0, block_q, axis=1)
        if carried:
            carry = tuple(jax.lax.dynamic_slice_in_dim(x, q0, block_q, axis=3) for x in out)
        else:
            carry = tuple(init(b, kv, g, block_q, v.shape[3]))

        def key_block(j, c):
            k0 = j * block_k
            kb = jax.lax.dynamic_slice_in_dim(k, k0, block_k, axis=2)
            vb = jax.lax.dynamic_slice_in_dim(v, k0, block_k, axis=2)
            scores = jnp.einsum("bkgqd,bksd->bkgqs", qb, kb, preferred_element_type=jnp.float32)
            if softcap is not None:
                scores = jnp.tanh(scores / softcap) * softcap

            def masked(scores):
                ks = jax.lax.dynamic_slice_in_dim(k_seg, k0, block_k, axis=1)
                kp = jax.lax.dynamic_slice_in_dim(k_pos, k0, block_k, axis=1)
                mask = visible(qs, qp, ks, kp, window, chunk)[:, None, None]
                return _online(c, jnp.where(mask, scores, _MASKED), mask, vb)

            return jax.lax.cond(full[i, j], lambda s: _online(c, s, None, vb), masked, scores)

        carry = jax.lax.fori_loop(first[i], end[i], key_block, carry)
        if carried:
            return State(*(jax.lax.dynamic_update_slice_in_dim(x, c, q0, axis=3)
                           for x, c in zip(out, carry, strict=True)))  # fmt: skip
        done = _finished(State(*carry), sinks).astype(out.dtype)
        return jax.lax.dynamic_update_slice_in_dim(out, done, q0, axis=3)

    return jax.lax.fori_loop(0, tp // block_q, query_block, out)


def row_max(x: jax.Array) -> jax.Array:
    """`jnp.max(x, axis=-1)`; on CPU a tree of pairwise `maximum`s (see `_pairwise`)."""
    if jax.default_backend() != "cpu":
        return jnp.max(x, axis=-1)
    return _pairwise(x, jnp.maximum, -jnp.inf)


def row_sum(x: jax.Array) -> jax.Array:
    """`jnp.sum(x, axis=-1)`; on CPU a tree of pairwise additions (see `_pairwise`)."""
    if jax.default_backend() != "cpu":
        return jnp.sum(x, axis=-1)
    return _pairwise(x, jnp.add, 0.0)


def _pairwise(x: jax.Array, op, identity: float) -> jax.Array:
    """`op` over the last axis of `x` as a tree of elementwise ops on halves (the last axis padded
    with `identity` to an even width at each level). A reduction inside a loop run by several
    CPU devices of one process makes XLA:CPU's memory grow with every iteration (jax 0.10: 5.5 GB
    for a 65,536-token window on 8 devices, where the compiled step's temporaries are 25 MB per
    device); elementwise ops do not."""
    while x.shape[-1] > 1:
        if x.shape[-1] % 2:
            pad = jnp.full(x.shape[:-1] + (1,), identity, x.dtype)
            x = jnp.concatenate([x, pad], axis=-1)
        half = x.shape[-1] // 2
        x = op(x[..., :half], x[..., half:])
    return x[..., 0]


def _online(carry, scores, mask, v):
    """One key block's update of the running softmax: `scores` `[B, KV, G, bq, bk]` float32
    (masked ones at -inf), `mask` their visibility (None: every pair visible).

    A NaN score makes `m`, `p`, `denom` and `acc` NaN; visible scores all -inf give NaN (a
    softmax of 0 / 0). Only a query that has seen no visible key keeps `denom = 0` (masked `p`
    are 0, `correction` 1 while `m` is -inf), which `finish` turns into 0."""
    m, denom, acc = carry
    m_new = jnp.maximum(m, row_max(scores))
    p = jnp.exp(scores - m_new[..., None])
    if mask is not None:
        p = jnp.where(mask, p, 0.0)
    correction = jnp.where(m == m_new, 1.0, jnp.exp(m - m_new))
    pv = jnp.einsum("bkgqs,bksd->bkgqd", p.astype(v.dtype), v, preferred_element_type=jnp.float32)
    return m_new, denom * correction + row_sum(p), acc * correction[..., None] + pv


def finish(state: State, sinks: jax.Array | None, dtype) -> jax.Array:
    """`[B, T, H, Dv]` in `dtype`: `acc / denom`, with each head's sink logit (`[H]`, or None) added
    to the denominator; 0 for a query that saw no key and has no sink."""
    b, kv, g, t, dv = state.acc.shape
    out = _finished(state, sinks).astype(dtype)
    return out.transpose(0, 3, 1, 2, 4).reshape(b, t, kv * g, dv)


def _finished(state: State, sinks: jax.Array | None) -> jax.Array:
    """`[B, KV, G, T, Dv]` float32: `acc / denom` with the sinks (see `finish`)."""
    m, denom, acc = state
    kv, g = acc.shape[1:3]
    if sinks is not None:
        sink = sinks.astype(jnp.float32).reshape(1, kv, g, 1)
        m_new = jnp.maximum(m, sink)
        correction = jnp.exp(m - m_new)
        denom = denom * correction + jnp.exp(sink - m_new)
        acc = acc * correction[..., None]
    # `denom` is 0 exactly for a query that saw no key (a visible key adds `exp(s - m)`, 1 for
    # the largest); a NaN there (a NaN score) must come out NaN, for the scorer's guard.
    unseen = denom == 0
    return jnp.where(unseen[..., None], 0.0, acc / jnp.where(unseen, 1.0, denom)[..., None])


def flash_attention(
    q, k, v, q_seg, q_pos, k_seg, k_pos, *, window, chunk, sinks, scale, softcap, blocks=None
) -> jax.Array:
    """Queries `[B, T, H, Dk]` against keys `[B, S, KV, Dk]` and values `[B, S, KV, Dv]` with
    their own segment ids and positions: `[B, T, H, Dv]` in `q.dtype` (see `update`, `finish`),
    each query block finished as soon as it has seen its keys."""
    b, t, h, _ = q.shape
    kv, dv = k.shape[2], v.shape[3]
    block_q, block_k = blocks or block_sizes(t, k.shape[1])
    out = jnp.zeros((b, kv, h // kv, _round_up(t, block_q), dv), q.dtype)
    out = _sweep(
        split_heads(q, kv, scale),
        k,
        v,
        q_seg,
        q_pos,
        k_seg,
        k_pos,
        out,
        window=window,
        chunk=chunk,
        softcap=softcap,
        block_q=block_q,
        block_k=block_k,
        sinks=sinks,
    )
    return out[:, :, :, :t].transpose(0, 3, 1, 2, 4).reshape(b, t, h, dv)


def attention_lse(
    q, k, v, q_seg, q_pos, k_seg, k_pos, *, window, chunk, scale, softcap, blocks=None
) -> tuple[jax.Array, jax.Array]:
    """`flash_attention` without sinks that also gives each query's log-sum-exp: `(out [B, T, H,
    Dv] float32, lse [B, T, H] float32)`, `lse = log sum_j exp(s_ij)` over the visible keys
    (`-inf`, and `out` 0, for a query that sees none): what partial results over disjoint sets of
    keys merge by (`ppl_jax.models.layers.split_merge.merge`)."""
    b, t, h, _ = q.shape
    kv, dv = k.shape[2], v.shape[3]
    block_q, block_k = blocks or block_sizes(t, k.shape[1])
    state = update(
        init(b, kv, h // kv, t, dv),
        split_heads(q, kv, scale),
        k,
        v,
        q_seg,
        q_pos,
        k_seg,
        k_pos,
        window=window,
        chunk=chunk,
        softcap=softcap,
        block_q=block_q,
        block_k=block_k,
    )
    out = finish(state, None, jnp.float32)
    unseen = state.denom == 0  # NaN stays NaN (see `_finished`)
    lse = jnp.where(unseen, -jnp.inf, state.m + jnp.log(jnp.where(unseen, 1.0, state.denom)))
    return out, lse.transpose(0, 3, 1, 2).reshape(b, t, h)
