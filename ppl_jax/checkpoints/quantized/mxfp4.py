"""MXFP4 (`quant_method` `mxfp4`, GPT-OSS's experts): `<x>_blocks [experts, out, in / 32, 16]`
uint8 (two E2M1 codes a byte, the low nibble first) and `<x>_scales [experts, out, in / 32]`
uint8 (E8M0) -> `<x> [experts, in, out]` float32. On the device (`MXFP4.device_parts`) the
parts are as stored; the output axis of each is its second.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from ppl_jax.checkpoints.mapping.storage import Storage
from ppl_jax.checkpoints.quantized.base import Finder, Method, Quantized, Scheme, Weights
from ppl_jax.checkpoints.quantized.packing import in_range, read_whole, slabs

# E2M1 values by code (sign bit 3), OCP Microscaling Formats v1.0 Table 5; transformers'
# `integrations/mxfp4.FP4_VALUES`.
E2M1 = np.array(
    [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0],
    np.float32,
)
E8M0_BIAS = 127


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


class MXFP4(Method):
    """GPT-OSS's MXFP4 experts (see the module docstring)."""

    name = "mxfp4"

    def parse(self, q: dict, where: str) -> Scheme:
        w = Weights(4, "float", True, "group", 32, None, "mxfp4")
        return Scheme("mxfp4", "mxfp4", (w,))

    def parts(self, found: Finder, name: str):
        if not name.endswith("_blocks"):
            return None
        target = name[: -len("_blocks")]
        blocks = found.part(name, target, ("U8",), 4)
        scales = found.part(target + "_scales", target, ("U8",), 3)
        if blocks[-1] != 16:
            raise found.bad(name, "MXFP4 blocks hold 16 bytes (32 values)")
        found.expect(target + "_scales", scales, blocks[:-1], "one scale per block of 32")
        experts, rows, count = blocks[:3]
        parts = {"blocks": name, "scales": target + "_scales"}
        return target, Quantized("mxfp4", parts, (experts, count * 32, rows), "F32", 4)

    def read(self, t: Quantized, storage: Storage, index: tuple[slice, ...]) -> np.ndarray:
        """GPT-OSS's experts `[experts, in, out]` from `blocks [experts, out, in / 32, 16]` and
        `scales [experts, out, in / 32]` (transformers' `convert_moe_packed_tensors` ends with
        `.transpose(1, 2)`); by slabs of output rows."""
        experts, cols, rows = (in_range(index, t.shape, a) for a in range(3))  # in = cols
        b0, b1 = cols.start // 32, (cols.stop - 1) // 32 + 1
        at = (slice(experts.start, experts.stop), slice(rows.start, rows.stop), slice(b0, b1))
        blocks = np.asarray(storage.read(t.parts["blocks"], at + (slice(0, 16),)))
        scales = np.asarray(storage.read(t.parts["scales"], at))
        out = np.empty((len(experts), len(cols), len(rows)), np.float32)
        for a, b in slabs(len(rows), len(experts) * 32 * (b1 - b0)):
            values = mxfp4(blocks[:, a:b], scales[:, a:b])
            out[:, :, a:b] = np.swapaxes(
                values[:, :, cols.start - 32 * b0 : cols.stop - 32 * b0], 1, 2
            )
        return out

    def device_parts(self, t: Quantized, storage: Storage) -> dict[str, np.ndarray]:
        """`blocks [experts, out, in / 32, 16]` and `scales [experts, out, in / 32]` uint8, as
        stored."""
        experts, width, out = t.shape
        return read_whole(storage, t, {"blocks": (experts, out, width // 32, 16),
                                       "scales": (experts, out, width // 32)})  # fmt: skip

    def out_axes(self, t: Quantized) -> dict[str, int]:
        return {"blocks": 1, "scales": 1}

    def dequantize_on_device(self, t: Quantized, parts: dict[str, jax.Array]) -> jax.Array:
        """`mxfp4` on the device, `[experts, in, out]` float32: each E2M1 value's float32 bits
        with `s - 127` added to their exponent (`ldexp_bits`), as `read`."""
        blocks, scales = parts["blocks"], parts["scales"]
        codes = jnp.stack([blocks & 0x0F, blocks >> 4], axis=-1)  # [e, out, G, 16, 2]
        bits = jnp.asarray(E2M1.view(np.uint32))[codes.astype(jnp.int32)]
        exp = scales.astype(jnp.int32) - E8M0_BIAS
        values = ldexp_bits(bits.reshape(blocks.shape[:-1] + (32,)), exp[..., None])
        values = lax.bitcast_convert_type(values, jnp.float32)
        return jnp.swapaxes(values.reshape(values.shape[:-2] + (-1,)), 1, 2)


def ldexp_bits(bits: jax.Array, exp: jax.Array) -> jax.Array:
    """`np.ldexp(x, exp)` on float32 bits (uint32; `x` zero or normal), as uint32 bits, in
    integer arithmetic: the exponent field plus `exp`; infinity past the largest exponent;
    below the smallest, the significand shifted right and rounded to nearest, ties to even
    (IEEE 754's subnormals, which XLA on CPU would flush to zero in a float multiply)."""
    top, inf = np.uint32(0x80000000), np.uint32(0x7F800000)
    sign, mag = bits & top, bits & ~top
    field = (mag >> 23).astype(jnp.int32) + exp  # the result's biased exponent
    normal = sign | (jnp.clip(field, 1, 254).astype(jnp.uint32) << 23) | (mag & 0x7FFFFF)
    sig = (mag & 0x7FFFFF) | 0x800000
    shift = jnp.clip(1 - field, 1, 25).astype(jnp.uint32)
    q, rest, half = sig >> shift, sig & ((1 << shift) - 1), 1 << (shift - 1)
    q = q + ((rest > half) | ((rest == half) & ((q & 1) == 1))).astype(jnp.uint32)
    out = jnp.where(field >= 255, sign | inf, jnp.where(field >= 1, normal, sign | q))
    return jnp.where(mag == 0, bits, out)


METHOD = MXFP4()
