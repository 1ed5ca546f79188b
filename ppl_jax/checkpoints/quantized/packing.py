"""The dequantization formulas of quantized Hugging Face weights, one function per layout, in
NumPy, on the stored regions a block of the weight needs (`ppl_jax.checkpoints.formats.dequantizing`
says which regions those are).

Each function gives the weight as its format's reference computes it: the exact product of the
codes and their scale (exact in float32 for every layout here), rounded once to the dtype that
reference computes in (the scales' dtype for GPTQ, AWQ and compressed-tensors' integer and FP8
layouts; float32 for DeepSeek's block FP8 and for MXFP4). The caller then casts it to the
model's dtype. The sources each function follows are named in its docstring.

Packed integers (GPTQ, AWQ, compressed-tensors' `pack-quantized`) are unsigned codes of `bits`
bits in little-endian 32-bit words; 32 consecutive codes fill `bits` words, code `i` starting
at bit `i * bits` of that run (for 2, 4 and 8 bits: `32 / bits` codes a word, the first in the
lowest bits; for 3 bits a code may straddle two words). That is GPTQ's packing (gptqmodel
`PackableQuantLinear.pack_original`, AutoGPTQ before it) and compressed-tensors' `pack_to_int32`
alike.
"""

from __future__ import annotations

import math

import numpy as np

# AWQ's order of 8 codes in a word: stored position k holds code [0, 2, 4, 6, 1, 3, 5, 7][k]
# (autoawq `WQLinear_GEMM.from_linear`'s order_map); unpacking takes code j from stored position
# AWQ_REVERSE[j] (autoawq `AWQ_REVERSE_ORDER`).
AWQ_REVERSE = (0, 4, 1, 5, 2, 6, 3, 7)
# E2M1 values by code (sign bit 3), OCP Microscaling Formats v1.0 Table 5; transformers'
# `integrations/mxfp4.FP4_VALUES`.
E2M1 = np.array(
    [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0],
    np.float32,
)
E8M0_BIAS = 127


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


def gptq_v1_zeros(qzeros: np.ndarray, bits: int) -> np.ndarray:
    """GPTQ's v1 zero points made v2 (what they mean): v1 checkpoints store each zero point
    minus one. As gptqmodel reads them (`convert_gptq_v1_to_v2_format_module`, the kernel
    transformers runs): for 2, 4 and 8 bits each 32-bit word plus 0x55555555, 0x11111111 or
    0x01010101 (modulo 2**32, the inverse of the word subtraction gptqmodel saves v1 with, a
    zero point of 0 borrowing from the next); for 3 bits, each unpacked code plus one modulo 8.
    Returns packed words for 2, 4 and 8 bits, and unpacked codes (along axis 1) for 3."""
    if bits == 3:
        return (unpack(qzeros, 3, axis=1) + 1) & 7
    ones = {2: 0x55555555, 4: 0x11111111, 8: 0x01010101}[bits]
    return (qzeros.view(np.uint32).astype(np.uint64) + ones).astype(np.uint32)


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


def awq_codes(words: np.ndarray) -> np.ndarray:
    """AWQ's 4-bit codes of `words [rows, n]` in their true order, `[rows, 8 n]` (autoawq
    `unpack_awq` then `reverse_awq_order`)."""
    codes = unpack(words, 4, axis=1)
    order = (np.arange(codes.shape[1]) // 8) * 8 + np.tile(AWQ_REVERSE, codes.shape[1] // 8)
    return codes[:, order]


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


def mxfp4(blocks: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """MXFP4 values `[..., rows, 32 G]` float32 of `blocks [..., rows, G, 16]` uint8 (two E2M1
    codes a byte, the low nibble first) and `scales [..., rows, G]` uint8 (E8M0: the scale is
    `2 ** (s - 127)`): `E2M1[code] * 2 ** (s - 127)` (OCP Microscaling Formats v1.0;
    transformers `integrations/mxfp4._convert_moe_packed_tensors`: `lut[blk & 0x0F]`,
    `lut[blk >> 4]` interleaved, then `torch.ldexp` by `scales - 127`)."""
    codes = np.stack([blocks & 0x0F, blocks >> 4], axis=-1)  # [..., G, 16, 2]
    values = E2M1[codes].reshape(blocks.shape[:-1] + (32,))
    exp = scales.astype(np.int32) - E8M0_BIAS
    out = np.ldexp(values, exp[..., None]).astype(np.float32)
    return out.reshape(out.shape[:-2] + (out.shape[-2] * 32,))
