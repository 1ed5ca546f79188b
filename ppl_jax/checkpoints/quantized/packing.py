"""What the methods share to dequantize a block on the host: the formulas (in NumPy, on the
stored regions a block of the weight needs), how codes are packed in words, and the reading of
those regions in slabs.

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
"""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np

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
