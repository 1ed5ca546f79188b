"""Splash attention's cases beyond one causal call (`ppl_jax.models.layers.fused.splash`):
chunked attention, and the ring over the context axis by its partials.

**Chunked attention** (Llama 4: query `i` sees the keys of its chunk `pos // C`, up to itself) by
segment ids: each run of tokens of one segment and one attention chunk along the row takes its
own id (`chunk_ids`), and the causal (or local) mask by index within equal ids is then the mask
by positions, for rows whose segments are runs of consecutive positions (the scorer's rows:
positions `0, 1, 2, ...` in each segment, as every splash call assumes). Packed rows, windows and
the context axis included, one kernel call as without chunks. (The kernel's own
`ChunkedCausalMask` chunks by index in the row, which is not the position within a segment for a
packed row's later documents.)

**The ring** (`model.context_attention=ring`): the keys, values and their segment ids go round
the `N` devices in `N` steps (`ppermute`), as in the flash kernel's ring
(`ppl_jax.models.layers.attention`). Each device holds two chunks of the row's `2N` (`c_r` and
`c_{2N-1-r}`, the load-balanced order) of queries and, at step `s`, the keys of device
`(r - s) mod N`. A chunk of queries `c_a` against a chunk of keys `c_b` is one splash call with
the offset `(a - b) L` in its causal or local mask (the diagonal block at 0; every key of an
earlier chunk visible; a window's band where it reaches back), nothing for `b > a`; each call
returns its output and log-sum-exp (`fused.splash(lse=True)`), merged as in
`ppl_jax.models.layers.split_merge.merge`, the sinks added once after the last step
(`split_merge.with_sinks`); soft-caps per call (they act on each score). Packed rows are kept
apart by the segment ids, so every row takes the ring, with windows and chunks.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from ppl_jax.models.layers import context as context_lib
from ppl_jax.models.layers import fused, split_merge


def chunk_ids(segment_ids: jax.Array, positions: jax.Array, chunk: int | None) -> jax.Array:
    """`[B, T] int32`: the segment ids of `[B, T]` rows for chunked attention of `chunk` (see the
    module docstring): `1, 2, ...` for each run of real tokens of one segment and one chunk
    `pos // chunk` along the row, 0 where `segment_ids` is 0 (padding); `segment_ids` unchanged
    for `chunk` None."""
    if chunk is None:
        return segment_ids
    part = positions // chunk
    starts = (segment_ids[:, 1:] != segment_ids[:, :-1]) | (part[:, 1:] != part[:, :-1])
    first = jnp.ones_like(starts[:, :1])
    ids = jnp.cumsum(jnp.concatenate([first, starts], axis=1), axis=1, dtype=jnp.int32)
    return jnp.where(segment_ids > 0, ids, 0)


def _local(row: jax.Array, n: int) -> jax.Array:
    """Inside `shard_map` over `context`: this device's two chunks (`c_r`, `c_{2N-1-r}`) of a
    gathered `[B, T]` row."""
    r = jax.lax.axis_index(context_lib.AXIS)
    half = row.shape[1] // (2 * n)
    return jnp.concatenate(
        [jax.lax.dynamic_slice_in_dim(row, c * half, half, axis=1) for c in (r, 2 * n - 1 - r)],
        axis=1,
    )


def one_device(q, k, v, seg, pos, mask) -> jax.Array:
    """`Kernel.one_device` of splash: one call, chunks by `chunk_ids`."""
    ids = chunk_ids(seg, pos, mask["chunk"])
    options = {key: x for key, x in mask.items() if key != "chunk"}
    return fused.splash(q, k, v, ids, ids, **options)


def gathered(n, q, k_row, v_row, seg, pos, seg_row, pos_row, mask) -> jax.Array:
    """`Kernel.gathered` of splash: each of the device's two chunks of queries against the
    gathered row with the chunk's offset in the causal mask; chunks by `chunk_ids` of the row."""
    half = q.shape[1] // 2
    r = jax.lax.axis_index(context_lib.AXIS)
    row_ids = chunk_ids(seg_row, pos_row, mask["chunk"])
    q_ids = seg if mask["chunk"] is None else _local(row_ids, n)
    options = {key: x for key, x in mask.items() if key != "chunk"}
    outs = [
        fused.splash(
            q[:, i * half : (i + 1) * half],
            k_row,
            v_row,
            q_ids[:, i * half : (i + 1) * half],
            row_ids,
            offset=c * half,
            **options,
        )
        for i, c in enumerate((r, 2 * n - 1 - r))
    ]
    return jnp.concatenate(outs, axis=1)


def ring(n, q, k, v, seg, pos, mask, flash_ring=None) -> jax.Array:
    """`Kernel.ring` of splash (see the module docstring): inside `shard_map` over `context`,
    this device's queries `q [B, 2L, H, D]` against every device's keys `[B, 2L, KV, D]` and
    values `[B, 2L, KV, Dv]`; `[B, 2L, H, Dv]` in `q.dtype`. Every row and mask takes it
    (`flash_ring`, the flash kernel's ring, is not needed)."""
    del flash_ring
    axis = context_lib.AXIS
    r = jax.lax.axis_index(axis)
    half = q.shape[1] // 2
    dv = v.shape[3]
    if mask["chunk"] is None:
        ids = seg
    else:  # the runs need the whole row's segment ids and positions (int32, gathered)
        rows = (context_lib.gather_rows(x, n) for x in (seg, pos))
        ids = _local(chunk_ids(*rows, mask["chunk"]), n)
    window = mask["window"]
    options = dict(window=window, sinks=None, scale=mask["scale"], softcap=mask["softcap"])
    # Offsets (in chunks) the masks tell apart: without a window every earlier chunk is all
    # visible (offset 1 and beyond: one kernel).
    offsets = 2 * n if window is not None else 2
    perm = [(i, (i + 1) % n) for i in range(n)]

    def chunks(device):
        return (device, 2 * n - 1 - device)

    def block(q_a, ids_a, i_a, k_b, v_b, ids_b, i_b):
        rel = jnp.minimum(i_a - i_b, offsets - 1)

        def some():
            return fused.splash(
                q_a, k_b, v_b, ids_a, ids_b, offset=rel * half, offsets=offsets, lse=True,
                **options,
            )  # fmt: skip

        return jax.lax.cond(rel >= 0, some, lambda: split_merge.no_keys(q_a, dv))

    def see(s, state, keys):
        k_s, v_s, ids_s = keys
        held = chunks((r - s) % n)
        merged = []
        for a, i_a in enumerate(chunks(r)):
            mine = slice(a * half, (a + 1) * half)
            acc = tuple(x[:, mine] for x in state)
            for b, i_b in enumerate(held):
                part = slice(b * half, (b + 1) * half)
                found = block(q[:, mine], ids[:, mine], i_a, k_s[:, part], v_s[:, part],
                              ids_s[:, part], i_b)  # fmt: skip
                acc = split_merge.merge(acc, found)
            merged.append(acc)
        return tuple(jnp.concatenate(parts, axis=1) for parts in zip(*merged, strict=True))

    def step(s, carry):
        state, keys = carry
        return see(s, state, keys), jax.lax.ppermute(keys, axis, perm)

    state = split_merge.no_keys(q, dv)
    state, keys = jax.lax.fori_loop(0, n - 1, step, (state, (k, v, ids)))
    out, lse = see(n - 1, state, keys)
    return split_merge.with_sinks(out, lse, mask["sinks"])[0].astype(q.dtype)
