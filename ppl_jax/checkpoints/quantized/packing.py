"""What the methods share to dequantize a block on the host: the formulas (in NumPy, on the
stored regions a block of the weight needs), how codes are packed in words, and the reading of
those regions in slabs; and the same formulas on the device (`*_on_device`, pure jit-able JAX
on the parts `Method.device_parts` reads whole), which give the host's weights bit for bit.

Each formula gives the weight as its format's reference computes it: the exact product of the
codes and their scale (exact in float32 for every layout here), rounded once to the dtype that
reference computes in (the scales' dtype for GPTQ, AWQ and compressed-tensors' integer and FP8
layouts; float32 for DeepSeek's block FP8 and for MXFP4). The caller then casts it to the
model's dtype. The sources each function follows are named in its docstring; the formulas one
method alone uses are in its module.

A block's parts are read at once (packed, they are a fraction of the block) and dequantized in
slabs of about `SLAB` weights into the block (`slabs`), so that the unpacked codes, expanded
scales and float32 products a slab needs stay a few MiB whatever the block's size.

Packed integers (GPTQ, AWQ, compressed-tensors' `pack-quantized`) are unsigned codes of `bits`
bits in little-endian 32-bit words; 32 consecutive codes fill `bits` words, code `i` starting
at bit `i * bits` of that run (for 2, 4 and 8 bits: `32 / bits` codes a word, the first in the
lowest bits; for 3 bits a code may straddle two words). That is GPTQ's packing (gptqmodel
`PackableQuantLinear.pack_original`, AutoGPTQ before it) and compressed-tensors' `pack_to_int32`
alike.

On the device the formulas are the host's, operation for operation: the codes minus their zero
points (exact integers), times the scale in float32 (one rounding, no fused multiply-add: no
sum follows a product), rounded once to the reference's dtype. Exact bit for bit, with one
exception that only subnormal numbers reach: XLA on CPU flushes float32 subnormals to zero (an
input scale below 2**-126 in float32 or bfloat16, or a product below it), where NumPy keeps
them; float16 scales and every product of an integer code and a float16 scale are normal in
float32, so float16 checkpoints are exact everywhere.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
from jax import lax

from ppl_jax.checkpoints.mapping.storage import Storage
from ppl_jax.checkpoints.quantized.base import Quantized
from ppl_jax.errors import CheckpointError

SLAB = 1 << 18  # weights dequantized at once: about 5 MiB of temporaries
NP = {"F32": np.float32, "F16": np.float16, "BF16": ml_dtypes.bfloat16}


def words_for(start: int, stop: int, bits: int, stored: int) -> tuple[int, int, int]:
    """The packed words that hold codes `[start, stop)`: `(first word, end word, first code)`,
    whole runs of 32 codes (`bits` words each), the end clipped to the `stored` words."""
    first = start // 32
    return first * bits, min(stored, math.ceil(stop / 32) * bits), first * 32


def unpack(words: np.ndarray, bits: int, axis: int) -> np.ndarray:
    """The codes packed in `words` (any 32-bit integer dtype) along `axis`, as uint8:
    `words.shape[axis] * 32 // bits` codes on that axis (a last partial run of words is read
    as if zero-padded to `bits` words). See the module docstring for the layout."""
    w = np.moveaxis(np.asarray(words).view(np.uint32), axis, -1)
    n, mask = w.shape[-1], (1 << bits) - 1
    if 32 % bits == 0:  # whole codes in each word: one shift per position
        per = 32 // bits
        out = np.empty(w.shape + (per,), np.uint8)
        for k in range(per):
            np.bitwise_and(w >> np.uint32(bits * k), mask, out=out[..., k], casting="unsafe")
        return np.moveaxis(out.reshape(w.shape[:-1] + (n * per,)), -1, axis)
    runs = math.ceil(n / bits)  # codes straddle words: each run of `bits` words holds 32
    w = w.astype(np.uint64)
    if runs * bits != n:
        w = np.concatenate([w, np.zeros(w.shape[:-1] + (runs * bits - n,), np.uint64)], -1)
    w = w.reshape(w.shape[:-1] + (runs, bits))
    start = np.arange(32) * bits
    word, shift = start // 32, (start % 32).astype(np.uint64)
    low = w[..., word] >> shift
    spill = (shift + np.uint64(bits)) > 32
    high = np.where(
        spill, w[..., np.minimum(word + 1, bits - 1)] << (np.uint64(32) - shift), np.uint64(0)
    )
    codes = ((low | high) & np.uint64(mask)).astype(np.uint8)
    codes = codes.reshape(codes.shape[:-2] + (runs * 32,))[..., : n * 32 // bits]
    return np.moveaxis(codes, -1, axis)


def grouped(codes: np.ndarray, zeros: np.ndarray, scales: np.ndarray, groups: np.ndarray):
    """GPTQ's and AWQ's weight `[in, out]`: `(codes - zeros[g]) * scales[g]`, `g = groups` (each
    row's group: GPTQ's `g_idx`, AWQ's row // group_size), in the scales' dtype (gptqmodel
    `PackableQuantLinear.dequantize_weight`: `scales[g_idx] * (weight - zeros[g_idx])`; autoawq
    `dequantize_gemm`: `(iweight - izeros) * scales`; both in float16 for float16 scales).

    Args:
      codes: [in, out] int, the unpacked `qweight` rows of the block (AWQ: `awq_codes`).
      zeros: [groups, out] int, the unpacked zero points (GPTQ: v2, `gptq_v1_zeros`).
      scales: [groups, out] float.
      groups: [in] int, each row's group (an index into `zeros` and `scales`).
    """
    edges = np.flatnonzero(np.diff(groups)) + 1
    if len(edges) > 16:  # act-order: rows of many groups, gathered
        diff = codes.astype(np.float32) - zeros[groups].astype(np.float32)  # exact: integers
        return (diff * scales[groups].astype(np.float32)).astype(scales.dtype)
    out = np.empty(codes.shape, scales.dtype)
    for a, b in zip([0, *edges], [*edges, len(groups)], strict=True):  # runs of one group
        g = groups[a]
        diff = codes[a:b].astype(np.float32) - zeros[g].astype(np.float32)
        np.multiply(diff, scales[g].astype(np.float32), out=diff)
        out[a:b] = diff
    return out


def scaled(
    values: np.ndarray, scale: np.ndarray, zero: np.ndarray | None = None, out: np.dtype = None
):
    """compressed-tensors' dequantization `(x_q - zero_point) * scale` of integer or FP8
    values, `scale` and `zero` broadcast to `values`' shape (compressed-tensors
    `quantization.lifecycle.forward_helpers._dequantize`: `x_q.to(scale.dtype)`, minus
    `zero_point.to(scale.dtype)`, times `scale`, in the scale's dtype; DeepSeek-V3's
    `weight_dequant` and transformers' `Fp8Dequantize`: `weight.float() * scale_inv` in float32).

    Args:
      values: the codes (signed integers) or float8 values; scale: float, broadcastable;
      zero: integer zero points, broadcastable, or None; out: the result's dtype (default the
        scale's).
    """
    x = values.astype(np.float32)
    if zero is not None:
        x = x - zero.astype(np.float32)
    return (x * scale.astype(np.float32)).astype(out or scale.dtype)


def expand(scale: np.ndarray, axis: int, positions: range, size: int, first: int) -> np.ndarray:
    """`scale` repeated along `axis` to the `positions` of the weight, each position taking the
    entry `position // size - first` (a group or block of `size` positions per entry)."""
    index = np.arange(positions.start, positions.stop) // size - first
    return np.take(scale, index, axis=axis)


def in_range(index: tuple[slice, ...], shape: tuple[int, ...], axis: int) -> range:
    """The positions the slice `index[axis]` takes of a dimension of `shape[axis]`."""
    return range(*index[axis].indices(shape[axis])[:2])


def slabs(n: int, width: int, unit: int = 1) -> list[tuple[int, int]]:
    """`[0, n)` cut in slabs of about `SLAB / width` rows (a multiple of `unit`)."""
    step = max(unit, SLAB // max(width, 1) // unit * unit)
    return [(a, min(n, a + step)) for a in range(0, n, step)]


def column_groups(t: Quantized, storage: Storage, cols: range) -> tuple[np.ndarray, int, int]:
    """(each input column's group in `cols`, from `g_idx` or the group size, and the first and
    end group they span)."""
    name = t.parts.get("g_idx")
    if name is None:
        g = np.arange(cols.start, cols.stop) // t.group
    else:
        g = np.asarray(storage.read(name, (slice(cols.start, cols.stop),))).astype(np.int64)
        bad = g[(g < 0) | (g >= t.groups)]
        if bad.size:
            raise CheckpointError(
                f"the stored {name!r} names group {int(bad[0])}, but its weight's scales hold "
                f"{t.groups} groups; the checkpoint is damaged."
            )
    if not g.size:
        return g, 0, 0
    return g, int(g.min()), int(g.max()) + 1


def zero_words(t: Quantized) -> int:
    """The words of one row of zero points packed along the output axis."""
    return math.ceil(t.shape[-2] * t.bits / 32)


def compact(t: Quantized, storage: Storage, role: str, index: tuple[slice, ...]):
    """The stored scale (or zero point) entries a block needs, and where they start: a
    `[..., ceil(rows / bh), ceil(cols / bw)]` region over `t.block` (or the one value)."""
    name = t.parts[role]
    if t.scalar >= 0:
        return np.asarray(storage.read(name, (slice(0, 1),) * t.scalar)).reshape(()), 0, 0
    rows, cols = in_range(index, t.shape, -2), in_range(index, t.shape, -1)
    (bh, bw), lead = t.block, index[:-2]
    r0, c0 = rows.start // bh, cols.start // bw
    at = lead + (slice(r0, (rows.stop - 1) // bh + 1), slice(c0, (cols.stop - 1) // bw + 1))
    return np.asarray(storage.read(name, at)), r0, c0


def spread(t: Quantized, entries, rows: range, cols: range) -> np.ndarray:
    """`compact`'s `entries` repeated to the weights at `rows` and `cols` (a slab)."""
    s, r0, c0 = entries
    if s.ndim == 0:
        return s
    (bh, bw) = t.block
    return expand(expand(s, -2, rows, bh, r0), -1, cols, bw, c0)


def read_scaled(t: Quantized, storage: Storage, index: tuple[slice, ...]) -> np.ndarray:
    """int8 or float8 values times their scales (minus zero points): compressed-tensors'
    naive, int and float layouts, DeepSeek-V3's FP8; by slabs of rows."""
    values = np.asarray(storage.read(t.parts["values"], index))
    scale = compact(t, storage, "scale", index)
    zero = compact(t, storage, "zero", index) if "zero" in t.parts else None
    rows, cols = in_range(index, t.shape, -2), in_range(index, t.shape, -1)
    out = np.empty(values.shape, NP[t.dtype])
    lead = math.prod(values.shape[:-2])
    for a, b in slabs(len(rows), lead * len(cols)):
        part = range(rows.start + a, rows.start + b)
        z = None if zero is None else spread(t, zero, part, cols)
        out[..., a:b, :] = scaled(values[..., a:b, :], spread(t, scale, part, cols), z, out.dtype)
    return out


def pack(codes: np.ndarray, bits: int, axis: int) -> np.ndarray:
    """The inverse of `unpack` for 2, 4 and 8 bits: `codes` (uint8, each below 2 ** bits) along
    `axis` packed in uint32 words, `ceil(n * bits / 32)` on that axis (the last word's unused
    high bits zero)."""
    per = 32 // bits
    c = np.moveaxis(np.asarray(codes, np.uint8), axis, 0)
    n = c.shape[0]
    if n % per:
        c = np.concatenate([c, np.zeros((-n % per,) + c.shape[1:], np.uint8)])
    c = c.reshape((-1, per) + c.shape[1:])
    words = c[:, 0].astype(np.uint32)
    for k in range(1, per):
        words |= c[:, k].astype(np.uint32) << np.uint32(bits * k)
    return np.moveaxis(words, 0, axis)


def read_whole(storage: Storage, t: Quantized, shapes: dict[str, tuple[int, ...]]):
    """`{role: array}`: each part of `t` that `shapes` (role -> its stored shape) names, read
    whole from `storage` in its stored dtype."""
    return {
        role: np.asarray(storage.read(t.parts[role], tuple(slice(0, n) for n in shape)))
        for role, shape in shapes.items()
        if role in t.parts
    }


def unpack_on_device(words: jax.Array, bits: int, n: int) -> jax.Array:
    """`unpack` on the device, along the last axis: the first `n` codes of `words [..., w]`
    (int32 or uint32; `n <= w * 32 // bits`), `[..., n]` uint8."""
    w = words if words.dtype == jnp.uint32 else lax.bitcast_convert_type(words, jnp.uint32)
    mask = (1 << bits) - 1
    if 32 % bits == 0:  # whole codes in each word
        codes = (w[..., None] >> jnp.arange(0, 32, bits, dtype=jnp.uint32)) & mask
    else:  # runs of `bits` words hold 32 codes, some straddling two words
        runs = -(-w.shape[-1] // bits)
        w = jnp.pad(w, [(0, 0)] * (w.ndim - 1) + [(0, runs * bits - w.shape[-1])])
        w = w.reshape(w.shape[:-1] + (runs, bits))
        each = []
        for k in range(32):
            word, shift = divmod(k * bits, 32)
            code = w[..., word] >> shift
            if shift + bits > 32:
                code = code | (w[..., word + 1] << (32 - shift))
            each.append(code & mask)
        codes = jnp.stack(each, -1)
    return codes.reshape(codes.shape[:-2] + (-1,))[..., :n].astype(jnp.uint8)


def repeat_on_device(x: jax.Array, axis: int, size: int, n: int) -> jax.Array:
    """`x` with each entry along `axis` repeated `size` times, the first `n` kept: a scale (or
    zero point) per group or block of `size` weights spread to the `n` weights."""
    if size > 1:
        x = jnp.repeat(x, size, axis=axis)
    return lax.slice_in_dim(x, 0, n, axis=axis % x.ndim)


def product_on_device(codes: jax.Array, zeros, scale: jax.Array, dtype) -> jax.Array:
    """`scaled` on the device: `(codes - zeros) * scale` in float32, rounded once to `dtype`
    (`zeros` None for none); the arguments broadcast alike."""
    x = codes.astype(jnp.float32)
    if zeros is not None:
        x = x - zeros.astype(jnp.float32)
    return (x * scale.astype(jnp.float32)).astype(dtype)


def grouped_on_device(t: Quantized, parts: dict[str, jax.Array]) -> jax.Array:
    """GPTQ's and AWQ's weight `[out, in]` in `t.dtype` (`grouped` on the device) from the
    parts as `device_parts` gives them: `qweight [ceil(in * bits / 32), out]` packed along the
    input axis, `qzeros [groups, out]` uint8 (the zero points, v2), `scales [groups, out]`, and
    `g_idx [in]` int32 (each input row's group) or, without it, groups of `t.group` rows."""
    width = t.shape[1]
    codes = unpack_on_device(parts["qweight"].T, t.bits, width)  # [out, in]
    zeros, scales = parts["qzeros"].T, parts["scales"].T  # [out, groups]
    if "g_idx" in parts:
        zeros = jnp.take(zeros, parts["g_idx"], axis=1)
        scales = jnp.take(scales, parts["g_idx"], axis=1)
    else:
        zeros = repeat_on_device(zeros, 1, t.group, width)
        scales = repeat_on_device(scales, 1, t.group, width)
    return product_on_device(codes, zeros, scales, NP[t.dtype])


def scaled_parts(t: Quantized, storage: Storage) -> dict[str, np.ndarray]:
    """`Method.device_parts` of int8 or float8 values times scales (`read_scaled`): `values`
    as stored `[..., out, in]`; `scale` (and `zero`) one row per output row, `[..., out,
    ceil(in / block[1])]` (block scales repeated along the output axis), or `[]` per tensor;
    zero points int8 (int32 when stored wider)."""
    *lead, out, width = t.shape
    bh, bw = t.block
    entries = (
        (1,) * t.scalar if t.scalar >= 0
        else (*lead, -(-out // bh), -(-width // bw))
    )  # fmt: skip
    got = read_whole(storage, t, {"values": t.shape, "scale": entries, "zero": entries})
    for role in ("scale", "zero"):
        if role not in got:
            continue
        x = got[role]
        if role == "zero" and x.dtype != np.int8:
            x = x.astype(np.int32)
        got[role] = x.reshape(()) if t.scalar >= 0 else np.repeat(x, bh, axis=-2)[..., :out, :]
    return got


def scaled_out_axes(t: Quantized) -> dict[str, int]:
    """The output axis of each part `scaled_parts` gives (none for a scale per tensor)."""
    axis = len(t.shape) - 2
    roles = ("values",) if t.scalar >= 0 else ("values", "scale", "zero")
    return {r: axis for r in roles if r == "values" or r in t.parts}


def scaled_on_device(t: Quantized, parts: dict[str, jax.Array]) -> jax.Array:
    """`read_scaled` on the device: `values [..., out, in]` times `scale` (minus `zero`), as
    `scaled_parts` gives them, in `t.dtype`."""
    values, width = parts["values"], t.shape[-1]
    scale, zero = parts["scale"], parts.get("zero")
    if scale.ndim:
        scale = repeat_on_device(scale, -1, t.block[1], width)
        zero = None if zero is None else repeat_on_device(zero, -1, t.block[1], width)
    return product_on_device(values, zero, scale, NP[t.dtype])
