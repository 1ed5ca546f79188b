"""Quantized Hugging Face weights read as the float weights they stand for, block by block.

A quantized weight (`Quantized`: its kind, its stored parts, its shape in Hugging Face's layout,
`<m>.weight [out, in]` or GPT-OSS's `experts.gate_up_proj [experts, in, out]`, found by
`ppl_jax.checkpoints.quantized_parts`) is read by block (`read`): a block is read as the rows,
words, groups and blocks of its parts that this block needs (a device's block of `q_proj` reads
its own columns of `qweight`, `scales` and `qzeros`, and its own rows of `g_idx`), and
dequantized by `ppl_jax.checkpoints.quantized`. `Dequantized` is the storage the mapping reads
through: so each process dequantizes only its own shard, and a quantized weight never passes
through a full-precision copy of the model. The mapping rules, the blocks and the cast to the
model's dtype are the same as for a float checkpoint.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import ml_dtypes
import numpy as np

from ppl_jax.checkpoints import quantized as q
from ppl_jax.checkpoints.storage import Storage
from ppl_jax.errors import CheckpointError


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


def _gptq(t: Quantized, storage: Storage, index: tuple[slice, ...]) -> np.ndarray:
    """GPTQ: `qweight [in * bits / 32, out]` packed along the input axis, `qzeros [groups,
    out * bits / 32]` along the output axis, `scales [groups, out]`, `g_idx [in]`."""
    rows, cols = _range(index, t.shape, 0), _range(index, t.shape, 1)  # out, in
    p, bits = t.parts, t.bits
    w0, w1, first = q.words_for(cols.start, cols.stop, bits, math.ceil(t.shape[1] * bits / 32))
    words = storage.read(p["qweight"], (slice(w0, w1), slice(rows.start, rows.stop)))
    codes = q.unpack(words, bits, 0)[cols.start - first : cols.stop - first]
    g, g0, g1 = _groups(t, storage, cols)
    z0, z1, zfirst = q.words_for(rows.start, rows.stop, bits, _zero_words(t))
    qz = np.asarray(storage.read(p["qzeros"], (slice(g0, g1), slice(z0, z1))))
    if t.v1:
        qz = q.gptq_v1_zeros(qz, bits)
    zeros = qz if (t.v1 and bits == 3) else q.unpack(qz, bits, 1)
    zeros = zeros[:, rows.start - zfirst : rows.stop - zfirst]
    scales = storage.read(p["scales"], (slice(g0, g1), slice(rows.start, rows.stop)))
    return q.grouped(codes, zeros, np.asarray(scales), g - g0).T


def _zero_words(t: Quantized) -> int:
    """The words of one row of zero points packed along the output axis."""
    return math.ceil(t.shape[-2] * t.bits / 32)


def _awq(t: Quantized, storage: Storage, index: tuple[slice, ...]) -> np.ndarray:
    rows, cols = _range(index, t.shape, 0), _range(index, t.shape, 1)  # out, in
    p = t.parts
    w0, w1 = rows.start // 8, math.ceil(rows.stop / 8)
    codes = q.awq_codes(np.asarray(storage.read(p["qweight"], (slice(cols.start, cols.stop),
                                                              slice(w0, w1)))))  # fmt: skip
    g = np.arange(cols.start, cols.stop) // t.group
    g0, g1 = int(g[0]), int(g[-1]) + 1
    zeros = q.awq_codes(np.asarray(storage.read(p["qzeros"], (slice(g0, g1), slice(w0, w1)))))
    scales = storage.read(p["scales"], (slice(g0, g1), slice(rows.start, rows.stop)))
    cut = slice(rows.start - 8 * w0, rows.stop - 8 * w0)
    return q.grouped(codes[:, cut], zeros[:, cut], np.asarray(scales), g - g0).T


def _blocked(t: Quantized, storage: Storage, role: str, index: tuple[slice, ...]) -> np.ndarray:
    """The scale (or zero point) entries of the block `index`, repeated to its shape: stored as
    `[..., ceil(rows / bh), ceil(cols / bw)]` over `t.block`, or as one value."""
    name = t.parts[role]
    if t.scalar >= 0:
        return np.asarray(storage.read(name, (slice(0, 1),) * t.scalar)).reshape(())
    rows, cols = _range(index, t.shape, -2), _range(index, t.shape, -1)
    (bh, bw), lead = t.block, index[:-2]
    r0, c0 = rows.start // bh, cols.start // bw
    at = lead + (slice(r0, (rows.stop - 1) // bh + 1), slice(c0, (cols.stop - 1) // bw + 1))
    s = np.asarray(storage.read(name, at))
    return q.expand(q.expand(s, -2, rows, bh, r0), -1, cols, bw, c0)


def _scaled(t: Quantized, storage: Storage, index: tuple[slice, ...]) -> np.ndarray:
    values = np.asarray(storage.read(t.parts["values"], index))
    scale = _blocked(t, storage, "scale", index)
    zero = _blocked(t, storage, "zero", index) if "zero" in t.parts else None
    return q.scaled(values, scale, zero, np.dtype(_NP[t.dtype]))


def _packed(t: Quantized, storage: Storage, index: tuple[slice, ...]) -> np.ndarray:
    """compressed-tensors' `pack-quantized`: `weight_packed [out, in * bits / 32]`, codes minus
    2 ** (bits - 1) (its `unpack_from_int32`); `weight_scale` per group (or by
    `weight_g_idx`), channel or tensor; zero points packed along the output axis (group and
    channel strategies since compressed-tensors 0.10: `weight_zero_point [out * bits / 32,
    groups]`), or stored as they are (the scale's shape; one value per tensor)."""
    rows, cols = _range(index, t.shape, 0), _range(index, t.shape, 1)
    p, bits, offset = t.parts, t.bits, 1 << (t.bits - 1)
    words = math.ceil(t.shape[1] * bits / 32)
    w0, w1, first = q.words_for(cols.start, cols.stop, bits, words)
    packed = storage.read(p["packed"], (slice(rows.start, rows.stop), slice(w0, w1)))
    codes = q.unpack(packed, bits, 1)[:, cols.start - first : cols.stop - first] - offset
    if "g_idx" in p:
        g, g0, g1 = _groups(t, storage, cols)
        at = (slice(rows.start, rows.stop), slice(g0, g1))
        scale = np.asarray(storage.read(p["scale"], at))[:, g - g0]
        if "zero" not in p:
            return q.scaled(codes, scale)
        if t.packed_zero:
            return q.scaled(codes, scale, _zeros(t, storage, rows, at[1])[:, g - g0])
        return q.scaled(codes, scale, np.asarray(storage.read(p["zero"], at))[:, g - g0])
    scale = _blocked(t, storage, "scale", index)
    if "zero" not in p:
        return q.scaled(codes, scale)
    if not t.packed_zero:
        return q.scaled(codes, scale, _blocked(t, storage, "zero", index))
    bw = t.block[1]
    c0 = cols.start // bw
    zero = _zeros(t, storage, rows, slice(c0, (cols.stop - 1) // bw + 1))
    return q.scaled(codes, scale, q.expand(zero, 1, cols, bw, c0))


def _zeros(t: Quantized, storage: Storage, rows: range, groups: slice) -> np.ndarray:
    """compressed-tensors' zero points of `rows` and `groups`, unpacked from the words they
    are packed in along the output axis, minus 2 ** (bits - 1)."""
    z0, z1, first = q.words_for(rows.start, rows.stop, t.bits, _zero_words(t))
    z = np.asarray(storage.read(t.parts["zero"], (slice(z0, z1), groups)))
    return q.unpack(z, t.bits, 0)[rows.start - first : rows.stop - first] - (1 << (t.bits - 1))


def _mxfp4(t: Quantized, storage: Storage, index: tuple[slice, ...]) -> np.ndarray:
    """GPT-OSS's experts `[experts, in, out]` from `blocks [experts, out, in / 32, 16]` and
    `scales [experts, out, in / 32]` (transformers' `convert_moe_packed_tensors` ends with
    `.transpose(1, 2)`)."""
    experts, cols, rows = (_range(index, t.shape, a) for a in range(3))  # in = cols
    b0, b1 = cols.start // 32, (cols.stop - 1) // 32 + 1
    at = (slice(experts.start, experts.stop), slice(rows.start, rows.stop), slice(b0, b1))
    blocks = np.asarray(storage.read(t.parts["blocks"], at + (slice(0, 16),)))
    scales = np.asarray(storage.read(t.parts["scales"], at))
    values = q.mxfp4(blocks, scales)[:, :, cols.start - 32 * b0 : cols.stop - 32 * b0]
    return np.swapaxes(values, 1, 2)


_READERS: dict[str, Callable] = {
    "gptq": _gptq, "awq": _awq, "scaled": _scaled, "packed": _packed, "mxfp4": _mxfp4,
}  # fmt: skip
_NP = {"F32": np.float32, "F16": np.float16, "BF16": ml_dtypes.bfloat16}


class Dequantized:
    """A `ppl_jax.checkpoints.storage.Storage` over another: the quantized weights
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
