"""GGML: GGUF's packed blocks dequantized on the accelerator, in JAX, just before the matmul.

`dequantize(raw, type_name)` turns `[..., bytes_per_block] uint8` blocks into
`[..., values_per_block] float32` values, each block as llama.cpp's `ggml-quants.c`
(`dequantize_row_*`) and the `gguf` package's `quants.py` (`dequantize_blocks`) define it, and
equal to `gguf.quants.dequantize` bit for bit (tests/unit/test_ggml_device.py). The types it
handles are `DEVICE_TYPES`; the others (the IQ grids, TQ1_0, Q8_1, NVFP4, ...) stay on the host.

Why the result is exact whatever XLA does with the arithmetic: every block is `d * q` or
`d * q - m` with `d`, `m` float16 scales (11 significant bits) times small integers (at most 6
bits of sub-scale, 8 bits of quant), so each product has at most 24 significant bits and is
exact in float32, and no value is a float32 subnormal (all are multiples of 2 ** -24). Only the
one rounding of a final sum remains, so fusing `d * q + m` into an FMA (XLA on CPU does: measured,
`jit(a * b + c)` of random float32 equals the FMA's result, not NumPy's) or reordering the exact
products cannot change a bit; the order is still gguf-py's (`(d * sc) * q - dmin * m`). MXFP4 is the exception: its E8M0 scale reaches `2 ** -128`, whose
products are float32 subnormals that XLA on CPU flushes to zero (measured: `jit(x * 3)` of
`2 ** -128` is 0 on CPU), so its products are built on the bits (`_mxfp4`), exactly.

Only integer ops and bitcasts read the fields (nibbles by `right_shift`/`bitwise_and`, float16
and bfloat16 by `lax.bitcast_convert_type`); a NaN float16 keeps its payload as NumPy keeps it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import gguf
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from ppl_jax.errors import CheckpointError

BLOCKS: dict[str, tuple[int, int]] = {
    kind.name: (int(values), int(size)) for kind, (values, size) in gguf.GGML_QUANT_SIZES.items()
}
"""GGML type name -> (values per block, bytes per block), from `gguf.GGML_QUANT_SIZES`."""

# The non-linear 4-bit grid of IQ4_NL and IQ4_XS (ggml-common.h `kvalues_iq4nl`).
IQ4_GRID = np.array(
    [-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], np.int8
)
# E2M1 values by code, doubled (OCP Microscaling Formats v1.0 Table 5; ggml-common.h
# `kvalues_mxfp4`, which pairs them with a scale of half the E8M0 one). The code 8 (-0) is the
# integer 0, so it dequantizes to +0 as llama.cpp's does.
E2M1_DOUBLED = np.array([0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12], np.int8)


def _u16(raw: jax.Array, at: int) -> jax.Array:
    """The little-endian uint16 at byte `at` of each block: `[..., 1]` uint16."""
    lo = raw[..., at : at + 1].astype(jnp.uint16)
    return lo | (raw[..., at + 1 : at + 2].astype(jnp.uint16) << 8)


def _f16(raw: jax.Array, at: int) -> jax.Array:
    """The float16 at byte `at` of each block as float32, `[..., 1]`; a NaN keeps its payload
    unquieted, as NumPy's `astype` does (XLA's conversion would set the quiet bit)."""
    h = _u16(raw, at)
    value = lax.bitcast_convert_type(h, jnp.float16).astype(jnp.float32)
    h32 = h.astype(jnp.uint32)
    nan = ((h32 & 0x7C00) == 0x7C00) & ((h32 & 0x03FF) != 0)
    bits = ((h32 & 0x8000) << 16) | 0x7F800000 | ((h32 & 0x03FF) << 13)
    return jnp.where(nan, lax.bitcast_convert_type(bits, jnp.float32), value)


def _fields(x: jax.Array, groups: int, width: int) -> jax.Array:
    """The `width`-bit fields of `x [..., n]` uint8 cut into `groups` runs of bytes: run by run,
    the lowest field of every byte of the run, then the next, ... -> `[..., n * 8 / width]` uint8
    (GGML's packing: e.g. Q4_0's 16 low nibbles are values 0-15, its high nibbles 16-31)."""
    runs = x.reshape(x.shape[:-1] + (groups, x.shape[-1] // groups))
    shifts = jnp.arange(0, 8, width, dtype=jnp.uint8)[:, None]
    out = (runs[..., None, :] >> shifts) & np.uint8((1 << width) - 1)
    return out.reshape(x.shape[:-1] + (x.shape[-1] * 8 // width,))


def _float(x: jax.Array) -> jax.Array:
    return x.astype(jnp.float32)


def _grouped(x: jax.Array, groups: int) -> jax.Array:
    """`[..., n]` -> `[..., groups, n / groups]`, one row per sub-block."""
    return x.reshape(x.shape[:-1] + (groups, x.shape[-1] // groups))


def _flat(x: jax.Array) -> jax.Array:
    return x.reshape(x.shape[:-2] + (x.shape[-2] * x.shape[-1],))


def _int8(x: jax.Array) -> jax.Array:
    return lax.bitcast_convert_type(x, jnp.int8)


def _f32(raw: jax.Array) -> jax.Array:
    b = raw.astype(jnp.uint32)
    bits = b[..., 0:1] | (b[..., 1:2] << 8) | (b[..., 2:3] << 16) | (b[..., 3:4] << 24)
    return lax.bitcast_convert_type(bits, jnp.float32)


def _bf16(raw: jax.Array) -> jax.Array:
    return lax.bitcast_convert_type(_u16(raw, 0).astype(jnp.uint32) << 16, jnp.float32)


def _q4_0(raw: jax.Array) -> jax.Array:
    """d: f16 | 16 bytes of nibbles; `d * (q - 8)`."""
    q = _fields(raw[..., 2:], 1, 4).astype(jnp.int32) - 8
    return _f16(raw, 0) * _float(q)


def _q4_1(raw: jax.Array) -> jax.Array:
    """d: f16 | m: f16 | 16 bytes of nibbles; `(d * q) + m`."""
    return (_f16(raw, 0) * _float(_fields(raw[..., 4:], 1, 4))) + _f16(raw, 2)


def _fifth_bit(low: jax.Array, qh: jax.Array) -> jax.Array:
    """Q5_0/Q5_1's 5-bit quants: `low` nibbles `[..., 32]`, bit j of the uint32 `qh [..., 4]` (its
    bytes little-endian) the fifth bit of value j."""
    return low | (_fields(qh, 4, 1) << 4)


def _q5_0(raw: jax.Array) -> jax.Array:
    """d: f16 | qh: 4 bytes | 16 bytes of nibbles; `d * (q - 16)`."""
    q = _fifth_bit(_fields(raw[..., 6:], 1, 4), raw[..., 2:6]).astype(jnp.int32) - 16
    return _f16(raw, 0) * _float(q)


def _q5_1(raw: jax.Array) -> jax.Array:
    """d: f16 | m: f16 | qh: 4 bytes | 16 bytes of nibbles; `(d * q) + m`."""
    q = _fifth_bit(_fields(raw[..., 8:], 1, 4), raw[..., 4:8])
    return (_f16(raw, 0) * _float(q)) + _f16(raw, 2)


def _q8_0(raw: jax.Array) -> jax.Array:
    """d: f16 | 32 int8; `q * d`."""
    return _float(_int8(raw[..., 2:])) * _f16(raw, 0)


def _q2_k(raw: jax.Array) -> jax.Array:
    """scales: 16 bytes (low nibble the sub-scale, high the sub-min) | 64 bytes of 2-bit quants
    | d: f16 | dmin: f16; per 16 values `(d * sc) * q - (dmin * m)`."""
    scales = raw[..., 0:16]
    dl = (_f16(raw, 80) * _float(scales & np.uint8(0x0F)))[..., None]
    ml = (_f16(raw, 82) * _float(scales >> 4))[..., None]
    q = _grouped(_float(_fields(raw[..., 16:80], 2, 2)), 16)
    return _flat(dl * q - ml)


def _q3_k(raw: jax.Array) -> jax.Array:
    """hmask: 32 bytes | 64 bytes of 2-bit quants | scales: 12 bytes (16 6-bit, the low 4 bits
    in nibbles of bytes 0-7, the high 2 in 2-bit fields of bytes 8-11) | d: f16; per 16 values
    `(d * (sc - 32)) * q`, with `q = low - 4` where the hmask bit is 0."""
    scales = raw[..., 96:108]
    sc = _fields(scales[..., 0:8], 1, 4) | (_fields(scales[..., 8:12], 1, 2) << 4)
    dl = (_f16(raw, 108) * _float(sc.astype(jnp.int32) - 32))[..., None]
    low = _fields(raw[..., 32:96], 2, 2).astype(jnp.int32)
    high = _fields(raw[..., 0:32], 1, 1).astype(jnp.int32)
    q = low - ((high ^ 1) << 2)
    return _flat(dl * _grouped(_float(q), 16))


def _scale_min_k4(scales: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Q4_K/Q5_K's 12 bytes of eight 6-bit sub-scales and sub-mins (`get_scale_min_k4`):
    `([..., 8], [..., 8])` uint8."""
    d, m, md = scales[..., 0:4], scales[..., 4:8], scales[..., 8:12]
    sc = jnp.concatenate([d & 0x3F, (md & 0x0F) | ((d >> 2) & 0x30)], axis=-1)
    mn = jnp.concatenate([m & 0x3F, (md >> 4) | ((m >> 2) & 0x30)], axis=-1)
    return sc, mn


