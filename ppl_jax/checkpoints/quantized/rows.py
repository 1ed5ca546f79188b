"""A Hugging Face quantized weight kept packed on the device (`ppl_jax.models.layers.packed`):
each output row one block of the whole input axis, its bytes the row's record.

A quantized weight `[..., out, in]` (MXFP4's experts: `[experts, in, out]`) is, to the packed
machinery, a tensor of `[..., out, 1]` blocks of `in` values each: one block per output row.
A row's record is the concatenation of that row's bytes of each part its method keeps on the
device with an output axis (`Method.device_parts`, `Method.out_axes`): GPTQ's `qweight` column
(`[ceil(in * bits / 32)]` uint32), its `scales` column (`[groups]`) and its unpacked zero points
(`[groups]` uint8), and so on. The mapping moves whole rows (`mapping.operations.block_plan`,
the block axis being the input axis), the mesh shards them along the float weight's output
axes, and inside the layer `Rows` slices each record back into its parts (a bitcast) and calls
the method's `dequantize_on_device`: bit for bit the host's `Method.read`.

Parts without an output axis are shared by every row (act-order's `g_idx [in]` int32, a scale
or zero point per tensor): they are read when the layout is made (`shared`) and kept in the
`Rows` as bytes, constants of the compiled program (4 bytes per input column of each weight).

`layouts` says which weights of a checkpoint are packed and why the others are not; `records`
makes a weight's records from its parts.
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


@dataclasses.dataclass(frozen=True)
class Field:
    """One part's bytes in a row's record: `role`, its dtype's name, its output axis `axis`,
    the shape of one row of it (`row`, its other axes but the leading ones), and where its
    bytes start in the record."""

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
    """How a row's record makes the row (`Layout.dequantize` of a Hugging Face quantized
    weight; static and hashable: equal weights' `Rows` are equal).

    Attributes:
      method: the method's `quant_method` (`METHODS`).
      weight: the `Quantized`'s fields but its parts' names, (name, value) pairs.
      fields: the parts with an output axis, in their order in the record.
      shared: the parts without one, (role, dtype name, shape, bytes).
      lead: the weight's leading axes (before `[out, in]`; MXFP4's experts).
      in_axis: the weight's input axis (`in_axis`).
    """

    method: str
    weight: tuple[tuple[str, Any], ...]
    fields: tuple[Field, ...]
    shared: tuple[tuple[str, str, tuple[int, ...], bytes], ...]
    lead: int
    in_axis: int

    @classmethod
    def of(cls, t: Quantized, method: Method, raw: Stored, common: dict[str, np.ndarray]) -> Rows:
        """The `Rows` of `t` (`raw`: the stored parts' shapes and dtypes; `common`: `shared`)."""
        shapes, axes = part_shapes(t, method, raw), method.out_axes(t)
        lead = len(t.shape) - 2
        fields, start = [], 0
        for role, axis in sorted(axes.items()):
            shape, dtype = shapes[role]
            row = tuple(n for i, n in enumerate(shape) if i >= lead and i != axis)
            fields.append(Field(role, dtype, axis, row, start))
            start += fields[-1].nbytes
        weight = tuple(
            (f.name, getattr(t, f.name)) for f in dataclasses.fields(t) if f.name != "parts"
        )
        kept = tuple(
            (r, np.dtype(x.dtype).name, tuple(x.shape), np.ascontiguousarray(x).tobytes())
            for r, x in sorted(common.items())
        )
        return cls(method.name, weight, tuple(fields), kept, lead, in_axis(t))

    @property
    def nbytes(self) -> int:
        """A row's record's bytes."""
        return sum(f.nbytes for f in self.fields)

    @property
    def quantized(self) -> Quantized:
        roles = {f.role: f.role for f in self.fields} | {s[0]: s[0] for s in self.shared}
        return Quantized(parts=roles, **dict(self.weight))

    def __call__(self, records: jax.Array, kind: str) -> jax.Array:
        """The rows `[..., in]` float32 of the records `[..., nbytes]` uint8 (`kind`, the
        layout's name, is not needed: the `Rows` says it all)."""
        n, leading = math.prod(records.shape[:-1]), records.shape[:-1]
        flat = records.reshape(n, records.shape[-1])
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
        w = w.reshape(w.shape[self.lead :])  # [rows, in], or MXFP4's [in, rows]
        if self.in_axis == self.lead:
            w = w.T
        return w.astype(jnp.float32).reshape(*leading, w.shape[-1])


def kind_name(t: Quantized, method: Method, raw: Stored) -> str:
    """The layout's name for results.json: the method and its bits or type (`gptq-4`,
    `compressed-tensors-fp8`, `fp8`, `mxfp4`)."""
    if method.name in ("fp8", "mxfp4"):
        return method.name
    if t.kind == "scaled" and raw[t.parts["values"]][1] == "F8_E4M3":
        return f"{method.name}-fp8"
    return f"{method.name}-{t.bits}"


def records(t: Quantized, method: Method, storage: Storage, rows: Rows) -> np.ndarray:
    """`t`'s records: `t.shape` with its input axis one block, each element one output row's
    record (a NumPy void of `rows.nbytes`), from `method.device_parts`.

    Raises:
      CheckpointError: as `device_parts`; parts that do not make the records `rows` says.
    """
    parts = method.device_parts(t, storage)
    lead = len(t.shape) - 2
    out = []
    for f in rows.fields:
        x = np.moveaxis(np.asarray(parts[f.role]), f.axis, lead)  # [*lead, out, *row]
        if np.dtype(x.dtype).name != f.dtype or x.shape[lead + 1 :] != f.row:
            raise CheckpointError(
                f"{t.parts[f.role]!r}: its {method.name} part {f.role} came out {x.dtype} "
                f"{list(x.shape)}, not the layout's {f.dtype} {list(f.row)}; the checkpoint is "
                f"damaged, or set checkpoint.dequantize=host."
            )
        x = np.ascontiguousarray(x).reshape(*x.shape[: lead + 1], -1)
        out.append(x.view(np.uint8))
    row_bytes = np.ascontiguousarray(np.concatenate(out, axis=-1))
    voids = row_bytes.view(np.dtype((np.void, rows.nbytes)))  # [*lead, out, 1]
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
        every = {Rows.of(t, method, raw, shared(t, method, storage)) for t in found}
        if len(every) > 1:
            host[weight] = "its stacked tensors are quantized differently"
            continue
        rows, t = every.pop(), found[0]
        leaf = abstract[weight]
        width = t.shape[rows.in_axis]
        axis = blocks.packed_axis(src, stored, tuple(leaf.shape), names, width, rows.in_axis)
        if axis is None:
            host[weight] = "its mapping rule cuts or reorders the input axis"
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
