"""GPTQ (`quant_method` `gptq`): packed `<m>.qweight [in * bits / 32, out]`, `<m>.qzeros
[groups, out * bits / 32]`, `<m>.scales [groups, out]` and (act-order) `<m>.g_idx [in]` ->
`<m>.weight [out, in]`; 2, 3, 4 or 8 bits, `checkpoint_format` `gptq` (zero points stored minus
one) or `gptq_v2`, as transformers 5.24 names them.

On the device (`GPTQ.device_parts`): `qweight` as stored, `qzeros` unpacked to uint8 `[groups,
out]` (v2), `scales` as stored, `g_idx` int32; the output axis of each is its last.
"""

from __future__ import annotations

import math

import jax
import numpy as np

from ppl_jax.checkpoints.mapping.storage import Storage
from ppl_jax.checkpoints.quantized.base import (
    FLOATS,
    INTS,
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
    column_groups,
    grouped,
    grouped_on_device,
    in_range,
    read_whole,
    slabs,
    unpack,
    words_for,
    zero_words,
)
from ppl_jax.errors import quoted


class GPTQ(Method):
    """GPTQ, `gptq` and `gptq_v2` (see the module docstring)."""

    name = "gptq"

    def parse(self, q: dict, where: str) -> Scheme:
        bits = whole(q, ("bits",), 4, where)
        if bits not in (2, 3, 4, 8):
            raise fail(where, f"has GPTQ bits={bits}, not one of 2, 3, 4, 8")
        fmt = q.get("checkpoint_format") or q.get("format") or "gptq"
        if fmt not in ("gptq", "gptq_v2"):
            raise fail(
                where,
                f"has the GPTQ checkpoint_format {quoted(fmt, 40)}, a kernel's layout that "
                f"ppl_jax does not read (it reads gptq and gptq_v2)",
                "save the model in the gptq format",
            )
        if q.get("dynamic"):
            raise fail(where, "has per-module overrides (dynamic), which ppl_jax does not read")
        if q.get("pack_dtype") not in (None, "int32", "torch.int32"):
            raise fail(
                where, f"has pack_dtype={quoted(q['pack_dtype'], 40)}; only int32 words are read"
            )
        sym = q.get("sym", True)
        w = Weights(bits, "int", bool(sym), "group", group_size(q, ("group_size",), where))
        return Scheme("gptq", fmt, (w,), act_order=bool(q.get("desc_act", False)))

    def parts(self, found: Finder, name: str):
        if not name.endswith(".qweight"):
            return None
        head, w = name[: -len("qweight")], found.scheme.weights
        bits, target = w.bits, head + "weight"
        words, out = found.part(name, target, ("I32",), 2)
        scales = found.part(head + "scales", target, FLOATS, 2)
        qzeros = found.part(head + "qzeros", target, ("I32",), 2)
        if (words * 32) % bits:
            raise found.bad(name, f"{bits}-bit codes do not fill its {words} words")
        width = words * 32 // bits
        g_idx = head + "g_idx"
        if g_idx in found.stored:
            (width,) = found.part(g_idx, target, INTS, 1)
            rows = f"the {width} rows of {found.shown(g_idx)!r} in {bits}-bit codes"
            found.expect(name, (words, out), (math.ceil(width * bits / 32), out), rows)
        groups = math.ceil(width / w.group_size) if w.group_size else 1  # act-order or not
        found.expect(head + "scales", scales, (groups, out),
                     f"{width} rows in groups of {w.group_size or width}")  # fmt: skip
        found.expect(head + "qzeros", qzeros, (groups, math.ceil(out * bits / 32)),
                     f"{groups} groups of {out} {bits}-bit zero points")  # fmt: skip
        parts = {"qweight": name, "qzeros": head + "qzeros", "scales": head + "scales"}
        if g_idx in found.stored:
            parts["g_idx"] = g_idx
        return target, Quantized(
            "gptq", parts, (out, width), found.stored[head + "scales"][1], bits,
            group=w.group_size or width, groups=groups, v1=found.scheme.format == "gptq",
        )  # fmt: skip

    def read(self, t: Quantized, storage: Storage, index: tuple[slice, ...]) -> np.ndarray:
        """GPTQ: `qweight [in * bits / 32, out]` packed along the input axis, `qzeros [groups,
        out * bits / 32]` along the output axis, `scales [groups, out]`, `g_idx [in]`; the block
        dequantized by runs of 32 input rows."""
        rows, cols = in_range(index, t.shape, 0), in_range(index, t.shape, 1)  # out, in
        p, bits = t.parts, t.bits
        w0, w1, first = words_for(cols.start, cols.stop, bits, math.ceil(t.shape[1] * bits / 32))
        words = np.asarray(
            storage.read(p["qweight"], (slice(w0, w1), slice(rows.start, rows.stop)))
        )
        g, g0, g1 = column_groups(t, storage, cols)
        z0, z1, zfirst = words_for(rows.start, rows.stop, bits, zero_words(t))
        qz = np.asarray(storage.read(p["qzeros"], (slice(g0, g1), slice(z0, z1))))
        if t.v1:
            qz = gptq_v1_zeros(qz, bits)
        zeros = qz if (t.v1 and bits == 3) else unpack(qz, bits, 1)
        zeros = zeros[:, rows.start - zfirst : rows.stop - zfirst]
        scales = np.asarray(
            storage.read(p["scales"], (slice(g0, g1), slice(rows.start, rows.stop)))
        )
        out = np.empty((len(cols), len(rows)), scales.dtype)  # [in, out]: returned transposed
        for a, b in slabs(w1 - w0, len(rows) * 32 // bits, bits):  # words: runs of 32 codes
            c0 = first + a * 32 // bits  # the slab's first code
            lo, hi = max(c0, cols.start), min(c0 + (b - a) * 32 // bits, cols.stop)
            if lo < hi:
                codes = unpack(words[a:b], bits, 0)[lo - c0 : hi - c0]
                at = slice(lo - cols.start, hi - cols.start)
                out[at] = grouped(codes, zeros, scales, g[at] - g0)
        return out.T  # a view: the mapping's transpose back to [in, out] makes it contiguous

    def device_parts(self, t: Quantized, storage: Storage) -> dict[str, np.ndarray]:
        """`qweight [ceil(in * bits / 32), out]` uint32 (the stored words), `qzeros [groups,
        out]` uint8 (unpacked, v1 made v2: `gptq_v1_zeros`), `scales [groups, out]` as stored,
        `g_idx [in]` int32 (checked against the groups) where stored."""
        (out, width), bits = t.shape, t.bits
        shapes = {"qweight": (math.ceil(width * bits / 32), out),
                  "qzeros": (t.groups, zero_words(t)), "scales": (t.groups, out)}  # fmt: skip
        got = read_whole(storage, t, shapes)
        qz = gptq_v1_zeros(got["qzeros"], bits) if t.v1 else got["qzeros"]
        zeros = qz if (t.v1 and bits == 3) else unpack(qz, bits, 1)
        got["qzeros"] = np.ascontiguousarray(zeros[:, :out], np.uint8)
        got["qweight"] = got["qweight"].view(np.uint32)
        if "g_idx" in t.parts:
            got["g_idx"] = column_groups(t, storage, range(width))[0].astype(np.int32)
        return got

    def out_axes(self, t: Quantized) -> dict[str, int]:
        return {"qweight": 1, "qzeros": 1, "scales": 1}

    def dequantize_on_device(self, t: Quantized, parts: dict[str, jax.Array]) -> jax.Array:
        """`(codes - zeros[g]) * scales[g]`, `g` each input row's group (`g_idx`, or row //
        group size), as `read` (`packing.grouped_on_device`)."""
        return grouped_on_device(t, parts)


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


METHOD = GPTQ()