def _k4(raw: jax.Array, q: jax.Array) -> jax.Array:
    """Q4_K/Q5_K from their quants `q [..., 256]`: per 32 values `(d * sc) * q - (dmin * m)`."""
    sc, mn = _scale_min_k4(raw[..., 4:16])
    d = (_f16(raw, 0) * _float(sc))[..., None]
    dm = (_f16(raw, 2) * _float(mn))[..., None]
    return _flat(d * _grouped(_float(q), 8) - dm)


def _q4_k(raw: jax.Array) -> jax.Array:
    """d: f16 | dmin: f16 | scales: 12 bytes | 128 bytes of nibbles (32 bytes per 64 values)."""
    return _k4(raw, _fields(raw[..., 16:144], 4, 4))


def _q5_k(raw: jax.Array) -> jax.Array:
    """d: f16 | dmin: f16 | scales: 12 bytes | qh: 32 bytes | 128 bytes of nibbles."""
    return _k4(raw, _fields(raw[..., 48:176], 4, 4) | (_fields(raw[..., 16:48], 1, 1) << 4))


def _q6_k(raw: jax.Array) -> jax.Array:
    """ql: 128 bytes of nibbles | qh: 64 bytes of 2-bit fields | scales: 16 int8 | d: f16; per
    16 values `(d * sc) * (q - 32)`."""
    q = _fields(raw[..., 0:128], 2, 4) | (_fields(raw[..., 128:192], 2, 2) << 4)
    d = (_f16(raw, 208) * _float(_int8(raw[..., 192:208])))[..., None]
    return _flat(d * _grouped(_float(q.astype(jnp.int32) - 32), 16))


