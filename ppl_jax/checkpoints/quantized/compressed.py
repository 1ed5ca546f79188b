"""compressed-tensors (`quant_method` `compressed-tensors`): `pack-quantized` (2, 4 or 8-bit
integers in int32 words: `<m>.weight_packed`, `<m>.weight_scale`, `<m>.weight_zero_point`,
`<m>.weight_g_idx`, `<m>.weight_shape` -> `<m>.weight`), `naive-quantized` and `int-quantized`
(`<m>.weight` int8), `float-quantized` (`<m>.weight` float8_e4m3fn), each with `<m>.weight_scale`
(and `<m>.weight_zero_point`) per tensor, channel, group or block; several config groups, each
module's by its `targets`.

On the device (`Compressed.device_parts`): `pack-quantized` keeps its words (packed along the
input axis), scales and `g_idx` as stored and its zero points unpacked, int8 `[out, groups]`;
the output axis of each is its first. The int8 and float8 values keep theirs
(`packing.scaled_parts`).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import re2

from ppl_jax.checkpoints.mapping.storage import Storage
from ppl_jax.checkpoints.quantized.base import (
    FLOATS,
    INTS,
    Finder,
    Method,
    Quantized,
    Scheme,
    Weights,
    block_shape,
    fail,
    whole,
)
from ppl_jax.checkpoints.quantized.packing import (
    NP,
    column_groups,
    compact,
    expand,
    in_range,
    product_on_device,
    read_scaled,
    read_whole,
    repeat_on_device,
    scaled,
    scaled_on_device,
    scaled_out_axes,
    scaled_parts,
    slabs,
    spread,
    unpack,
    unpack_on_device,
    words_for,
    zero_words,
)
from ppl_jax.errors import CheckpointError, quoted

FORMATS = ("pack-quantized", "naive-quantized", "int-quantized", "float-quantized")
STRATEGIES = ("tensor", "channel", "group", "block")


class Compressed(Method):
    """compressed-tensors (see the module docstring)."""

    name = "compressed-tensors"

    def parse(self, q: dict, where: str) -> Scheme:
        status = q.get("quantization_status", "compressed")
        if status != "compressed":
            raise fail(
                where,
                f"has quantization_status {quoted(status, 40)}: the weights are stored in full "
                f"precision with their quantization parameters beside them, which ppl_jax does "
                f"not apply",
                "save the model compressed (llm-compressor's save_compressed=True)",
            )
        for key in ("sparsity_config", "transform_config"):
            if q.get(key):
                raise fail(where, f"has a {key}, which ppl_jax does not apply")
        top = q.get("format") or "dense"
        groups = q.get("config_groups")
        if not isinstance(groups, dict) or not groups:
            raise fail(where, "has no config_groups")
        out = []
        for name, group in groups.items():
            if not isinstance(group, dict) or not isinstance(group.get("weights"), dict):
                raise fail(where, f"group {quoted(name, 40)} quantizes no weights")
            fmt = group.get("format") or top
            if fmt not in FORMATS:
                raise fail(
                    where,
                    f"has the compressed-tensors format {quoted(fmt, 40)}, which ppl_jax does "
                    f"not read (it reads {', '.join(FORMATS)})",
                    "give a dequantized (bfloat16 or float32) copy of the model",
                )
            out.append(_ct_weights(group, fmt, f"{where}: config group {quoted(name, 40)}"))
        ignore = q.get("ignore") or ()
        if not isinstance(ignore, list | tuple) or not all(isinstance(i, str) for i in ignore):
            raise fail(where, f"has ignore={quoted(ignore, 40)}, not a list of module names")
        formats = {g.format for g in out}
        return Scheme(
            "compressed-tensors", top if len(formats) > 1 else formats.pop(), tuple(out),
            ignore=tuple(ignore),
        )  # fmt: skip

    def parts(self, found: Finder, name: str):
        if name.endswith(".weight_packed"):
            return _packed(found, name)
        if found.stored[name][1] in ("I8", "F8_E4M3") and name + "_scale" in found.stored:
            return _scaled(found, name)
        return None

    def read(self, t: Quantized, storage: Storage, index: tuple[slice, ...]) -> np.ndarray:
        """`pack-quantized` (`_packed`) or int8 and float8 values times scales
        (`packing.read_scaled`)."""
        if t.kind == "packed":
            return _packed_block(t, storage, index)
        return read_scaled(t, storage, index)

    def device_parts(self, t: Quantized, storage: Storage) -> dict[str, np.ndarray]:
        """`pack-quantized`: `packed [out, ceil(in * bits / 32)]` uint32 (the stored words),
        `scale [out, groups]` as stored (`[]` per tensor), `zero [out, groups]` int8 (unpacked
        and minus 2 ** (bits - 1) where packed; int32 where stored wider; `[]` per tensor),
        `g_idx [in]` int32 (checked); else `packing.scaled_parts`."""
        if t.kind != "packed":
            return scaled_parts(t, storage)
        (out, width), bits = t.shape, t.bits
        cols = t.groups if "g_idx" in t.parts else math.ceil(width / t.block[1])
        scale = (1,) * t.scalar if t.scalar >= 0 else (out, cols)
        zero = (math.ceil(out * bits / 32), cols) if t.packed_zero else scale
        got = read_whole(storage, t, {"packed": (out, math.ceil(width * bits / 32)),
                                      "scale": scale, "zero": zero})  # fmt: skip
        got["packed"] = got["packed"].view(np.uint32)
        if "zero" in got:
            z = got["zero"]
            if t.packed_zero:
                z = (unpack(z, bits, 0)[:out].astype(np.int16) - (1 << (bits - 1))).astype(np.int8)
            got["zero"] = z if z.dtype == np.int8 else z.astype(np.int32)
        if t.scalar >= 0:
            got.update({r: got[r].reshape(()) for r in ("scale", "zero") if r in got})
        if "g_idx" in t.parts:
            got["g_idx"] = column_groups(t, storage, range(width))[0].astype(np.int32)
        return got

    def out_axes(self, t: Quantized) -> dict[str, int]:
        if t.kind != "packed":
            return scaled_out_axes(t)
        roles = ("packed",) if t.scalar >= 0 else ("packed", "scale", "zero")
        return {r: 0 for r in roles if r in t.parts}

    def dequantize_on_device(self, t: Quantized, parts: dict[str, jax.Array]) -> jax.Array:
        """`pack-quantized`: `(codes - 2 ** (bits - 1) - zero) * scale` per group (or by
        `g_idx`), channel or tensor, as `read`; else `packing.scaled_on_device`."""
        if t.kind != "packed":
            return scaled_on_device(t, parts)
        width = t.shape[1]
        codes = unpack_on_device(parts["packed"], t.bits, width).astype(jnp.int32)
        codes = codes - (1 << (t.bits - 1))
        scale, zero = parts["scale"], parts.get("zero")
        if "g_idx" in parts:
            scale = jnp.take(scale, parts["g_idx"], axis=1)
            zero = None if zero is None else jnp.take(zero, parts["g_idx"], axis=1)
        elif scale.ndim:
            scale = repeat_on_device(scale, 1, t.block[1], width)
            zero = None if zero is None else repeat_on_device(zero, 1, t.block[1], width)
        return product_on_device(codes, zero, scale, NP[t.dtype])


def _ct_weights(group: dict, fmt: str, where: str) -> Weights:
    w = group["weights"]
    bits = whole(w, ("num_bits",), 8, where)
    kind = w.get("type", "int")
    strategy = w.get("strategy") or "tensor"
    if strategy not in STRATEGIES:
        raise fail(where, f"has the strategy {quoted(strategy, 40)} (ppl_jax reads {STRATEGIES})")
    good = {
        "pack-quantized": kind == "int" and bits in (2, 4, 8),
        "naive-quantized": kind == "int" and bits <= 8 or kind == "float" and bits == 8,
        "int-quantized": kind == "int" and bits <= 8,
        "float-quantized": kind == "float" and bits == 8,
    }[fmt]
    if not good or bits < 2:
        raise fail(where, f"has {bits}-bit {quoted(kind, 40)} weights in {fmt}, a layout ppl_jax "
                          f"does not read (pack-quantized: 2, 4 or 8-bit int; float-quantized: "
                          f"8-bit float)")  # fmt: skip
    if w.get("actorder") not in (None, "weight", "static", "group", False):
        raise fail(where, f"has actorder={quoted(w.get('actorder'), 40)}")
    size = block = None
    if strategy == "group":
        size = whole(w, ("group_size",), None, where)
        if size is None or not 0 < size <= 1 << 20:
            raise fail(where, f"has the group strategy with group_size={quoted(size, 40)}")
    if strategy == "block":
        given = w.get("block_structure")
        block = block_shape(given)
        if block is None:
            raise fail(where, f"has the block strategy with block_structure={quoted(given, 40)}")
    targets = group.get("targets") or ["Linear"]
    if not isinstance(targets, list) or not all(isinstance(t, str) for t in targets):
        raise fail(where, f"has targets={quoted(targets, 40)}, not a list of names")
    act = group.get("input_activations")
    act_bits = whole(act, ("num_bits",), None, where) if isinstance(act, dict) else None
    return Weights(bits, kind, bool(w.get("symmetric", True)), strategy, size, block, fmt,
                   tuple(targets), act_bits)  # fmt: skip


def _weights_for(found: Finder, module: str) -> Weights:
    """The compressed-tensors config group whose targets name `module` (a `re:` pattern
    matching its stored name, or the class `Linear`)."""
    groups = found.scheme.groups
    if len(groups) == 1:
        return groups[0]
    real = found.shown(module).removesuffix(".")
    for w in groups:
        for target in w.targets:
            if target.startswith("re:"):
                try:
                    if re2.compile(target[3:]).match(real):
                        return w
                except re2.error:
                    raise CheckpointError(
                        f"{found.where}: quantization_config's target {target[:80]!r} is not a "
                        f"regular expression RE2 accepts."
                    ) from None
            elif target == real:
                return w
    for w in groups:
        if "Linear" in w.targets:
            return w
    raise CheckpointError(
        f"{found.where}: no config group of quantization_config targets {real!r}, which is "
        f"stored quantized; name it in a group's targets."
    )


def _scale_block(found: Finder, w: Weights, shape: tuple[int, ...], scale_name: str, target: str):
    """(the block a scale covers, `scalar`) of a weight of `shape` ([..., out, in]) under
    `w`'s strategy, the stored scale's shape checked."""
    scale = found.part(scale_name, target, FLOATS)
    out, width = shape[-2:]
    if w.strategy == "tensor":
        if math.prod(scale) != 1 or len(scale) > 1:
            raise found.bad(scale_name, "a per-tensor scale is one value")
        return (out, width), len(scale)
    block = {"channel": (1, width), "group": (1, w.group_size or 1), "block": w.block}
    bh, bw = block[w.strategy]
    want = shape[:-2] + (math.ceil(out / bh), math.ceil(width / bw))
    found.expect(scale_name, scale, want, f"{w.strategy} scales of a {list(shape)} weight")
    return (bh, bw), -1


def _packed(found: Finder, name: str):
    head = name[: -len("weight_packed")]
    target, w = head + "weight", _weights_for(found, name[: -len("weight_packed")])
    out, words = found.part(name, target, ("I32",), 2)
    width = words * 32 // w.bits
    if w.strategy == "group" and w.group_size:
        scale = found.stored.get(head + "weight_scale", ((0, 0), ""))[0]
        width = min(width, scale[-1] * w.group_size) if len(scale) == 2 else width
    if w.strategy == "block":
        raise found.bad(name, "pack-quantized weights have no block scales")
    parts = {"packed": name, "scale": head + "weight_scale"}
    if head + "weight_shape" in found.stored:
        found.part(head + "weight_shape", target, INTS, 1)
    groups = 0
    if head + "weight_g_idx" in found.stored:
        (width,) = found.part(head + "weight_g_idx", target, INTS, 1)
        parts["g_idx"] = head + "weight_g_idx"
        groups = found.part(head + "weight_scale", target, FLOATS, 2)[1]
        found.expect(head + "weight_scale", found.stored[head + "weight_scale"][0],
                     (out, groups), f"{out} rows of weight_packed")  # fmt: skip
        block, scalar = (1, 1), -1
    else:
        block, scalar = _scale_block(found, w, (out, width), head + "weight_scale", target)
    found.expect(name, (out, words), (out, math.ceil(width * w.bits / 32)),
                 f"{width} columns of {w.bits}-bit codes")  # fmt: skip
    packed_zero = False
    if not w.symmetric:
        zero, scale = head + "weight_zero_point", found.stored[head + "weight_scale"][0]
        shape = found.part(zero, target, ("I8", "I32", "I64"))
        packed_zero = scalar < 0 and tuple(shape) != tuple(scale)  # else as stored
        if packed_zero:
            found.expect(zero, shape, (math.ceil(out * w.bits / 32), scale[1]),
                         f"{out} rows of {w.bits}-bit zero points packed in words (or the "
                         f"scale's shape)")  # fmt: skip
            found.part(zero, target, ("I32",), 2)
        elif math.prod(shape) != math.prod(scale):
            raise found.bad(
                zero, f"its scale {found.shown(head + 'weight_scale')!r} is {list(scale)}"
            )
        parts["zero"] = zero
    dtype = found.stored[head + "weight_scale"][1]
    return target, Quantized("packed", parts, (out, width), dtype, w.bits, groups=groups,
                             block=block, scalar=scalar, packed_zero=packed_zero)  # fmt: skip


def _scaled(found: Finder, name: str):
    w = _weights_for(found, name.removesuffix("weight"))
    kind = "F8_E4M3" if w.kind == "float" else "I8"
    shape = found.part(name, name, (kind,))
    if len(shape) < 2:
        raise found.bad(name, "a quantized weight has at least two dimensions")
    block, scalar = _scale_block(found, w, shape, name + "_scale", name)
    parts = {"values": name, "scale": name + "_scale"}
    if not w.symmetric:
        zero = name + "_zero_point"
        found.expect(zero, found.part(zero, name, ("I8", "I32", "I64")),
                     found.stored[name + "_scale"][0], "its scale's shape")  # fmt: skip
        parts["zero"] = zero
    dtype = found.stored[name + "_scale"][1]
    return name, Quantized("scaled", parts, shape, dtype, w.bits, block=block, scalar=scalar)


def _packed_block(t: Quantized, storage: Storage, index: tuple[slice, ...]) -> np.ndarray:
    """compressed-tensors' `pack-quantized`: `weight_packed [out, in * bits / 32]`, codes minus
    2 ** (bits - 1) (its `unpack_from_int32`); `weight_scale` per group (or by
    `weight_g_idx`), channel or tensor; zero points packed along the output axis (group and
    channel strategies since compressed-tensors 0.10: `weight_zero_point [out * bits / 32,
    groups]`), or stored as they are (the scale's shape; one value per tensor). By slabs of
    output rows."""
    rows, cols = in_range(index, t.shape, 0), in_range(index, t.shape, 1)
    p, bits, offset = t.parts, t.bits, 1 << (t.bits - 1)
    w0, w1, first = words_for(cols.start, cols.stop, bits, math.ceil(t.shape[1] * bits / 32))
    packed = np.asarray(storage.read(p["packed"], (slice(rows.start, rows.stop), slice(w0, w1))))
    at_cols = slice(cols.start - first, cols.stop - first)
    g = None
    if "g_idx" in p:
        g, g0, g1 = column_groups(t, storage, cols)
        groups = slice(g0, g1)
        scale = np.asarray(storage.read(p["scale"], (slice(rows.start, rows.stop), groups)))
    else:
        scale = compact(t, storage, "scale", index)
        groups = slice(scale[2], (cols.stop - 1) // t.block[1] + 1)
    zero = None
    if "zero" in p:
        if t.packed_zero:
            zero = _zeros(t, storage, rows, groups)
        elif g is not None:
            zero = np.asarray(storage.read(p["zero"], (slice(rows.start, rows.stop), groups)))
        else:
            zero = compact(t, storage, "zero", index)
    out = np.empty((len(rows), len(cols)), NP[t.dtype])
    for a, b in slabs(len(rows), len(cols)):
        codes = unpack(packed[a:b], bits, 1)[:, at_cols].astype(np.float32) - offset
        part = range(rows.start + a, rows.start + b)
        if g is not None:
            s, z = scale[a:b, g - g0], None if zero is None else zero[a:b, g - g0]
        else:
            s = spread(t, scale, part, cols)
            if zero is None or not t.packed_zero:
                z = None if zero is None else spread(t, zero, part, cols)
            else:
                z = expand(zero[a:b], 1, cols, t.block[1], groups.start)
        out[a:b] = scaled(codes, s, z, out.dtype)
    return out


def _zeros(t: Quantized, storage: Storage, rows: range, groups: slice) -> np.ndarray:
    """compressed-tensors' zero points of `rows` and `groups`, unpacked from the words they
    are packed in along the output axis, minus 2 ** (bits - 1)."""
    z0, z1, first = words_for(rows.start, rows.stop, t.bits, zero_words(t))
    z = np.asarray(storage.read(t.parts["zero"], (slice(z0, z1), groups)))
    z = unpack(z, t.bits, 0)[rows.start - first : rows.stop - first]
    return z.astype(np.int16) - (1 << (t.bits - 1))


METHOD = Compressed()
