"""Block FP8 (`quant_method` `fp8`, DeepSeek-V3): `<x>` stored as float8_e4m3fn with
`<x>_scale_inv` float32 per block of `weight_block_size` (`[ceil(out / bm), ceil(in / bn)]`) or
per tensor -> `<x>`, the product in float32. On the device (`FP8.device_parts`) the block
scales are repeated to one row per output row, so that the output axis is a plain one.
"""

from __future__ import annotations

import math

import jax
import numpy as np

from ppl_jax.checkpoints.mapping.storage import Storage
from ppl_jax.checkpoints.quantized.base import (
    FLOATS,
    Finder,
    Method,
    Quantized,
    Scheme,
    Weights,
    block_shape,
    fail,
)
from ppl_jax.checkpoints.quantized.packing import (
    read_scaled,
    scaled_on_device,
    scaled_out_axes,
    scaled_parts,
)
from ppl_jax.errors import quoted


class FP8(Method):
    """float8_e4m3fn weights times their inverse scales (see the module docstring)."""

    name = "fp8"

    def parse(self, q: dict, where: str) -> Scheme:
        fmt = q.get("fmt", "e4m3")
        if fmt != "e4m3":
            raise fail(
                where, f"has fmt={quoted(fmt, 40)}; ppl_jax reads float8_e4m3fn weights (e4m3)"
            )
        given = q.get("weight_block_size")
        block = None if given is None else block_shape(given)
        if given is not None and block is None:
            raise fail(where, f"has weight_block_size={quoted(given, 40)}, not two sizes")
        w = Weights(8, "float", True, "block" if block else "tensor", None, block, "float8_e4m3fn",
                    activation_bits=8)  # fmt: skip
        return Scheme("fp8", "float8_e4m3fn", (w,))

    def parts(self, found: Finder, name: str):
        if found.stored[name][1] != "F8_E4M3" or name + "_scale_inv" not in found.stored:
            return None
        shape = found.part(name, name, ("F8_E4M3",))
        if len(shape) < 2:
            raise found.bad(name, "a quantized weight has at least two dimensions")
        scale = found.part(name + "_scale_inv", name, FLOATS)
        block = found.scheme.weights.block
        if block is None:
            if math.prod(scale) != 1 or len(scale) > 1:
                raise found.bad(
                    name + "_scale_inv", "without weight_block_size one scale per tensor"
                )
            parts = {"values": name, "scale": name + "_scale_inv"}
            return name, Quantized(
                "scaled", parts, shape, "F32", 8, block=shape[-2:], scalar=len(scale)
            )
        want = shape[:-2] + tuple(math.ceil(n / b) for n, b in zip(shape[-2:], block, strict=True))
        found.expect(name + "_scale_inv", scale, want, f"blocks of {block[0]}x{block[1]}")
        parts = {"values": name, "scale": name + "_scale_inv"}
        return name, Quantized("scaled", parts, shape, "F32", 8, block=block)

    def read(self, t: Quantized, storage: Storage, index: tuple[slice, ...]) -> np.ndarray:
        """`weight.float() * scale_inv`, by slabs of rows (`packing.read_scaled`)."""
        return read_scaled(t, storage, index)

    def device_parts(self, t: Quantized, storage: Storage) -> dict[str, np.ndarray]:
        """`values [..., out, in]` float8_e4m3fn as stored; `scale [..., out, ceil(in / bn)]`
        float32, the block scales repeated to one row per output row, or `[]` per tensor
        (`packing.scaled_parts`)."""
        return scaled_parts(t, storage)

    def out_axes(self, t: Quantized) -> dict[str, int]:
        return scaled_out_axes(t)

    def dequantize_on_device(self, t: Quantized, parts: dict[str, jax.Array]) -> jax.Array:
        """`weight.float() * scale_inv` in float32, as `read` (`packing.scaled_on_device`)."""
        return scaled_on_device(t, parts)


METHOD = FP8()
