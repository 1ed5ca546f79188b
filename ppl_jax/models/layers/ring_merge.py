"""The ring over the context axis (`model.context_attention=ring`) with a kernel's partial
attention (`ppl_jax.models.layers.split_merge.Partial`: cuDNN on the GPU, the flash kernel's in
the CPU tests): the keys and values go round the `N` devices in `N` steps, as in the flash
kernel's ring (`ppl_jax.models.layers.attention`), and each step's blocks are partial results
merged by log-sum-exp.

Each device holds two chunks of the row's `2N` (`c_r` and `c_{2N-1-r}`, the load-balanced
order) of queries, and at step `s` the keys of device `(r - s) mod N`. A chunk of queries
against a chunk of keys is nothing (the keys after the queries), the diagonal block (the same
chunk: causal) or a whole prefix block (earlier keys: all visible), chosen at run time
(`lax.switch`: the indices depend on the device). The sinks are added once, after the last
step (`split_merge.with_sinks`).

A sliding window makes the kind a function of the chunks' distance (`kinds`): an earlier chunk
wholly inside the window is a prefix block, one wholly outside it nothing, and one the window
reaches into a band (a lower bound on the keys, none above), which cuDNN's masks cannot take as
such: it is one causal call with a window, the queries placed after the keys (`band`); the
diagonal is causal with the window. Chunked attention (Llama 4) where the attention chunk holds
whole chunks of the ring: an earlier chunk in the queries' attention chunk is a prefix block,
else nothing; where the ring's chunks hold whole attention chunks: nothing off the diagonal,
and the diagonal reshaped into its attention chunks (`split_merge.chunked_partial`).

For rows of one document from the row's start (positions equal to the row's index, padding
only at the end), checked across the devices; other rows, layers with chunks and a window, and
chunks that neither hold nor divide the ring's (`split_merge.chunks_fit`), take the flash
kernel's ring.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from ppl_jax.models.layers import context as context_lib
from ppl_jax.models.layers import split_merge


def one_document(n: int, seg: jax.Array, pos: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Inside `shard_map` over `context`: `(ok, real)`, whether every row holds one document from
    its first token (positions `0, 1, ...` at the row's index, then padding), the same on every
    device; and each row's real tokens `[B] int32` (`split_merge.one_document` of the row, from
    the device's two chunks `[B, 2L]`)."""
    axis = context_lib.AXIS
    r = jax.lax.axis_index(axis)
    half = seg.shape[1] // 2
    offset = jnp.arange(half, dtype=jnp.int32)
    index = jnp.concatenate([r * half + offset, (2 * n - 1 - r) * half + offset])[None]
    real_token = seg > 0
    real = jax.lax.psum(jnp.sum(real_token, axis=1, dtype=jnp.int32), axis)
    big = jnp.iinfo(jnp.int32).max
    lowest = jax.lax.pmin(jnp.min(jnp.where(real_token, seg, big), axis=1), axis)
    highest = jax.lax.pmax(jnp.max(jnp.where(real_token, seg, -1), axis=1), axis)
    placed = ~real_token | ((pos == index) & (index < real[:, None]))
    ok = jnp.all(placed) & jnp.all((lowest == highest) | (real == 0))
    return jax.lax.pmin(ok.astype(jnp.int32), axis) > 0, real


# The blocks' kinds, as `lax.switch` branches: the bands (earlier keys, partly in a sliding
# window) follow, one per difference of chunk indices that gives one.
NONE, DIAGONAL, WHOLE = 0, 1, 2


def kinds(n: int, length: int, window: int | None) -> tuple[list[int], list[int]]:
    """Static: for chunks of `length` tokens (`2n` in a row), `(bands, branch)`: `branch[delta +
    2n - 1]` the kind of the block of query chunk `i_a` against key chunk `i_b = i_a - delta`
    (`NONE`, `DIAGONAL`, `WHOLE`, or `3 + k`: the band of window `bands[k]`, see `band`). With a
    sliding `window` (query `p` sees key `k` iff `p - window < k <= p`), an earlier chunk
    `d = delta * length` tokens back is all visible where `d + length - 1 < window`, invisible
    where `d - (length - 1) >= window`, else a band."""
    bands, branch = [], []
    for delta in range(-(2 * n - 1), 2 * n):
        d = delta * length
        if delta <= 0:
            branch.append(DIAGONAL if delta == 0 else NONE)
        elif window is None or d + length - 1 < window:
            branch.append(WHOLE)
        elif d - (length - 1) >= window:
            branch.append(NONE)
        else:
            bands.append(window - d + length - 1)
            branch.append(2 + len(bands))
    return bands, branch


