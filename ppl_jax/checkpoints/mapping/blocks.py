"""Model weights made block by block from a `Storage` through the mapping's `Source`s: each
device's block of a weight is read as the stored region it needs (`operations.ReadPlan.region`), the
rule's operations run on that region in NumPy, and the block is placed on its device
(`jax.make_array_from_callback`). Devices holding the same block share one read; a model is never
gathered whole in one host's memory.

For storages that restore whole tensors onto the devices first (Orbax, `storage.DeviceArrays`),
`stored_sharding` gives each stored tensor the sharding under which every device's shard holds the
regions its blocks need, and `read_groups` bounds how many bytes are restored at a time.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from ppl_jax.checkpoints.mapping import operations
from ppl_jax.checkpoints.mapping import storage as storage_lib
from ppl_jax.checkpoints.mapping.language import Source
from ppl_jax.checkpoints.mapping.storage import Storage


def _ranges(index: tuple[slice, ...], shape: tuple[int, ...]) -> tuple[range, ...]:
    return tuple(range(*s.indices(n)[:2]) for s, n in zip(index, shape, strict=True))


def _inner(src: Source, shape: tuple[int, ...]) -> tuple[tuple[int, ...], int | None]:
    """The shape of one stored piece's result, and the stack axis (None: not stacked)."""
    if not src.parts:
        return tuple(shape), None
    axis = src.rule["stack"]["axis"] % len(shape)
    return tuple(shape[:axis]) + tuple(shape[axis + 1 :]), axis


def read_block(
    src: Source,
    stored: dict[str, tuple[tuple[int, ...], Any]],
    shape: tuple[int, ...],
    block: tuple[range, ...],
    storage: Storage,
    names: dict[str, Any],
    dtype: Any,
) -> np.ndarray:
    """The block `block` (a range per axis) of the model weight of `shape` made by `src`, in
    `dtype`, reading only the stored regions it needs."""
    return _pieces(
        src, stored, shape, block, storage.read, names,
        lambda plan: plan, lambda x, piece: operations.finish(x, piece, dtype),
    )  # fmt: skip


def _pieces(src, stored, shape, block, read, names, plan_of, finish) -> np.ndarray:
    """`read_block`'s and `read_packed_block`'s walk: each stored piece's region of `block`
    read (`read`), its rule's operations applied (`plan_of` the piece's `ReadPlan`), finished
    (`finish(x, piece)`), and the pieces stacked where the weight stacks them."""
    inner, axis = _inner(src, shape)
    pieces = [(src, block)] if axis is None else [
        (src.parts[j], block[:axis] + block[axis + 1 :]) for j in block[axis]
    ]  # fmt: skip
    out = []
    for piece, piece_block in pieces:
        plan = plan_of(operations.plan(piece, stored[piece.stored][0], inner, names))
        region = plan.region(piece_block)
        x = read(piece.stored, tuple(slice(r.start, r.stop) for r in region))
        x = plan.apply(x, tuple(r.start for r in region), piece_block)
        out.append(finish(x, piece))
    return out[0] if axis is None else np.stack(out, axis=axis)


def packed_axis(
    src: Source,
    stored: dict[str, tuple[tuple[int, ...], Any]],
    shape: tuple[int, ...],
    names: dict[str, Any],
    block: int,
    axis: int = -1,
) -> tuple[int, int] | None:
    """(the first axis of the model weight of `shape` that the blocks of `block` values of its
    stored tensors (along their axis `axis`) run along, how many axes they span), where `src`'s
    operations move whole blocks (`operations.block_plan`) and change no value (no `scale`,
    `offset` or `plus_one`); else None (read it as floats)."""
    inner, stack = _inner(src, shape)
    axes = set()
    for piece in [src] if stack is None else src.parts:
        rule = piece.rule
        if piece.scale != 1.0 or rule.get("offset") or rule.get("plus_one"):
            return None
        got = operations.block_plan(
            operations.plan(piece, stored[piece.stored][0], inner, names), block, axis
        )
        if got is None:
            return None
        axes.add(got[1:])
    if len(axes) != 1:
        return None
    first, span = axes.pop()
    return (first if stack is None or first < stack else first + 1), span


