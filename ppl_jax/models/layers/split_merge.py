"""Attention split into blocks of keys and merged by log-sum-exp: how cuDNN attends across the
context axis and a long window's chunks of queries.

cuDNN's causal mask is top-left (query `i` sees keys `j <= i` of the same call) and JAX passes it
no query offset, so queries that sit after the first token of the keys (a device's chunk of a
window split over `mesh.context`; a chunk of a long window's queries) cannot be one causal call.
They are two (TransformerEngine's context parallelism attends the same way,
`transformer_engine/jax/cpp_extensions/attention.py`): the **diagonal block**, the queries
against the keys of their own tokens, causal (equal lengths: top-left is right), and the
**prefix**, the queries against every key before their first token, with no mask; each call
returns its output and each query's log-sum-exp (`return_residual`), and `merge` combines them:

    lse = logaddexp(lse_d, lse_p);  out = out_d exp(lse_d - lse) + out_p exp(lse_p - lse)

which is attention over the union of the keys (Milakov & Gimelshein 2018; FlashAttention-2's
`lse`). The first chunk of a row has no prefix.

This holds for rows whose real tokens are one document from the row's start (`one_document`:
positions equal to the index, padding only at the end), where cuDNN's masks by index and
per-row lengths are the mask by positions; rows packed with several documents run the flash
attention of `ppl_jax.models.layers.flash` instead, chosen at run time (`jax.lax.cond`).

Around the partials, what cuDNN cannot do itself: learned sinks, added once to each query's
merged result (`with_sinks`); values of another width than the keys, padded (`equal_widths`);
a sliding window on a chunk of queries, one causal call with the window, the queries placed
after their keys (cuDNN windows causal calls only, and a prefix would need a band: `placed`,
`windowed_chunk`); chunked attention, the row reshaped into its chunks on one device
(`chunked_rows`), and on a chunk of queries the prefix from the attention chunk's first key,
or the chunk's own keys reshaped (`chunked_chunk`, where `chunks_fit`; elsewhere, and chunks
with a window, the flash kernel). The ring over the context axis takes the same partials block
by block (`ppl_jax.models.layers.ring_merge`). The partial attention is a function
(`PARTIALS`): `cudnn` on the GPU, and `xla`, the flash kernel computing the same thing, which
stands in for cuDNN in the CPU tests (the split and the merge are tested against the whole row).
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp

from ppl_jax.models.layers import context as context_lib
from ppl_jax.models.layers import flash

# (q [B, L, H, D], k [B, S, KV, D], v [B, S, KV, Dv], q_len [B], kv_len [B], causal, scale,
# window=None) -> (out [B, L, H, Dv] float32, lse [B, L, H] float32): the first `q_len` queries
# of each row against its first `kv_len` keys, causal top-left (`L == S`; with a `window`, keys
# `i - window < j <= i` only) or all visible; queries past `q_len` get 0 and `-inf`.
Partial = Callable[..., tuple[jax.Array, jax.Array]]


def merge(a: tuple[jax.Array, jax.Array], b: tuple[jax.Array, jax.Array]) -> tuple:
    """`(out, lse)` over the keys of two partial results `(out [B, L, H, Dv], lse [B, L, H])`
    (see the module docstring); a query that saw no key in either gets 0 and `-inf`. NaN (or
    `+inf`) in either `lse` gives NaN, never a weight of 0: only `-inf` means no key."""
    (out_a, lse_a), (out_b, lse_b) = a, b
    lse = jnp.logaddexp(lse_a, lse_b)
    base = jnp.where(lse == -jnp.inf, 0.0, lse)

    def weight(x):
        return jnp.where(x == -jnp.inf, 0.0, jnp.exp(x - base))[..., None]

    return out_a * weight(lse_a) + out_b * weight(lse_b), lse


def with_sinks(out: jax.Array, lse: jax.Array, sinks: jax.Array | None) -> tuple:
    """The sink epilogue: `(out [B, L, H, Dv], lse [B, L, H])` over all of a query's keys (every
    partial result merged), with each head's sink logit `sinks [H]` (GPT-OSS; value 0) joining
    the softmax's denominator: `out * sigmoid(lse - s_h)` and `logaddexp(lse, s_h)`. Exact, and
    applied once per query, never per partial (the sink is one term of the whole denominator);
    a query that saw no key gets 0 and `s_h`, as the flash kernel's `finish`. None: unchanged."""
    if sinks is None:
        return out, lse
    s = sinks.astype(jnp.float32)
    return out * jax.nn.sigmoid(lse - s)[..., None], jnp.logaddexp(lse, s)