def band(q, k, v, q_len, kv_len, width: int, *, scale: float, partial) -> tuple:
    """Queries `q [B, L, H, D]` against an earlier chunk of keys `[B, L, KV, D]` (values
    `[B, L, KV, Dv]`) `d` tokens back under a sliding window `W` that reaches part of it: local
    query `i` sees local key `j` iff `d + i - j < W`, a lower bound on `j` and none above. One
    causal call (`split_merge.placed`): the queries at rows `L - 1 .. 2L - 2` of a block of
    `2L - 1` against the keys at rows `0 .. L - 1` (padding after, masked by `kv_len [B]`), so
    causality holds for every key, and the window `width = W - d + L - 1` (`kinds`), the
    positions' window in the block's rows. The queries from `width` on see no key (`W < d + L
    - 1 - i`: a band narrower than the chunk): they are left out as padding, never a row whose
    every key is masked (cuDNN does not say what it gives those). `(out [B, L, H, Dv], lse
    [B, L, H])` float32; the queries past `q_len [B]` or `width` get 0 and `-inf`. (Queries and
    keys reversed, the band is causal from an offset, a block of fewer rows but flipped inputs,
    outputs and padding.)"""
    length = q.shape[1]

    def pad(x):
        return jnp.pad(x, ((0, 0), (0, length - 1), (0, 0), (0, 0)))

    rows = length - 1 + jnp.minimum(q_len, width)
    options = dict(window=width, scale=scale, partial=partial)
    return split_merge.placed(q, pad(k), pad(v), length - 1, rows, kv_len, **options)


def ring(
    n: int, q, k, v, real, *, scale: float, partial, sinks=None, window=None, chunk=None
) -> jax.Array:
    """Inside `shard_map` over `context`: this device's queries `q [B, 2L, H, D]` against every
    device's keys `[B, 2L, KV, D]` and values `[B, 2L, KV, Dv]`, passed round the ring (`n - 1`
    `ppermute`s), for rows of one document of `real [B]` tokens; `[B, 2L, H, Dv]` in `q.dtype`,
    the sinks `[H]` (or None) added once at the end. A sliding `window` (or None): the blocks of
    `kinds`; chunked attention of `chunk` tokens (or None; not with a window), where
    `split_merge.chunks_fit(L, chunk)`: a chunk of keys in the queries' attention chunk all
    visible (`chunk` a multiple of `L`), or the diagonal block's attention chunks
    (`split_merge.chunked_partial`; `L` a multiple of `chunk`).

    Raises:
      ValueError: chunks with a window, or chunks that do not fit `L`."""
    half = q.shape[1] // 2
    if chunk is not None and (window is not None or not split_merge.chunks_fit(half, chunk)):
        raise ValueError(
            f"ring: chunked attention of {chunk} with a window ({window}), or chunks that do not "
            f"fit the ring's chunks of {half} (`split_merge.chunks_fit`): the flash kernel's ring"
        )
    axis = context_lib.AXIS
    r = jax.lax.axis_index(axis)
    partial = split_merge.equal_widths(partial)
    dv = v.shape[3]
    perm = [(i, (i + 1) % n) for i in range(n)]
    bands, branch = kinds(n, half, window)
    branch = jnp.asarray(branch, jnp.int32)
    diagonal_window = window if window is not None and window < half else None
    pieces = chunk is not None and half % chunk == 0  # the diagonal holds whole attention chunks

    def chunks(device):
        return (device, 2 * n - 1 - device)

    def length(index):
        return jnp.clip(real - index * half, 0, half).astype(jnp.int32)

    def block(q_a, i_a, k_b, v_b, i_b):
        q_len, kv_len = length(i_a), length(i_b)
        options = dict(scale=scale, partial=partial)

        def diagonal():
            if pieces:
                return split_merge.chunked_partial(q_a, k_b, v_b, q_len, chunk, **options)
            return partial(
                q_a, k_b, v_b, q_len, q_len, causal=True, scale=scale, window=diagonal_window
            )

        branches = [
            lambda: split_merge.no_keys(q_a, dv),
            diagonal,
            lambda: partial(q_a, k_b, v_b, q_len, kv_len, causal=False, scale=scale),
            *(
                functools.partial(band, q_a, k_b, v_b, q_len, kv_len, width, **options)
                for width in bands
            ),
        ]
        kind = branch[i_a - i_b + 2 * n - 1]
        if chunk is not None:  # earlier keys: in the queries' attention chunk or unseen
            same = (i_a * half) // chunk == (i_b * half) // chunk
            kind = jnp.where((kind == WHOLE) & ~same, NONE, kind)
        return jax.lax.switch(kind, branches)

    def see(s, state, keys):
        k_s, v_s = keys
        held = chunks((r - s) % n)
        merged = []
        for a, i_a in enumerate(chunks(r)):
            q_a = q[:, a * half : (a + 1) * half]
            acc = tuple(x[:, a * half : (a + 1) * half] for x in state)
            for b, i_b in enumerate(held):
                part = slice(b * half, (b + 1) * half)
                acc = split_merge.merge(acc, block(q_a, i_a, k_s[:, part], v_s[:, part], i_b))
            merged.append(acc)
        return tuple(jnp.concatenate(parts, axis=1) for parts in zip(*merged, strict=True))

    def step(s, carry):
        state, keys = carry
        return see(s, state, keys), jax.lax.ppermute(keys, axis, perm)

    state = split_merge.no_keys(q, dv)
    state, keys = jax.lax.fori_loop(0, n - 1, step, (state, (k, v)))
    out, lse = see(n - 1, state, keys)
    return split_merge.with_sinks(out, lse, sinks)[0].astype(q.dtype)