def _tq2_0(raw: jax.Array) -> jax.Array:
    """64 bytes of 2-bit quants | d: f16; `d * (q - 1)`."""
    q = _fields(raw[..., 0:64], 2, 2).astype(jnp.int32) - 1
    return _f16(raw, 64) * _float(q)


def _grid(table: np.ndarray, codes: jax.Array) -> jax.Array:
    return jnp.take(jnp.asarray(table), codes.astype(jnp.int32), mode="clip")


def _iq4_nl(raw: jax.Array) -> jax.Array:
    """d: f16 | 16 bytes of nibbles indexing `IQ4_GRID`; `d * grid[q]`."""
    return _f16(raw, 0) * _float(_grid(IQ4_GRID, _fields(raw[..., 2:], 1, 4)))


def _iq4_xs(raw: jax.Array) -> jax.Array:
    """d: f16 | scales_h: 2 bytes | scales_l: 4 bytes | 128 bytes of nibbles indexing `IQ4_GRID`;
    per 32 values `(d * (sc - 32)) * grid[q]`, `sc` 6 bits (low nibble from scales_l, high 2
    bits from the uint16 scales_h)."""
    sc = _fields(raw[..., 4:8], 4, 4) | (_fields(raw[..., 2:4], 2, 2) << 4)
    dl = (_f16(raw, 0) * _float(sc.astype(jnp.int32) - 32))[..., None]
    q = _grid(IQ4_GRID, _fields(raw[..., 8:136], 8, 4))
    return _flat(dl * _grouped(_float(q), 8))


