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

For rows of one document from the row's start (positions equal to the row's index, padding
only at the end), checked across the devices; other rows, and layers with a window or chunks,
take the flash kernel's ring.
"""

from __future__ import annotations

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


def ring(n: int, q, k, v, real, *, scale: float, partial, sinks=None) -> jax.Array:
    """Inside `shard_map` over `context`: this device's queries `q [B, 2L, H, D]` against every
    device's keys `[B, 2L, KV, D]` and values `[B, 2L, KV, Dv]`, passed round the ring (`n - 1`
    `ppermute`s), for rows of one document of `real [B]` tokens; `[B, 2L, H, Dv]` in `q.dtype`,
    the sinks `[H]` (or None) added once at the end."""
    axis = context_lib.AXIS
    r = jax.lax.axis_index(axis)
    half = q.shape[1] // 2
    partial = split_merge.equal_widths(partial)
    dv = v.shape[3]
    perm = [(i, (i + 1) % n) for i in range(n)]

    def chunks(device):
        return (device, 2 * n - 1 - device)

    def length(index):
        return jnp.clip(real - index * half, 0, half).astype(jnp.int32)

    def block(q_a, i_a, k_b, v_b, i_b):
        q_len, kv_len = length(i_a), length(i_b)
        branches = [
            lambda: split_merge.no_keys(q_a, dv),  # keys after the queries
            lambda: partial(q_a, k_b, v_b, q_len, q_len, causal=True, scale=scale),
            lambda: partial(q_a, k_b, v_b, q_len, kv_len, causal=False, scale=scale),
        ]
        return jax.lax.switch(jnp.where(i_b < i_a, 2, jnp.where(i_b == i_a, 1, 0)), branches)

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
