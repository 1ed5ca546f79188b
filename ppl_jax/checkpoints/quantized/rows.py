"""A Hugging Face quantized weight kept packed on the device (`ppl_jax.models.layers.packed`):
each output row's chunk of input columns one block, its bytes that chunk's record.

A quantized weight `[..., out, in]` (MXFP4's experts: `[experts, in, out]`) is, to the packed
machinery, a tensor of `[..., out, in / C]` blocks of `C` values each (`chunk`: 128 input
columns where the axis allows, a multiple of 8 records a row; the whole axis for an act-order
`g_idx`). A record is the concatenation of its output row's bytes, over its `C` columns, of
each part its method keeps on the device with an output axis (`Method.device_parts`,
`Method.out_axes`): GPTQ's `qweight` words (`C * bits / 32` uint32), its scales and unpacked
zero points of the groups in the chunk (a scale entry over several chunks repeated in each:
compressed-tensors' per channel, block FP8's), and so on. The mapping moves whole blocks
(`mapping.operations.block_plan`, along the input axis), the mesh shards them as the float
weight is sharded (an output projection's over its heads and input columns too), and inside
the layer `Rows` slices each record back into its parts (a bitcast) and calls the method's
`dequantize_on_device` on a weight of `C` columns: bit for bit the host's `Method.read`.

Parts without an output axis are shared by every record (act-order's `g_idx [in]` int32, a
scale or zero point per tensor): they are read when the layout is made (`shared`) and kept in
the `Rows` as bytes, constants of the compiled program (4 bytes per input column of each
act-order weight). GPTQ without act-order stores a `g_idx` too, each column's own group: that
one is dropped (`plain`).

`layouts` says which weights of a checkpoint are packed and why the others are not; `records`
makes a weight's records from its parts, and `place` places them.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from ppl_jax.checkpoints.mapping import blocks
from ppl_jax.checkpoints.mapping.storage import Storage
from ppl_jax.checkpoints.quantized.base import Method, Quantized, Stored
from ppl_jax.checkpoints.quantized.methods import METHODS
from ppl_jax.checkpoints.quantized.packing import NP, column_groups
from ppl_jax.errors import CheckpointError
from ppl_jax.models.layers.packed import Layout, is_packed

CHUNK = 128  # input columns a record holds at least, where the axis allows
SHARDS = 8  # records per output row: a multiple of this (the devices of a host)
# The NumPy dtype of a stored part by its safetensors name.
STORED = {**NP, "I8": np.int8, "I32": np.int32, "I64": np.int64, "U8": np.uint8,
          "F8_E4M3": jnp.float8_e4m3fn}  # fmt: skip


def in_axis(t: Quantized) -> int:
    """The input axis of `t`'s dequantized weight (Hugging Face's layout): the last, or for
    MXFP4's experts `[experts, in, out]` the second."""
    return 1 if t.kind == "mxfp4" else len(t.shape) - 1