def _mxfp4(raw: jax.Array) -> jax.Array:
    """e: E8M0 | 16 bytes of E2M1 nibbles; `2 ** (e - 128) * E2M1_DOUBLED[q]` (llama.cpp's
    `ggml_e8m0_to_fp32_half` times `kvalues_mxfp4`). The product is exact, so it is built on the
    float32 bits: the value's exponent raised by `e - 128`, a subnormal where it falls below
    2 ** -126 (which XLA on CPU would flush to zero), infinity past the largest float32."""
    values = _float(_grid(E2M1_DOUBLED, _fields(raw[..., 1:17], 1, 4)))
    bits = lax.bitcast_convert_type(values, jnp.uint32)
    sign, mag = bits & np.uint32(0x80000000), bits & np.uint32(0x7FFFFFFF)
    exp = (mag >> 23).astype(jnp.int32) + raw[..., 0:1].astype(jnp.int32) - 128
    significand = (mag & np.uint32(0x007FFFFF)) | np.uint32(0x00800000)
    normal = (exp.astype(jnp.uint32) << 23) | (mag & np.uint32(0x007FFFFF))
    subnormal = significand >> jnp.clip(1 - exp, 0, 31).astype(jnp.uint32)
    out = jnp.where(exp >= 255, np.uint32(0x7F800000), jnp.where(exp >= 1, normal, subnormal))
    out = jnp.where(mag == 0, np.uint32(0), out)
    return lax.bitcast_convert_type(sign | out, jnp.float32)


_DEQUANTIZE: dict[str, Callable[[jax.Array], jax.Array]] = {
    "F32": _f32,
    "F16": lambda raw: _f16(raw, 0),
    "BF16": _bf16,
    "Q4_0": _q4_0,
    "Q4_1": _q4_1,
    "Q5_0": _q5_0,
    "Q5_1": _q5_1,
    "Q8_0": _q8_0,
    "Q2_K": _q2_k,
    "Q3_K": _q3_k,
    "Q4_K": _q4_k,
    "Q5_K": _q5_k,
    "Q6_K": _q6_k,
    "TQ2_0": _tq2_0,
    "IQ4_NL": _iq4_nl,
    "IQ4_XS": _iq4_xs,
    "MXFP4": _mxfp4,
}

DEVICE_TYPES: frozenset[str] = frozenset(_DEQUANTIZE)
"""The GGML types `dequantize` handles; the others are dequantized on the host by `gguf`."""


@functools.partial(jax.jit, static_argnames="type_name")
def dequantize(raw: jax.Array, type_name: str) -> jax.Array:
    """`raw [..., bytes_per_block]` uint8 -> `[..., values_per_block]` float32: each block of the
    GGML type `type_name` (a key of `BLOCKS`, e.g. "Q4_K") dequantized as llama.cpp's
    ggml-quants.c (`dequantize_row_*`) and the `gguf` package's `quants.py` define it, equal bit
    for bit to `gguf.quants.dequantize` on the host. Any leading dims (`[rows, blocks, bpb]`,
    `[experts, rows, blocks, bpb]`); the float types have one value a block (`[..., 4]` F32,
    `[..., 2]` F16/BF16 -> `[..., 1]`). Jit-compiled with `type_name` static; elementwise, so
    XLA fuses it and nothing bigger than the output is built.

    Raises:
      CheckpointError: `type_name` is not in `DEVICE_TYPES` (naming the type and those handled).
      ValueError: `raw` is not uint8 or its last dim is not the type's bytes per block.
    """
    if type_name not in _DEQUANTIZE:
        raise CheckpointError(
            f"the GGML type {type_name!r} has no device dequantizer (those with one: "
            f"{', '.join(sorted(DEVICE_TYPES))}); dequantize it on the host with the gguf package."
        )
    values, size = BLOCKS[type_name]
    if raw.dtype != jnp.uint8 or raw.ndim < 1 or raw.shape[-1] != size:
        raise ValueError(
            f"{type_name} blocks are [..., {size}] uint8, not {list(raw.shape)} {raw.dtype}."
        )
    out = _DEQUANTIZE[type_name](raw)
    assert out.shape == raw.shape[:-1] + (values,) and out.dtype == jnp.float32
    return out