def read_packed_block(
    src: Source,
    stored: dict[str, tuple[tuple[int, ...], Any]],
    shape: tuple[int, ...],
    block: tuple[range, ...],
    read_blocks: Any,
    names: dict[str, Any],
    values: int,
    block_axis: int = -1,
) -> np.ndarray:
    """The block `block` (a range per axis of the packed weight, its bytes axis last) of the
    model weight of `shape` made by `src` (`packed_axis` not None), as stored bytes: uint8, the
    block's shape. `read_blocks(stored_name, index)` reads a stored region of blocks (each one
    void element, `gguf_file.read_blocks`); `values` is the values per block, along the stored
    tensors' axis `block_axis`."""
    x = _pieces(
        src, stored, shape, block[:-1], read_blocks, names,
        lambda plan: operations.block_plan(plan, values, block_axis)[0],
        lambda x, piece: np.ascontiguousarray(x),
    )  # fmt: skip
    return x.view(np.uint8).reshape(*x.shape, x.dtype.itemsize)


def place(
    sources: dict[str, Source],
    stored: dict[str, tuple[tuple[int, ...], Any]],
    targets: dict[str, Any],
    storage: Storage,
    names: dict[str, Any],
) -> dict[str, jax.Array]:
    """The model weights `targets` (name -> leaf with shape, dtype and sharding; a leaf without
    a sharding goes to the first device) made from `storage`, each placed in its sharding.

    Raises:
      CheckpointError: as the storage's `read`.
    """
    out = {}
    for name, leaf in targets.items():
        src, shape = sources[name], tuple(leaf.shape)
        sharding = getattr(leaf, "sharding", None)
        if sharding is None:
            sharding = jax.sharding.SingleDeviceSharding(jax.devices()[0])
        cache: dict[tuple, np.ndarray] = {}

        def callback(index, src=src, shape=shape, leaf=leaf, cache=cache):
            block = _ranges(index, shape)
            key = tuple((r.start, r.stop) for r in block)
            if key not in cache:  # devices holding the same block share one read
                cache[key] = read_block(src, stored, shape, block, storage, names, leaf.dtype)
            return cache[key]

        out[name] = jax.make_array_from_callback(shape, sharding, callback)
        cache.clear()
    return out


def place_packed(
    sources: dict[str, Source],
    stored: dict[str, tuple[tuple[int, ...], Any]],
    targets: dict[str, Any],
    records: Any,
    names: dict[str, Any],
) -> dict[str, Any]:
    """The packed weights `targets` (name -> `ppl_jax.models.layers.packed.Packed` of
    `jax.ShapeDtypeStruct`s with a sharding) placed in their shardings, each device's block cut
    by `read_packed_block` from its stored tensors' blocks: `records(stored_name)` gives a
    stored tensor's blocks whole (void elements) and the axis they run along, made once per
    weight and dropped after it (one weight's blocks on the host at a time).

    Raises:
      CheckpointError: as `records`.
    """
    out = {}
    for name, leaf in targets.items():
        src, layout, data = sources[name], leaf.layout, leaf.data
        whole: dict[str, tuple[np.ndarray, int]] = {}

        def get(stored_name: str, whole=whole) -> tuple[np.ndarray, int]:
            if stored_name not in whole:
                whole[stored_name] = records(stored_name)
            return whole[stored_name]

        cache: dict[tuple, np.ndarray] = {}

        def callback(index, src=src, layout=layout, data=data, cache=cache, get=get):
            block = _ranges(index, tuple(data.shape))
            key = tuple((r.start, r.stop) for r in block)
            if key not in cache:  # devices holding the same block share one read
                cache[key] = read_packed_block(
                    src, stored, layout.shape, block, lambda n, i: get(n)[0][i], names,
                    layout.block, get(src.pieces[0].stored)[1],
                )  # fmt: skip
            return cache[key]

        placed = jax.make_array_from_callback(tuple(data.shape), data.sharding, callback)
        out[name] = leaf.with_data(placed)
        whole.clear()
        cache.clear()
    return out


