"""Where the stored tensors of a mapping (`ppl_jax.checkpoints.mapping`) are read from: the
`Storage` protocol, and the storages that are not a reader's own.

A storage answers one question, `read(stored_name, index) -> np.ndarray`: the region `index` (one
contiguous `slice` per stored axis, step 1) of a stored tensor, in its stored dtype, in host
memory. `ppl_jax.checkpoints.blocks` asks it for the region that each device's block of a model
weight needs (`operations.Plan.region`), so a storage that can read a region alone (safetensors
slices, TensorStore chunks, byte ranges) never reads a model whole on one host. The storages:

- `ppl_jax.checkpoints.hf.Safetensors`: a Hugging Face directory's safetensors files, each region
  read on its own (`safe_open(...).get_slice`);
- `DeviceArrays`: stored tensors restored onto the devices (Orbax through TensorStore,
  `ppl_jax.checkpoints.foreign`, each process reading only its own devices' chunks), a region
  read back from the device shard that holds it;
- `Arrays`: NumPy arrays in memory (tests, and trees a program holds).

A new storage (TensorStore per leaf, byte ranges over fsspec) is a class with that one method;
nothing else in the engine changes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

import jax
import numpy as np

from ppl_jax.errors import CheckpointError

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
    that device's blocks need: `ppl_jax.checkpoints.blocks.stored_sharding`)."""

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
