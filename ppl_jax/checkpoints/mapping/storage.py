"""Where the stored tensors of a mapping (`ppl_jax.checkpoints.mapping.language`) are read from: the
`Storage` protocol, and the storages that are not a reader's own.

A storage answers one question, `read(stored_name, index) -> np.ndarray`: the region `index` (one
contiguous `slice` per stored axis, step 1) of a stored tensor, in its stored dtype, in host
memory. `ppl_jax.checkpoints.mapping.blocks` asks it for the region that each device's block of a
model weight needs (`operations.ReadPlan.region`), so a storage that can read a region alone
(safetensors slices, TensorStore chunks, byte ranges) never reads a model whole on one host. The
storages:

- `ppl_jax.checkpoints.formats.safetensors.Safetensors`: a Hugging Face directory's safetensors
  files, each region read on its own (`safe_open(...).get_slice`);
- `DeviceArrays`: stored tensors restored onto the devices (Orbax through TensorStore,
  `ppl_jax.checkpoints.readers.foreign`, each process reading only its own devices' chunks), a
  region read back from the device shard that holds it;
- `Arrays`: NumPy arrays in memory (tests, and trees a program holds);
- `tensorstore_read`: TensorStore arrays, one per leaf (levanter's, EasyDeL's, T5X's), a region
  read as the chunks it touches;
- `ppl_jax.checkpoints.readers.huggingface.RangedSafetensors`: safetensors files on a bucket (or
  on disk) read by byte ranges.

A new storage is a class (or function) with that one method; nothing else in the engine changes.

`place` turns a read function into `jax.Array`s for a reader's `read` (stored tensors by their
names) and for a remote Hugging Face directory's weights: for each leaf of an abstract tree it asks
only for the blocks of this process's devices (a block several devices hold is read once),
`READ_WORKERS` at a time, and keeps at most `budget` bytes of blocks on the host beyond the arrays
already placed (one leaf may exceed it alone). So a process holds about its own shard of the
weights, plus the budget.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol

import jax
import numpy as np

from ppl_jax.errors import CheckpointError, ConfigError
from ppl_jax.runtime import paths

Index = tuple[slice, ...]


class Storage(Protocol):
    """Reads regions of stored tensors (see the module docstring)."""

    def read(self, stored_name: str, index: Index) -> np.ndarray:
        """The region `index` (a `slice(start, stop)` per axis) of the stored tensor
        `stored_name`, in its stored dtype.

        Raises:
          CheckpointError: the tensor cannot be read (naming it).
        """
        ...


class Arrays:
    """Stored tensors held as arrays in host memory (name -> `np.ndarray`)."""

    def __init__(self, arrays: Mapping[str, Any]):
        self.arrays = arrays

    def read(self, stored_name: str, index: Index) -> np.ndarray:
        return np.asarray(self.arrays[stored_name][index])


def _covers(shard_index: tuple[slice, ...], shape: tuple[int, ...], index: Index) -> bool:
    for have, want, n in zip(shard_index, index, shape, strict=True):
        lo, hi, _ = have.indices(n)
        if want.start < lo or want.stop > hi:
            return False
    return True


class DeviceArrays:
    """Stored tensors restored as `jax.Array`s (name -> array), each region read back from an
    addressable shard that holds it (the restore's sharding makes each device's shard hold what
    that device's blocks need: `ppl_jax.checkpoints.mapping.blocks.stored_sharding`)."""

    def __init__(self, arrays: Mapping[str, jax.Array]):
        self.arrays = arrays

    def read(self, stored_name: str, index: Index) -> np.ndarray:
        array = self.arrays[stored_name]
        for shard in array.addressable_shards:
            if _covers(shard.index, array.shape, index):
                local = tuple(
                    slice(w.start - (h.indices(n)[0]), w.stop - (h.indices(n)[0]))
                    for h, w, n in zip(shard.index, index, array.shape, strict=True)
                )
                return np.asarray(shard.data[local])
        if array.is_fully_addressable:
            return np.asarray(array[index])
        raise CheckpointError(
            f"the stored '{stored_name}' was restored without the region {index} on this "
            f"process's devices."
        )


READ_WORKERS = 8  # blocks read at once (a remote block's ranges are fetched concurrently too)
MIN_BUDGET, MAX_BUDGET = 16 << 20, 1 << 30
BUDGET_SHARE = 0.1  # of the process's own share of the bytes

Read = Callable[[str, Index], np.ndarray]


def _key(index: tuple[slice, ...], shape: tuple[int, ...]) -> tuple[tuple[int, int], ...]:
    return tuple(s.indices(n)[:2] for s, n in zip(index, shape, strict=True))


def local_blocks(leaf: Any) -> dict[tuple, tuple[slice, ...]]:
    """The distinct blocks of `leaf` (shape, sharding) that this process's devices hold."""
    blocks: dict[tuple, tuple[slice, ...]] = {}
    for index in leaf.sharding.addressable_devices_indices_map(tuple(leaf.shape)).values():
        index = tuple(index) if index is not None else ()
        index = index + (slice(None),) * (len(leaf.shape) - len(index))
        blocks.setdefault(_key(index, tuple(leaf.shape)), index)
    return blocks


def _nbytes(index: tuple[slice, ...], leaf: Any) -> int:
    size = math.prod(b - a for a, b in _key(index, tuple(leaf.shape)))
    return size * np.dtype(leaf.dtype).itemsize


def place(
    abstract: dict[str, jax.ShapeDtypeStruct], read: Read, budget: int | None = None
) -> dict[str, jax.Array]:
    """Each leaf of `abstract` as a `jax.Array` of its shape, dtype and sharding, read by `read`.

    Args:
      abstract: name -> `jax.ShapeDtypeStruct(shape, dtype, sharding=...)`, in reading order.
      read: the storage backend: `read(name, index)` returns the block `index` of `name`, in any
        dtype (cast to the leaf's) and of the block's shape.
      budget: bytes of blocks read ahead at most (None: `BUDGET_SHARE` of this process's share,
        between `MIN_BUDGET` and `MAX_BUDGET`).

    Returns:
      name -> `jax.Array`.

    Raises:
      Whatever `read` raises (the other reads in flight are cancelled or awaited first).
    """
    names = list(abstract)
    blocks = [local_blocks(abstract[n]) for n in names]
    sizes = [
        sum(_nbytes(i, abstract[n]) for i in b.values()) for n, b in zip(names, blocks, strict=True)
    ]
    if budget is None:
        budget = int(min(MAX_BUDGET, max(MIN_BUDGET, BUDGET_SHARE * sum(sizes))))
    out: dict[str, jax.Array] = {}
    pending: dict[int, dict[tuple, Any]] = {}
    with ThreadPoolExecutor(READ_WORKERS) as pool:
        try:
            ahead, in_flight = 0, 0
            for i, name in enumerate(names):
                while ahead < len(names) and (ahead <= i or in_flight + sizes[ahead] <= budget):
                    pending[ahead] = {
                        k: pool.submit(read, names[ahead], index)
                        for k, index in blocks[ahead].items()
                    }
                    in_flight += sizes[ahead]
                    ahead += 1
                leaf = abstract[name]
                got = {k: _as(f.result(), leaf, k) for k, f in pending.pop(i).items()}
                out[name] = jax.make_array_from_callback(
                    tuple(leaf.shape),
                    leaf.sharding,
                    lambda index, got=got, leaf=leaf: got[_key(tuple(index), tuple(leaf.shape))],
                )
                in_flight -= sizes[i]
                del got
        except BaseException:
            for futures in pending.values():
                for f in futures.values():
                    f.cancel()
            raise
    return out


def _as(block: np.ndarray, leaf: Any, key: tuple) -> np.ndarray:
    block = np.asarray(block)
    want = tuple(b - a for a, b in key)
    if block.shape != want:
        raise ValueError(f"a storage backend gave a block of shape {block.shape}, not {want}")
    return block.astype(leaf.dtype, copy=False)


def tensorstore_kvstore(path: str) -> dict[str, Any]:
    """The TensorStore kvstore spec of a folder: TensorStore's own drivers, which read only the
    chunks (or byte ranges of an OCDBT database) a read touches: `file` for a local path, `gcs`
    for `gs://`, `s3` for `s3://`. Other schemes have no TensorStore driver.

    Raises:
      ConfigError: a scheme TensorStore does not read.
    """
    scheme = paths.scheme(path)
    if scheme is None:
        return {"driver": "file", "path": paths.absolute(path).rstrip("/") + "/"}
    if scheme in ("gs", "s3"):
        bucket, _, key = path.split("://", 1)[1].partition("/")
        driver = {"gs": "gcs", "s3": "s3"}[scheme]
        return {"driver": driver, "bucket": bucket, "path": key.rstrip("/") + "/" if key else ""}
    raise ConfigError(
        f"{path!r}: TensorStore arrays are read from local paths, gs:// and s3:// (TensorStore's "
        f"own drivers); copy the checkpoint to one of them."
    )


def tensorstore_read(spec: dict[str, Any]) -> Read:
    """A storage backend over TensorStore arrays (levanter's and EasyDeL's per-leaf zarr
    arrays, T5X's): `read(name, index)` reads the block `index` of the array `spec[name]`
    (opened on first use), that is the chunks it touches and no others.

    Args:
      spec: stored name -> its TensorStore spec (`{"driver": "zarr", "kvstore":
        tensorstore_kvstore(folder)}` and the array's path).
    """
    import tensorstore as ts

    opened: dict[str, Any] = {}

    def read(name: str, index: tuple[slice, ...]) -> np.ndarray:
        if name not in opened:
            opened[name] = ts.open(spec[name], open=True, read=True).result()
        return np.asarray(opened[name][index].read().result())

    return read