def equal_widths(partial: Partial) -> Partial:
    """`partial` for values of another width than the keys (DeepSeek's MLA), for a kernel that
    takes one head width (cuDNN): queries, keys and values padded with zeros to the wider of the
    two (zeros add nothing to a score, and give zero output columns), the output sliced back to
    the values' width. Equal widths pass through."""

    def run(q, k, v, q_len, kv_len, *, causal: bool, scale: float, **window):
        dk, dv = k.shape[3], v.shape[3]
        options = dict(causal=causal, scale=scale, **window)
        if dk == dv:
            return partial(q, k, v, q_len, kv_len, **options)
        width = max(dk, dv)

        def pad(x):
            return jnp.pad(x, ((0, 0),) * 3 + ((0, width - x.shape[3]),))

        out, lse = partial(pad(q), pad(k), pad(v), q_len, kv_len, **options)
        return out[..., :dv], lse

    return run


def _real(length: jax.Array, n: int) -> jax.Array:
    return jnp.arange(n, dtype=jnp.int32)[None] < length[:, None]


def xla_partial(q, k, v, q_len, kv_len, *, causal: bool, scale: float, window=None):
    """The partial attention by the flash kernel (`flash.attention_lse`), by positions: the
    keys at `0 .. S-1`, the queries at `0 .. L-1` (causal) or after every key."""
    b, length = q.shape[:2]
    s = k.shape[1]
    q_pos = jnp.broadcast_to(
        jnp.arange(length, dtype=jnp.int32) + (0 if causal else s), (b, length)
    )
    k_pos = jnp.broadcast_to(jnp.arange(s, dtype=jnp.int32), (b, s))
    q_seg = _real(q_len, length).astype(jnp.int32)
    k_seg = _real(kv_len, s).astype(jnp.int32)
    return flash.attention_lse(
        q, k, v, q_seg, q_pos, k_seg, k_pos, window=window, chunk=None, scale=scale, softcap=None
    )


def cudnn_partial(q, k, v, q_len, kv_len, *, causal: bool, scale: float, window=None):
    """The partial attention by cuDNN (JAX's private entry, whose softmax statistics come back
    in float32: the public `jax.nn.dot_product_attention` rounds them to the inputs' dtype, too
    coarse to merge by): per-row lengths, `PADDING_CAUSAL` or `PADDING`."""
    from jax._src.cudnn import fused_attention_stablehlo as cudnn_lib

    mask = cudnn_lib.MaskType.PADDING_CAUSAL if causal else cudnn_lib.MaskType.PADDING
    out, stats = cudnn_lib.dot_product_attention(
        q, k, v, q_seqlen=q_len, kv_seqlen=kv_len, scale=scale, mask_type=mask,
        sliding_window_length=window, return_residual=True,
    )  # fmt: skip
    real = (_real(q_len, q.shape[1]) & (kv_len > 0)[:, None])[..., None]
    lse = jnp.where(real, stats.astype(jnp.float32).transpose(0, 2, 1), -jnp.inf)
    return jnp.where(real[..., None], out.astype(jnp.float32), 0.0), lse


PARTIALS: dict[str, Partial] = {"xla": xla_partial, "cudnn": cudnn_partial}