def place_read_ahead(
    sources: dict[str, Source],
    stored: dict[str, tuple[tuple[int, ...], Any]],
    targets: dict[str, Any],
    storage: Storage,
    names: dict[str, Any],
) -> dict[str, jax.Array]:
    """As `place`, each block read by `read_block`, but placed by `storage.place`: several
    blocks read at once, the bytes in flight bounded. For storages read by byte ranges (a GGUF
    file, a remote safetensors directory); `targets` are leaves with a sharding.

    Raises:
      CheckpointError: as the storage's `read`.
    """

    def read(name: str, index: tuple[slice, ...]) -> np.ndarray:
        leaf = targets[name]
        shape = tuple(leaf.shape)
        block = _ranges(index, shape)
        return read_block(sources[name], stored, shape, block, storage, names, leaf.dtype)

    return storage_lib.place(dict(targets), read)


def stored_sharding(
    pieces: list[tuple[Source, Any]],
    stored_shape: tuple[int, ...],
    stored: dict[str, tuple[tuple[int, ...], Any]],
    names: dict[str, Any],
) -> Any:
    """The sharding to restore one stored tensor with, so that each device's shard holds the
    stored region of every block it will hold of the model weights made from it (`pieces`:
    (Source, model weight leaf) pairs): each stored axis takes a mesh axis of the weight's
    partition where that keeps every device's region inside its shard (a transposed or stacked
    axis moves with it), and is replicated otherwise (a split, cut, merged or `rope` axis).
    A sharding other than `NamedSharding` is kept as is."""
    first = pieces[0][1].sharding
    if not isinstance(first, NamedSharding):
        return first
    mesh = first.mesh
    needs = []  # (device, stored region) over all pieces
    for src, leaf in pieces:
        shape = tuple(leaf.shape)
        inner, axis = _inner(src, shape)
        for device, index in leaf.sharding.devices_indices_map(shape).items():
            block = _ranges(index, shape)
            if axis is not None:
                if src.index not in block[axis]:
                    continue
                block = block[:axis] + block[axis + 1 :]
            plan = operations.plan(src, stored_shape, inner, names)
            needs.append((device, plan.region(block)))
    candidates = []
    for _, leaf in pieces:
        for entry in leaf.sharding.spec:
            if entry is not None and entry not in candidates:
                candidates.append(entry)
    spec: list[Any] = [None] * len(stored_shape)
    for a in range(len(stored_shape)):
        for entry in candidates:
            if entry in spec or stored_shape[a] % _axis_size(mesh, entry):
                continue
            trial = spec[:a] + [entry] + spec[a + 1 :]
            held = NamedSharding(mesh, PartitionSpec(*trial)).devices_indices_map(stored_shape)
            if all(_within(held[d][a], r[a], stored_shape[a]) for d, r in needs):
                spec = trial
                break
    return NamedSharding(mesh, PartitionSpec(*spec))


def _axis_size(mesh: Any, entry: Any) -> int:
    axes = entry if isinstance(entry, tuple) else (entry,)
    return math.prod(mesh.shape[a] for a in axes)


def _within(have: slice, want: range, n: int) -> bool:
    lo, hi, _ = have.indices(n)
    return lo <= want.start and want.stop <= hi


def read_groups(
    sources: dict[str, Source], stored: dict[str, tuple[tuple[int, ...], Any]], limit: float
) -> Iterator[list[str]]:
    """The model weights in groups whose stored tensors hold about `limit` bytes at most (one
    tensor may hold more); the weights made from one stored tensor stay in one group."""
    parent: dict[str, str] = {}

    def root(name: str) -> str:
        while parent.setdefault(name, name) != name:
            name = parent[name]
        return name

    for src in sources.values():
        first = root(src.pieces[0].stored)
        for p in src.pieces[1:]:
            parent[root(p.stored)] = first
    members: dict[str, list[str]] = {}
    for out, src in sources.items():
        members.setdefault(root(src.pieces[0].stored), []).append(out)
    group: list[str] = []
    size = 0
    for outs in members.values():
        names = {p.stored for o in outs for p in sources[o].pieces}
        nbytes = sum(math.prod(stored[n][0]) * np.dtype(stored[n][1]).itemsize for n in names)
        if group and size + nbytes > limit:
            yield group
            group, size = [], 0
        group.extend(outs)
        size += nbytes
    if group:
        yield group
