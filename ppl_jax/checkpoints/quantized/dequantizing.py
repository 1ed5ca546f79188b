"""Quantized Hugging Face weights read as the float weights they stand for, block by block.

A quantized weight (`Quantized`: its kind, its stored parts, its shape in Hugging Face's layout,
`<m>.weight [out, in]` or GPT-OSS's `experts.gate_up_proj [experts, in, out]`, found by
`ppl_jax.checkpoints.formats.quantized_parts`) is read by block (`read`): a block is read as the
rows, words, groups and blocks of its parts that this block needs (a device's block of `q_proj`
reads its own columns of `qweight`, `scales` and `qzeros`, and its own rows of `g_idx`), and
dequantized by `ppl_jax.checkpoints.formats.quantized`. `Dequantized` is the storage the mapping
reads through: so each process dequantizes only its own shard, and a quantized weight never passes
through a full-precision copy of the model. A block's parts are read at once (packed, they are a
fraction of the block), and dequantized in slabs of about `SLAB` weights into the block, so that the
unpacked codes, expanded scales and float32 products a slab needs stay a few MiB whatever the
block's size. The mapping rules, the blocks and the cast to the model's dtype are the same as for a
float checkpoint.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import ml_dtypes
import numpy as np

from ppl_jax.checkpoints.mapping.storage import Storage
from ppl_jax.checkpoints.quantized import packing as q
from ppl_jax.errors import CheckpointError

SLAB = 1 << 18  # weights dequantized at once: about 5 MiB of temporaries


@dataclasses.dataclass(frozen=True)
class Quantized:
    """One quantized weight (see the module docstring).

    Attributes:
      kind: `gptq`, `awq`, `packed` (compressed-tensors' int32 words), `scaled` (int8 or
        float8 values times scales per block), `mxfp4`.
      parts: role -> stored name (`qweight`, `qzeros`, `scales`, `g_idx`; `values`, `scale`,
        `zero`; `blocks`, `scales`).
      shape: the dequantized weight's shape, Hugging Face's layout.
      dtype: the dtype (safetensors name) its reference computes it in.
      bits: bits per code.
      group: values per group along the input axis (GPTQ without `g_idx`, AWQ).
      groups: the groups the scales hold (the bound of a `g_idx`).
      block: the (rows, columns) a scale covers (`scaled`, `packed`).
      scalar: the dimensions of a scale stored as one value (per tensor: 0 or 1), else -1.
      v1: GPTQ's zero points stored minus one.
      packed_zero: compressed-tensors' zero points packed in int32 words along the output
        axis (its releases from 0.10 on), not stored as they are, the scale's shape.
    """

    kind: str
    parts: dict[str, str]
    shape: tuple[int, ...]
    dtype: str
    bits: int = 0
    group: int = 0
    groups: int = 0
    block: tuple[int, int] = (1, 1)
    scalar: int = -1
    v1: bool = False
    packed_zero: bool = False


def _range(index: tuple[slice, ...], shape: tuple[int, ...], axis: int) -> range:
    return range(*index[axis].indices(shape[axis])[:2])


def read(t: Quantized, storage: Storage, index: tuple[slice, ...]) -> np.ndarray:
    """The block `index` of the quantized weight `t`, in `t.dtype`'s NumPy dtype, read from
    `storage` as the regions of its parts it needs.

    Raises:
      CheckpointError: a `g_idx` naming a group the scales do not have; as `storage.read`.
    """
    return _READERS[t.kind](t, storage, index)


def _slabs(n: int, width: int, unit: int = 1) -> list[tuple[int, int]]:
    """`[0, n)` cut in slabs of about `SLAB / width` rows (a multiple of `unit`)."""
    step = max(unit, SLAB // max(width, 1) // unit * unit)
    return [(a, min(n, a + step)) for a in range(0, n, step)]


def _groups(t: Quantized, storage: Storage, cols: range) -> tuple[np.ndarray, int, int]:
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


def _zero_words(t: Quantized) -> int:
    """The words of one row of zero points packed along the output axis."""
    return math.ceil(t.shape[-2] * t.bits / 32)


def _gptq(t: Quantized, storage: Storage, index: tuple[slice, ...]) -> np.ndarray:
    """GPTQ: `qweight [in * bits / 32, out]` packed along the input axis, `qzeros [groups,
    out * bits / 32]` along the output axis, `scales [groups, out]`, `g_idx [in]`; the block
    dequantized by runs of 32 input rows."""
    rows, cols = _range(index, t.shape, 0), _range(index, t.shape, 1)  # out, in
    p, bits = t.parts, t.bits
    w0, w1, first = q.words_for(cols.start, cols.stop, bits, math.ceil(t.shape[1] * bits / 32))
    words = np.asarray(storage.read(p["qweight"], (slice(w0, w1), slice(rows.start, rows.stop))))
    g, g0, g1 = _groups(t, storage, cols)
    z0, z1, zfirst = q.words_for(rows.start, rows.stop, bits, _zero_words(t))
    qz = np.asarray(storage.read(p["qzeros"], (slice(g0, g1), slice(z0, z1))))
    if t.v1:
        qz = q.gptq_v1_zeros(qz, bits)
    zeros = qz if (t.v1 and bits == 3) else q.unpack(qz, bits, 1)
    zeros = zeros[:, rows.start - zfirst : rows.stop - zfirst]
    scales = np.asarray(storage.read(p["scales"], (slice(g0, g1), slice(rows.start, rows.stop))))
    out = np.empty((len(cols), len(rows)), scales.dtype)  # [in, out]: returned transposed
    for a, b in _slabs(w1 - w0, len(rows) * 32 // bits, bits):  # words: runs of 32 codes
        c0 = first + a * 32 // bits  # the slab's first code
        lo, hi = max(c0, cols.start), min(c0 + (b - a) * 32 // bits, cols.stop)
        if lo < hi:
            codes = q.unpack(words[a:b], bits, 0)[lo - c0 : hi - c0]
            at = slice(lo - cols.start, hi - cols.start)
            out[at] = q.grouped(codes, zeros, scales, g[at] - g0)
    return out.T  # a view: the mapping's transpose back to [in, out] makes it contiguous


def _awq(t: Quantized, storage: Storage, index: tuple[slice, ...]) -> np.ndarray:
    """AWQ: `qweight [in, out / 8]` and `qzeros [groups, out / 8]` in AWQ's order, `scales
    [groups, out]`; the block dequantized by slabs of input rows."""
    rows, cols = _range(index, t.shape, 0), _range(index, t.shape, 1)  # out, in
    p = t.parts
    w0, w1 = rows.start // 8, math.ceil(rows.stop / 8)
    at_rows = slice(rows.start - 8 * w0, rows.stop - 8 * w0)
    words = np.asarray(storage.read(p["qweight"], (slice(cols.start, cols.stop), slice(w0, w1))))
    g = np.arange(cols.start, cols.stop) // t.group
    g0, g1 = int(g[0]), int(g[-1]) + 1
    zeros = q.awq_codes(np.asarray(storage.read(p["qzeros"], (slice(g0, g1), slice(w0, w1)))))
    zeros = zeros[:, at_rows]
    scales = np.asarray(storage.read(p["scales"], (slice(g0, g1), slice(rows.start, rows.stop))))
    out = np.empty((len(cols), len(rows)), scales.dtype)  # [in, out]: returned transposed
    for a, b in _slabs(len(cols), 8 * (w1 - w0)):
        codes = q.awq_codes(words[a:b])[:, at_rows]
        out[a:b] = q.grouped(codes, zeros, scales, g[a:b] - g0)
    return out.T


def _compact(t: Quantized, storage: Storage, role: str, index: tuple[slice, ...]):
    """The stored scale (or zero point) entries a block needs, and where they start: a
    `[..., ceil(rows / bh), ceil(cols / bw)]` region over `t.block` (or the one value)."""
    name = t.parts[role]
    if t.scalar >= 0:
        return np.asarray(storage.read(name, (slice(0, 1),) * t.scalar)).reshape(()), 0, 0
    rows, cols = _range(index, t.shape, -2), _range(index, t.shape, -1)
    (bh, bw), lead = t.block, index[:-2]
    r0, c0 = rows.start // bh, cols.start // bw
    at = lead + (slice(r0, (rows.stop - 1) // bh + 1), slice(c0, (cols.stop - 1) // bw + 1))
    return np.asarray(storage.read(name, at)), r0, c0


def _spread(t: Quantized, compact, rows: range, cols: range) -> np.ndarray:
    """`_compact`'s entries repeated to the weights at `rows` and `cols` (a slab)."""
    s, r0, c0 = compact
    if s.ndim == 0:
        return s
    (bh, bw) = t.block
    return q.expand(q.expand(s, -2, rows, bh, r0), -1, cols, bw, c0)


def _scaled(t: Quantized, storage: Storage, index: tuple[slice, ...]) -> np.ndarray:
    """int8 or float8 values times their scales (minus zero points): compressed-tensors'
    naive, int and float layouts, DeepSeek-V3's FP8; by slabs of rows."""
    values = np.asarray(storage.read(t.parts["values"], index))
    scale = _compact(t, storage, "scale", index)
    zero = _compact(t, storage, "zero", index) if "zero" in t.parts else None
    rows, cols = _range(index, t.shape, -2), _range(index, t.shape, -1)
    out = np.empty(values.shape, _NP[t.dtype])
    lead = math.prod(values.shape[:-2])
    for a, b in _slabs(len(rows), lead * len(cols)):
        part = range(rows.start + a, rows.start + b)
        z = None if zero is None else _spread(t, zero, part, cols)
        out[..., a:b, :] = q.scaled(
            values[..., a:b, :], _spread(t, scale, part, cols), z, out.dtype
        )
    return out


def _packed(t: Quantized, storage: Storage, index: tuple[slice, ...]) -> np.ndarray:
    """compressed-tensors' `pack-quantized`: `weight_packed [out, in * bits / 32]`, codes minus
    2 ** (bits - 1) (its `unpack_from_int32`); `weight_scale` per group (or by
    `weight_g_idx`), channel or tensor; zero points packed along the output axis (group and
    channel strategies since compressed-tensors 0.10: `weight_zero_point [out * bits / 32,
    groups]`), or stored as they are (the scale's shape; one value per tensor). By slabs of
    output rows."""
    rows, cols = _range(index, t.shape, 0), _range(index, t.shape, 1)
    p, bits, offset = t.parts, t.bits, 1 << (t.bits - 1)
    w0, w1, first = q.words_for(cols.start, cols.stop, bits, math.ceil(t.shape[1] * bits / 32))
    packed = np.asarray(storage.read(p["packed"], (slice(rows.start, rows.stop), slice(w0, w1))))
    at_cols = slice(cols.start - first, cols.stop - first)
    g = None
    if "g_idx" in p:
        g, g0, g1 = _groups(t, storage, cols)
        groups = slice(g0, g1)
        scale = np.asarray(storage.read(p["scale"], (slice(rows.start, rows.stop), groups)))
    else:
        scale = _compact(t, storage, "scale", index)
        groups = slice(scale[2], (cols.stop - 1) // t.block[1] + 1)
    zero = None
    if "zero" in p:
        if t.packed_zero:
            zero = _zeros(t, storage, rows, groups)
        elif g is not None:
            zero = np.asarray(storage.read(p["zero"], (slice(rows.start, rows.stop), groups)))
        else:
            zero = _compact(t, storage, "zero", index)
    out = np.empty((len(rows), len(cols)), _NP[t.dtype])
    for a, b in _slabs(len(rows), len(cols)):
        codes = q.unpack(packed[a:b], bits, 1)[:, at_cols].astype(np.float32) - offset
        part = range(rows.start + a, rows.start + b)
        if g is not None:
            s, z = scale[a:b, g - g0], None if zero is None else zero[a:b, g - g0]
        else:
            s = _spread(t, scale, part, cols)
            if zero is None or not t.packed_zero:
                z = None if zero is None else _spread(t, zero, part, cols)
            else:
                z = q.expand(zero[a:b], 1, cols, t.block[1], groups.start)
        out[a:b] = q.scaled(codes, s, z, out.dtype)
    return out


def _zeros(t: Quantized, storage: Storage, rows: range, groups: slice) -> np.ndarray:
    """compressed-tensors' zero points of `rows` and `groups`, unpacked from the words they
    are packed in along the output axis, minus 2 ** (bits - 1)."""
    z0, z1, first = q.words_for(rows.start, rows.stop, t.bits, _zero_words(t))
    z = np.asarray(storage.read(t.parts["zero"], (slice(z0, z1), groups)))
    z = q.unpack(z, t.bits, 0)[rows.start - first : rows.stop - first]
    return z.astype(np.int16) - (1 << (t.bits - 1))


def _mxfp4(t: Quantized, storage: Storage, index: tuple[slice, ...]) -> np.ndarray:
    """GPT-OSS's experts `[experts, in, out]` from `blocks [experts, out, in / 32, 16]` and
    `scales [experts, out, in / 32]` (transformers' `convert_moe_packed_tensors` ends with
    `.transpose(1, 2)`); by slabs of output rows."""
    experts, cols, rows = (_range(index, t.shape, a) for a in range(3))  # in = cols
    b0, b1 = cols.start // 32, (cols.stop - 1) // 32 + 1
    at = (slice(experts.start, experts.stop), slice(rows.start, rows.stop), slice(b0, b1))
    blocks = np.asarray(storage.read(t.parts["blocks"], at + (slice(0, 16),)))
    scales = np.asarray(storage.read(t.parts["scales"], at))
    out = np.empty((len(experts), len(cols), len(rows)), np.float32)
    for a, b in _slabs(len(rows), len(experts) * 32 * (b1 - b0)):
        values = q.mxfp4(blocks[:, a:b], scales[:, a:b])
        out[:, :, a:b] = np.swapaxes(values[:, :, cols.start - 32 * b0 : cols.stop - 32 * b0], 1, 2)
    return out


_READERS: dict[str, Callable] = {
    "gptq": _gptq, "awq": _awq, "scaled": _scaled, "packed": _packed, "mxfp4": _mxfp4,
}  # fmt: skip
_NP = {"F32": np.float32, "F16": np.float16, "BF16": ml_dtypes.bfloat16}


class Dequantized:
    """A `ppl_jax.checkpoints.mapping.storage.Storage` over another: the quantized weights
    (`Quantized`, by the rules' names) read and dequantized by block (`read`), every other
    tensor read from the storage underneath."""

    def __init__(self, storage: Storage, tensors: dict[str, Quantized]):
        self.storage, self.tensors = storage, tensors

    def read(self, stored_name: str, index: tuple[slice, ...]) -> np.ndarray:
        t = self.tensors.get(stored_name)
        if t is None:
            return self.storage.read(stored_name, index)
        index = tuple(index) + (slice(None),) * (len(t.shape) - len(index))
        return read(t, self.storage, index)