def one_document(segment_ids: jax.Array, positions: jax.Array) -> tuple[jax.Array, jax.Array]:
    """`(ok, real)`: whether every row `[B, T]` (in row order) holds one document from its first
    token, positions `0, 1, 2, ...`, then only padding (a scalar bool); and each row's number of
    real tokens `[B] int32`."""
    real = segment_ids > 0
    index = jnp.arange(segment_ids.shape[1], dtype=positions.dtype)[None]
    ok = (
        jnp.all(~real[:, 1:] | real[:, :-1])  # padding only at the end
        & jnp.all(~real | (segment_ids == segment_ids[:, :1]))  # one document
        & jnp.all(~real | (positions == index))
    )
    return ok, jnp.sum(real, axis=1, dtype=jnp.int32)


def no_keys(q: jax.Array, dv: int) -> tuple[jax.Array, jax.Array]:
    """The partial result of queries `q [B, L, H, D]` that saw no key: 0 and `-inf`."""
    b, length, h = q.shape[:3]
    return jnp.zeros((b, length, h, dv), jnp.float32), jnp.full((b, length, h), -jnp.inf)


def chunk_of_row(
    q,
    k_row,
    v_row,
    start,
    real,
    *,
    scale,
    partial: Partial,
    prefix=None,
    sinks=None,
    window=None,
    chunk=None,
) -> jax.Array:
    """The queries `q [B, L, H, D]` of the row's tokens `start .. start + L - 1` against the
    row's keys `[B, T, KV, D]` and values `[B, T, KV, Dv]` (one document of `real [B]` tokens
    from the start): the diagonal block and the prefix, merged, then the sinks `[H]` (or None)
    added (`with_sinks`); `[B, L, H, Dv]` float32. `start` may be traced; `prefix`, a function of the diagonal's inputs giving the prefix's result, replaces
    the one call over the whole row with the first `start` keys real (the context axis passes
    static prefixes). Values of another width than the keys: `equal_widths`. With a sliding
    `window`: `windowed_chunk` (no prefix); with chunked attention: `chunked_chunk`."""
    partial = equal_widths(partial)
    if chunk is not None:
        return chunked_chunk(
            q, k_row, v_row, start, real, chunk, scale=scale, partial=partial, sinks=sinks
        )
    if window is not None:
        return windowed_chunk(
            q, k_row, v_row, start, real, window, scale=scale, partial=partial, sinks=sinks
        )
    length = q.shape[1]
    q_len = jnp.clip(real - start, 0, length)
    k = jax.lax.dynamic_slice_in_dim(k_row, start, length, axis=1)
    v = jax.lax.dynamic_slice_in_dim(v_row, start, length, axis=1)
    diagonal = partial(q, k, v, q_len, q_len, causal=True, scale=scale)
    if prefix is not None:
        before = prefix(q_len)
    else:
        kv_len = jnp.minimum(real, start).astype(jnp.int32)
        before = partial(q, k_row, v_row, q_len, kv_len, causal=False, scale=scale)
    return with_sinks(*merge(diagonal, before), sinks)[0]


def chunks_fit(length: int, chunk: int) -> bool:
    """Whether a chunk of `length` queries starting at a multiple of `length` takes chunked
    attention of `chunk` by cuDNN's partials (`chunked_chunk`): the queries lie in one
    attention chunk (`chunk` a multiple of `length`) or hold whole ones (the converse)."""
    return chunk % length == 0 or length % chunk == 0