def part_shapes(t: Quantized, method: Method, raw: Stored) -> dict[str, tuple[tuple, str]]:
    """role -> (shape, NumPy dtype name) of each array `method.device_parts(t, ...)` gives, from
    `t` and the stored parts' dtypes `raw` (by the rules' names) alone: nothing is read."""
    p, bits = t.parts, t.bits
    dtype = {role: jnp.dtype(STORED[raw[name][1]]).name for role, name in p.items()}
    lead, (out, width) = t.shape[:-2], t.shape[-2:]
    got: dict[str, tuple[tuple, str]] = {}
    if t.kind in ("gptq", "awq"):
        got["qweight"] = ((math.ceil(width * bits / 32), out), "uint32")
        got["qzeros"] = ((t.groups, out), "uint8")
        got["scales"] = ((t.groups, out), dtype["scales"])
    elif t.kind == "mxfp4":
        experts, width, out = t.shape
        got["blocks"] = ((experts, out, width // 32, 16), "uint8")
        got["scales"] = ((experts, out, width // 32), "uint8")
    else:  # compressed-tensors' `packed`, or values times scales (`scaled`)
        if t.kind == "packed":
            got["packed"] = ((out, math.ceil(width * bits / 32)), "uint32")
            cols = t.groups if "g_idx" in p else math.ceil(width / t.block[1])
            entries = (out, cols)
        else:
            got["values"] = (tuple(t.shape), dtype["values"])
            entries = (*lead, out, math.ceil(width / t.block[1]))
        entries = () if t.scalar >= 0 else entries
        got["scale"] = (entries, dtype["scale"])
        if "zero" in p:
            got["zero"] = (entries, "int8" if t.packed_zero or dtype["zero"] == "int8" else "int32")
    if "g_idx" in p:
        got["g_idx"] = ((width,), "int32")
    return got


def shared(t: Quantized, method: Method, storage: Storage) -> dict[str, np.ndarray]:
    """The parts of `method.device_parts(t, storage)` that have no output axis (`out_axes`
    names none): `g_idx [in]` int32 (checked against the scales), a scale or zero point per
    tensor `[]`; each read alone (a few KiB).

    Raises:
      CheckpointError: a `g_idx` naming a group its weight does not hold.
    """
    axes = method.out_axes(t)
    out = {}
    for role, name in t.parts.items():
        if role in axes:
            continue
        if role == "g_idx":
            out[role] = column_groups(t, storage, range(t.shape[-1]))[0].astype(np.int32)
            continue
        x = np.asarray(storage.read(name, (slice(0, 1),) * t.scalar)).reshape(())
        out[role] = x if role != "zero" or x.dtype == np.int8 else x.astype(np.int32)
    return out


def unit(t: Quantized) -> int:
    """The input columns one scale entry covers (the whole axis for one per row)."""
    if t.kind in ("gptq", "awq"):
        return t.group
    return 32 if t.kind == "mxfp4" else t.block[1]


def chunk(t: Quantized) -> int:
    """The input columns of one record: the least from `CHUNK` up (else the most below it)
    that cuts the input axis in a multiple of `SHARDS` records, is a multiple of 32 (whole
    runs of codes packed in words, whole MXFP4 blocks, and a scale entry repeated in a record
    over 32 values at least), and holds whole scale entries or lies inside one (the entry
    then repeated in each record); the whole axis where none does, or where a `g_idx` orders
    the groups.

    A mesh axis of up to `SHARDS` devices that divides the input axis then divides its records
    too, so that the records are sharded as the float weight is and the layer's products are
    partitioned alike (in bfloat16 an all-reduce of partial sums rounds them: another
    partition gives other numbers). Whole, the records are replicated and the dequantized
    weight is sliced as the float weight is sharded (a plain axis, which XLA shards)."""
    width, u = t.shape[in_axis(t)], unit(t)
    if "g_idx" in t.parts or width % 32 or (width % u and u < width):
        return width
    fits = [
        c for c in range(32, width, 32)
        if width % (c * SHARDS) == 0 and (c % u == 0 or u % c == 0)
    ]  # fmt: skip
    return next((c for c in fits if c >= CHUNK), fits[-1] if fits else width)


def chunked(t: Quantized, size: int) -> Quantized:
    """`t` as the method sees one record of it: `size` input columns, its groups or blocks
    cut to them."""
    if size == t.shape[in_axis(t)]:
        return t
    shape = list(t.shape)
    shape[in_axis(t)] = size
    u = min(unit(t), size)
    return dataclasses.replace(
        t, shape=tuple(shape), group=u if t.kind in ("gptq", "awq") else t.group,
        groups=size // u if t.kind in ("gptq", "awq") else t.groups,
        block=(t.block[0], u) if t.kind in ("packed", "scaled") else t.block,
    )  # fmt: skip


def plain(t: Quantized, common: dict[str, np.ndarray]) -> Quantized:
    """`t` without its GPTQ `g_idx` where that names each column's own group (`column //
    group`: GPTQ without act-order stores one), so that its records may be chunked; else
    `t`. Drops it from `common` too."""
    g = common.get("g_idx")
    if t.kind != "gptq" or g is None or not np.array_equal(g, np.arange(len(g)) // t.group):
        return t
    del common["g_idx"]
    return dataclasses.replace(t, parts={r: n for r, n in t.parts.items() if r != "g_idx"})


@dataclasses.dataclass(frozen=True)
class Field:
    """One part's bytes in a record: `role`, its dtype's name, its output axis `axis`, the shape
    of one record's piece of it (`row`: its axes but the leading ones and the output axis, the
    first of them, along the input axis, cut to the chunk's), and where its bytes start."""

    role: str
    dtype: str
    axis: int
    row: tuple[int, ...]
    start: int

    @property
    def nbytes(self) -> int:
        return math.prod(self.row) * jnp.dtype(self.dtype).itemsize


@dataclasses.dataclass(frozen=True)
class Rows:
    """How a record makes its output row's chunk of `block` columns (`Layout.dequantize` of a
    Hugging Face quantized weight; static and hashable: equal weights' `Rows` are equal).

    Attributes:
      method: the method's `quant_method` (`METHODS`).
      weight: the `Quantized`'s fields but its parts' names, (name, value) pairs.
      fields: the parts with an output axis, in their order in the record.
      shared: the parts without one, (role, dtype name, shape, bytes).
      lead: the weight's leading axes (before `[out, in]`; MXFP4's experts).
      in_axis: the weight's input axis (`in_axis`); width: its size (the chunks' columns
        together).
    """

    method: str
    weight: tuple[tuple[str, Any], ...]
    fields: tuple[Field, ...]
    shared: tuple[tuple[str, str, tuple[int, ...], bytes], ...]
    lead: int
    in_axis: int
    width: int

    @classmethod
    def of(cls, t: Quantized, method: Method, raw: Stored, common: dict[str, np.ndarray]) -> Rows:
        """The `Rows` of `t` (`raw`: the stored parts' shapes and dtypes; `common`: `shared`),
        its input axis cut in chunks of `chunk(t)` columns."""
        shapes, axes = part_shapes(t, method, raw), method.out_axes(t)
        lead, width, size = len(t.shape) - 2, t.shape[in_axis(t)], chunk(t)
        fields, start = [], 0
        for role, axis in sorted(axes.items()):
            shape, dtype = shapes[role]
            row = [n for i, n in enumerate(shape) if i >= lead and i != axis]
            row[0] = max(1, row[0] * size // width)  # the chunk's elements (a scale: one)
            fields.append(Field(role, dtype, axis, tuple(row), start))
            start += fields[-1].nbytes
        piece = chunked(t, size)
        weight = tuple(
            (f.name, getattr(piece, f.name)) for f in dataclasses.fields(t) if f.name != "parts"
        )
        kept = tuple(
            (r, np.dtype(x.dtype).name, tuple(x.shape), np.ascontiguousarray(x).tobytes())
            for r, x in sorted(common.items())
        )
        return cls(method.name, weight, tuple(fields), kept, lead, in_axis(t), width)

    @property
    def block(self) -> int:
        """The input columns of a record (a chunk)."""
        return dict(self.weight)["shape"][self.in_axis]

    @property
    def nbytes(self) -> int:
        """A record's bytes."""
        return sum(f.nbytes for f in self.fields)

    @property
    def quantized(self) -> Quantized:
        roles = {f.role: f.role for f in self.fields} | {s[0]: s[0] for s in self.shared}
        return Quantized(parts=roles, **dict(self.weight))

    def __call__(self, records: jax.Array, kind: str) -> jax.Array:
        """The chunks of rows `[..., block]` float32 of the records `[..., nbytes]` uint8
        (`kind`, the layout's name, is not needed: the `Rows` says it all).

        The records' axes are kept apart (`jax.vmap`), not merged: merging a sharded axis into
        one before it (a column-parallel weight's `[in / C, out, nbytes]`, split along `out`),
        XLA would gather every record on every device and dequantize them all there."""
        if records.ndim == 1:
            return self(records[None], kind)[0]
        rows = self._rows
        for _ in range(records.ndim - 2):
            rows = jax.vmap(rows)
        return rows(records)

    def _rows(self, flat: jax.Array) -> jax.Array:
        """`[n, nbytes]` uint8 records -> their chunks `[n, block]` float32."""
        n = flat.shape[0]
        parts = {}
        for f in self.fields:
            raw = flat[:, f.start : f.start + f.nbytes]
            size = jnp.dtype(f.dtype).itemsize
            raw = raw.reshape((n, *f.row, size) if size > 1 else (n, *f.row))
            x = lax.bitcast_convert_type(raw, jnp.dtype(f.dtype))
            x = x.reshape((1,) * self.lead + x.shape)  # the leading axes, then the rows
            parts[f.role] = jnp.moveaxis(x, self.lead, f.axis)
        for role, dtype, shape, data in self.shared:
            parts[role] = jnp.asarray(np.frombuffer(data, jnp.dtype(dtype)).reshape(shape))
        w = METHODS[self.method].dequantize_on_device(self.quantized, parts)
        w = w.reshape(w.shape[self.lead :])  # [records, block], or MXFP4's [block, records]
        if self.in_axis == self.lead:
            w = w.T
        return w.astype(jnp.float32).reshape(n, w.shape[-1])


def kind_name(t: Quantized, method: Method, raw: Stored) -> str:
    """The layout's name for results.json: the method and its bits or type (`gptq-4`,
    `compressed-tensors-fp8`, `fp8`, `mxfp4`)."""
    if method.name in ("fp8", "mxfp4"):
        return method.name
    if t.kind == "scaled" and raw[t.parts["values"]][1] == "F8_E4M3":
        return f"{method.name}-fp8"
    return f"{method.name}-{t.bits}"


def records(t: Quantized, method: Method, storage: Storage, rows: Rows) -> np.ndarray:
    """`t`'s records: `t.shape` with its input axis in chunks of `rows.block` columns, each
    element one output row's chunk's record (a NumPy void of `rows.nbytes`), from
    `method.device_parts`.

    Raises:
      CheckpointError: as `device_parts`; parts that do not make the records `rows` says.
    """
    parts = method.device_parts(t, storage)
    lead, count = len(t.shape) - 2, rows.width // rows.block  # records per row
    out = []
    for f in rows.fields:
        x = np.moveaxis(np.asarray(parts[f.role]), f.axis, lead)  # [*lead, out, n, *rest]
        n = x.shape[lead + 1] if x.ndim > lead + 1 else 0
        if n % count == 0:  # whole elements in each chunk
            x = x.reshape(*x.shape[: lead + 1], count, n // count, *x.shape[lead + 2 :])
        elif count % n == 0:  # an entry over several chunks, repeated in each
            x = np.expand_dims(np.repeat(x, count // n, axis=lead + 1), lead + 2)
        if np.dtype(x.dtype).name != f.dtype or x.shape[lead + 2 :] != f.row:
            raise CheckpointError(
                f"{t.parts[f.role]!r}: its {method.name} part {f.role} came out {x.dtype} "
                f"{list(x.shape)}, not the layout's {f.dtype} {list(f.row)}; the checkpoint is "
                f"damaged, or set checkpoint.dequantize=host."
            )
        x = np.ascontiguousarray(x).reshape(*x.shape[: lead + 2], -1)
        out.append(x.view(np.uint8))
    row_bytes = np.ascontiguousarray(np.concatenate(out, axis=-1))  # [*lead, out, count, rb]
    voids = row_bytes.view(np.dtype((np.void, rows.nbytes)))[..., 0]
    return voids if rows.in_axis != lead else np.moveaxis(voids, -1, lead)


def layouts(
    source: Any,
    sources: dict[str, Any],
    stored: Stored,
    abstract: dict[str, Any],
    names: dict[str, Any],
) -> tuple[dict[str, Layout], dict[str, str]]:
    """Which model weights made of quantized weights stay packed (`Checkpoint.device_layouts`):
    ({weight: its `Layout`}, {weight: why its quantized weights are dequantized on the host}).

    Args:
      source: the `parts.Dequantized` storage of the checkpoint's quantized weights.
      sources: the mapping's sources of the model weights; stored: the tensors the rules see
        (`parts.view`); abstract: the model weights (shape, dtype); names: the
        architecture's numbers.

    Raises:
      CheckpointError: a `g_idx` naming a group its weight does not hold.
    """
    tensors, method, storage, raw = source.tensors, source.method, source.storage, source.raw
    out: dict[str, Layout] = {}
    host: dict[str, str] = {}
    for weight, src in sources.items():
        found = [tensors.get(p.stored) for p in src.pieces]
        if not any(found):
            continue
        if not all(found):
            host[weight] = "its stored tensors mix quantized and float ones"
            continue
        every = set()
        for t in found:
            common = shared(t, method, storage)
            every.add(Rows.of(plain(t, common), method, raw, common))
        if len(every) > 1:
            host[weight] = "its stacked tensors are quantized differently"
            continue
        rows, t = every.pop(), found[0]
        leaf = abstract[weight]
        width = rows.block
        axis = blocks.packed_axis(src, stored, tuple(leaf.shape), names, width, rows.in_axis)
        if axis is None:
            host[weight] = "its mapping rule cuts or reorders the input columns, or scales them"
            continue
        out[weight] = Layout(
            rows, kind_name(t, method, raw), axis[0], width, rows.nbytes, tuple(leaf.shape),
            np.dtype(leaf.dtype).name, axis[1],
        )  # fmt: skip
    return out, host


def place(
    floats: Any, source: Any, sources: dict[str, Any], stored: Stored, targets: dict, names: dict
) -> dict[str, Any]:
    """The model weights `targets` (name -> leaf with a sharding) placed in their shardings:
    the float ones by `floats(sources, stored, leaves, source, names)` (`mapping.blocks.place`
    or `place_read_ahead`), each `Packed` one (`layouts`) from the records of its quantized
    weights (`records`, one weight's on the host at a time: `mapping.blocks.place_packed`).
    In `targets`' order.

    Raises:
      CheckpointError: as `floats` and `records`.
    """
    packed = {k: v for k, v in targets.items() if is_packed(v)}
    out = floats(sources, stored, {k: v for k, v in targets.items() if k not in packed},
                 source, names)  # fmt: skip
    if packed:
        rows_of = {
            piece.stored: leaf.layout.dequantize
            for weight, leaf in packed.items()
            for piece in sources[weight].pieces
        }

        def made(name: str) -> tuple[np.ndarray, int]:
            rows = rows_of[name]
            got = records(source.tensors[name], source.method, source.storage, rows)
            return got, rows.in_axis

        out.update(blocks.place_packed(sources, stored, packed, made, names))
    return {k: out[k] for k in targets}
