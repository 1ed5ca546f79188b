"""AWQ (`quant_method` `awq`), autoawq's GEMM layout (`version` `gemm`), 4 bits:
`<m>.qweight [in, out / 8]` and `<m>.qzeros [groups, out / 8]` in AWQ's order, `<m>.scales
[groups, out]` -> `<m>.weight [out, in]`.

On the device (`AWQ.device_parts`) the codes are repacked along the input axis, GPTQ's layout:
`qweight [ceil(in / 8), out]`, `qzeros [groups, out]` uint8, `scales [groups, out]`; the output
axis of each is its last.
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
    fail,
    group_size,
    whole,
)
from ppl_jax.checkpoints.quantized.packing import (
    grouped,
    grouped_on_device,
    in_range,
    pack,
    read_whole,
    slabs,
)
from ppl_jax.errors import quoted

# AWQ's order of 8 codes in a word: stored position k holds code [0, 2, 4, 6, 1, 3, 5, 7][k]
# (autoawq `WQLinear_GEMM.from_linear`'s order_map); unpacking takes code j from stored position
# AWQ_REVERSE[j] (autoawq `AWQ_REVERSE_ORDER`).
AWQ_REVERSE = (0, 4, 1, 5, 2, 6, 3, 7)


def awq_codes(words: np.ndarray) -> np.ndarray:
    """AWQ's 4-bit codes of `words [rows, n]` in their true order, `[rows, 8 n]` (autoawq
    `unpack_awq` then `reverse_awq_order`)."""
    w = np.asarray(words).view(np.uint32)
    codes = np.empty(w.shape + (8,), np.uint8)
    for j, k in enumerate(AWQ_REVERSE):  # code j from stored position k: bits 4k to 4k + 3
        np.bitwise_and(w >> np.uint32(4 * k), 15, out=codes[..., j], casting="unsafe")
    return codes.reshape(w.shape[:-1] + (-1,))


class AWQ(Method):
    """AWQ, GEMM layout (see the module docstring)."""

    name = "awq"

    def parse(self, q: dict, where: str) -> Scheme:
        bits = whole(q, ("bits", "w_bit"), 4, where)
        if bits != 4:
            raise fail(
                where, f"has AWQ bits={bits}; ppl_jax reads 4-bit AWQ (autoawq's GEMM layout)"
            )
        version = str(q.get("version") or "gemm").lower()
        if version != "gemm":
            raise fail(
                where,
                f"has the AWQ version {quoted(q.get('version'), 40)}, a kernel's layout that "
                f"ppl_jax does not read (it reads gemm)",
            )
        size = group_size(q, ("group_size", "q_group_size"), where)
        w = Weights(4, "int", not q.get("zero_point", True), "group", size)
        return Scheme("awq", "gemm", (w,))

    def parts(self, found: Finder, name: str):
        if not name.endswith(".qweight"):
            return None
        head, w = name[: -len("qweight")], found.scheme.weights
        target = head + "weight"
        width, words = found.part(name, target, ("I32",), 2)
        scales = found.part(head + "scales", target, FLOATS, 2)
        qzeros = found.part(head + "qzeros", target, ("I32",), 2)
        out = scales[1]
        groups = math.ceil(width / w.group_size) if w.group_size else 1
        found.expect(name, (width, words), (width, math.ceil(out / 8)), f"{out} columns of scales")
        found.expect(head + "scales", scales, (groups, out),
                     f"{width} rows in groups of {w.group_size or width}")  # fmt: skip
        found.expect(head + "qzeros", qzeros, (groups, words), f"{groups} groups of {out} columns")
        parts = {"qweight": name, "qzeros": head + "qzeros", "scales": head + "scales"}
        return target, Quantized("awq", parts, (out, width), found.stored[head + "scales"][1], 4,
                                 group=w.group_size or width, groups=groups)  # fmt: skip

    def read(self, t: Quantized, storage: Storage, index: tuple[slice, ...]) -> np.ndarray:
        """AWQ: `qweight [in, out / 8]` and `qzeros [groups, out / 8]` in AWQ's order, `scales
        [groups, out]`; the block dequantized by slabs of input rows."""
        rows, cols = in_range(index, t.shape, 0), in_range(index, t.shape, 1)  # out, in
        p = t.parts
        w0, w1 = rows.start // 8, math.ceil(rows.stop / 8)
        at_rows = slice(rows.start - 8 * w0, rows.stop - 8 * w0)
        words = np.asarray(
            storage.read(p["qweight"], (slice(cols.start, cols.stop), slice(w0, w1)))
        )
        g = np.arange(cols.start, cols.stop) // t.group
        g0, g1 = int(g[0]), int(g[-1]) + 1
        zeros = awq_codes(np.asarray(storage.read(p["qzeros"], (slice(g0, g1), slice(w0, w1)))))
        zeros = zeros[:, at_rows]
        scales = np.asarray(
            storage.read(p["scales"], (slice(g0, g1), slice(rows.start, rows.stop)))
        )
        out = np.empty((len(cols), len(rows)), scales.dtype)  # [in, out]: returned transposed
        for a, b in slabs(len(cols), 8 * (w1 - w0)):
            codes = awq_codes(words[a:b])[:, at_rows]
            out[a:b] = grouped(codes, zeros, scales, g[a:b] - g0)
        return out.T

    def device_parts(self, t: Quantized, storage: Storage) -> dict[str, np.ndarray]:
        """`qweight [ceil(in / 8), out]` uint32: the codes in their true order repacked along
        the input axis (GPTQ's layout, `packing.pack`), so that the output axis is a plain one;
        `qzeros [groups, out]` uint8 in their true order; `scales [groups, out]` as stored."""
        out, width = t.shape
        words = math.ceil(out / 8)
        got = read_whole(storage, t, {"qweight": (width, words), "qzeros": (t.groups, words),
                                      "scales": (t.groups, out)})  # fmt: skip
        got["qweight"] = pack(awq_codes(got["qweight"])[:, :out], 4, 0)
        got["qzeros"] = np.ascontiguousarray(awq_codes(got["qzeros"])[:, :out])
        return got

    def out_axes(self, t: Quantized) -> dict[str, int]:
        return {"qweight": 1, "qzeros": 1, "scales": 1}

    def dequantize_on_device(self, t: Quantized, parts: dict[str, jax.Array]) -> jax.Array:
        """`(codes - zeros[g]) * scales[g]`, `g` = input row // group size, as `read`
        (`packing.grouped_on_device`)."""
        return grouped_on_device(t, parts)


METHOD = AWQ()