def chunked_chunk(q, k_row, v_row, start, real, chunk: int, *, scale, partial, sinks=None):
    """`chunk_of_row` with chunked attention (Llama 4), its `L` queries starting at a multiple of
    `L` (`chunks_fit`): within one attention chunk, the diagonal block and the prefix from the
    chunk's first key (`P = chunk - L` keys from `chunk * (start // chunk)`, those before
    `start` real); holding whole chunks, its own keys reshaped into them (`chunked_rows`).
    `[B, L, H, Dv]` float32, the sinks (or None) added once."""
    length = q.shape[1]
    q_len = jnp.clip(real - start, 0, length).astype(jnp.int32)

    def own(x):
        return jax.lax.dynamic_slice_in_dim(x, start, length, axis=1)

    if length % chunk == 0:
        options = dict(scale=scale, partial=partial, sinks=sinks)
        return chunked_rows(q, own(k_row), own(v_row), q_len, chunk, **options)
    diagonal = partial(q, own(k_row), own(v_row), q_len, q_len, causal=True, scale=scale)
    width = chunk - length
    first = (start // chunk) * chunk

    def keys(x):
        x = jnp.pad(x, ((0, 0), (0, width)) + ((0, 0),) * (x.ndim - 2))
        return jax.lax.dynamic_slice_in_dim(x, first, width, axis=1)

    kv_len = jnp.clip(jnp.minimum(real, start) - first, 0, width).astype(jnp.int32)
    before = partial(q, keys(k_row), keys(v_row), q_len, kv_len, causal=False, scale=scale)
    return with_sinks(*merge(diagonal, before), sinks)[0]


def windowed_chunk(q, k_row, v_row, start, real, window: int, *, scale, partial, sinks=None):
    """`chunk_of_row` with a sliding `window`, as one causal call with the window: a query sees
    at most the `P = window - 1` keys before the chunk, so the chunk's `L` queries are placed at
    their offset in a block of `P + L` rows (`placed`) against the `P + L` keys from
    `max(start - P, 0)`: causal top-left and the window there are the mask by positions (the key
    block ends up to `P` past the row: padding, masked by length). Exact, where a prefix block
    would need a band cuDNN's masks cannot express. `[B, L, H, Dv]` float32, the sinks (or None)
    added."""
    length = q.shape[1]
    p = min(window - 1, k_row.shape[1])
    span = p + length
    base = jnp.maximum(start - p, 0)

    def keys(x):
        x = jnp.pad(x, ((0, 0), (0, p)) + ((0, 0),) * (x.ndim - 2))
        return jax.lax.dynamic_slice_in_dim(x, base, span, axis=1)

    kv_len = jnp.clip(real - base, 0, span).astype(jnp.int32)
    out, lse = placed(
        q, keys(k_row), keys(v_row), start - base, kv_len, kv_len, window=window, scale=scale,
        partial=equal_widths(partial),
    )  # fmt: skip
    return with_sinks(out, lse, sinks)[0]


def placed(q, k, v, offset, q_len, kv_len, *, window: int, scale, partial: Partial) -> tuple:
    """The queries `q [B, L, H, D]` placed at rows `offset .. offset + L - 1` of a block of `S`
    rows (zeros elsewhere, their results dropped) against the keys `k [B, S, KV, D]` and values
    `[B, S, KV, Dv]`, one causal call with the `window`: the query at row `offset + i` sees the
    keys `offset + i - window < j <= offset + i` of the first `kv_len [B]` (`q_len [B]`: the
    block's real rows, `offset` plus the queries' real ones, padding only after them). Where the
    queries' positions minus the keys' are the rows' minus a constant, this is the mask by
    positions: `windowed_chunk`'s chunk of queries after its window's keys, the ring's band of
    an earlier chunk of keys (`ppl_jax.models.layers.ring_merge`). `(out [B, L, H, Dv], lse
    [B, L, H])` float32; `offset` may be traced."""
    b, length = q.shape[:2]
    rows = jnp.zeros((b, k.shape[1]) + q.shape[2:], q.dtype)
    rows = jax.lax.dynamic_update_slice_in_dim(rows, q, offset, axis=1)
    out, lse = partial(rows, k, v, q_len, kv_len, causal=True, scale=scale, window=window)
    return tuple(jax.lax.dynamic_slice_in_dim(x, offset, length, axis=1) for x in (out, lse))


def whole_row(q, k, v, real, *, scale, partial: Partial, sinks=None, window=None) -> jax.Array:
    """Rows of one document from position 0 (`real [B]` tokens) on one device: one causal call
    of the partial over the row (with the sliding `window`, or None), then the sinks `[H]` (or
    None; `with_sinks`); values of another width padded (`equal_widths`). `[B, T, H, Dv]`
    float32."""
    call = equal_widths(partial)
    out, lse = call(q, k, v, real, real, causal=True, scale=scale, window=window)
    return with_sinks(out, lse, sinks)[0]


def chunked_rows(q, k, v, real, chunk: int, *, scale, partial: Partial, sinks=None) -> jax.Array:
    """Chunked attention (Llama 4: query `i` sees the keys of its chunk `pos // chunk` up to
    itself) of rows of one document from position 0 (`real [B]` tokens), as one causal call
    (`chunked_partial`); the sinks `[H]` (or None) added after; `[B, T, H, Dv]` float32."""
    out, lse = chunked_partial(q, k, v, real, chunk, scale=scale, partial=partial)
    return with_sinks(out, lse, sinks)[0]


def chunked_partial(q, k, v, real, chunk: int, *, scale, partial: Partial) -> tuple:
    """`chunked_rows` before the sinks, with the log-sum-exp: block-diagonal causal attention is
    causal attention within each chunk, so `[B, T]` becomes `[B * T/C, C]` (the row padded to a
    multiple of `C`, each piece's length its real tokens; marin's reshape of uniform packed
    segments, marin-community/marin#5749). Queries `[B, T, H, D]`, keys `[B, T, KV, D]`, values
    `[B, T, KV, Dv]`, the row's first token at a chunk's start; `(out [B, T, H, Dv], lse
    [B, T, H])` float32."""
    b, t = q.shape[:2]
    size = min(chunk, t)  # a chunk at least the row: the row itself
    n = -(-t // size)

    def pieces(x):
        x = jnp.pad(x, ((0, 0), (0, n * size - t)) + ((0, 0),) * (x.ndim - 2))
        return x.reshape(b * n, size, *x.shape[2:])

    starts = jnp.arange(n, dtype=jnp.int32)[None] * size
    lengths = jnp.clip(real[:, None] - starts, 0, size).reshape(-1).astype(jnp.int32)
    out, lse = equal_widths(partial)(
        pieces(q), pieces(k), pieces(v), lengths, lengths, causal=True, scale=scale
    )
    return tuple(x.reshape(b, n * size, *x.shape[2:])[:, :t] for x in (out, lse))


def over_context(
    q,
    k_row,
    v_row,
    real,
    n: int,
    *,
    scale: float,
    partial: Partial,
    sinks=None,
    window=None,
    chunk=None,
) -> jax.Array:
    """Inside `shard_map` over `context` (`N = n` devices): this device's two chunks of
    queries `q [B, 2L, H, D]` (`c_r` and `c_{2N-1-r}` of the load-balanced order) against the
    gathered row's keys `[B, T, KV, D]` and values `[B, T, KV, Dv]` in row order (one document
    of `real [B]` tokens), the sinks `[H]` (or None) added once each chunk's partials are
    merged; `[B, 2L, H, Dv]` in `q.dtype`. Each chunk's prefix is a static slice of the row,
    chosen by the device's index with `lax.switch` (one branch per device); with a sliding
    `window`, each chunk is one call (`windowed_chunk`); with chunked attention, `chunked_chunk`
    (`chunks_fit` the chunks' length)."""
    partial = equal_widths(partial)
    options = dict(scale=scale, partial=partial, sinks=sinks, window=window, chunk=chunk)
    r = jax.lax.axis_index(context_lib.AXIS)
    half = q.shape[1] // 2
    outs = []
    for i in range(2):
        q_i = q[:, i * half : (i + 1) * half]
        index = r if i == 0 else 2 * n - 1 - r  # of the row's 2N chunks

        def prefix(q_len, q_i=q_i, i=i):
            def branch(device, q_len):
                c = device if i == 0 else 2 * n - 1 - device  # this branch's chunk, static
                if c == 0:
                    return no_keys(q_i, v_row.shape[3])
                kv_len = jnp.minimum(real, c * half).astype(jnp.int32)
                keys = (k_row[:, : c * half], v_row[:, : c * half])
                return partial(q_i, *keys, q_len, kv_len, causal=False, scale=scale)

            branches = [functools.partial(branch, device) for device in range(n)]
            return jax.lax.switch(r, branches, q_len)

        outs.append(chunk_of_row(q_i, k_row, v_row, index * half, real, prefix=prefix, **options))
    return jnp.concatenate(outs, axis=1).astype(q.dtype)
