"""Trees of TensorStore arrays, one array per leaf, as levanter, EasyDeL and T5X write them: the
leaves' names, shapes and dtypes read from array metadata alone, and the specs
`ppl_jax.checkpoints.mapping.storage.tensorstore_read` reads blocks of.

Two ways of keeping the arrays: a folder per leaf (zarr v2 `.zarray` or zarr v3 `zarr.json` in
it; old levanter, EasyDeL, T5X) and one OCDBT database per step whose keys are the leaves'
paths (levanter since its `manifest.json`, format version 1: `zarr3` arrays in `ocdbt`). Names
read from a checkpoint never leave its folder: a name with `..`, an absolute path or a scheme is
refused before anything is opened.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ppl_jax.checkpoints.mapping import storage
from ppl_jax.checkpoints.options import Stored
from ppl_jax.errors import CheckpointError
from ppl_jax.runtime import paths

ARRAY_FILES = {".zarray": "zarr", "zarr.json": "zarr3"}
MAX_DEPTH = 32


def check_inside(name: str, where: str) -> str:
    """`name`, a relative `/`-separated path that stays inside its folder.

    Raises:
      CheckpointError: a name that leads out (`..`, absolute, a scheme), naming `where`.
    """
    parts = name.strip("/").split("/")
    if not name or name.startswith("/") or "://" in name or any(p in ("..", "") for p in parts):
        raise CheckpointError(
            f"{where}: the stored array name {name!r} leads outside the checkpoint's folder; the "
            f"checkpoint is damaged or was not written by its trainer."
        )
    return "/".join(parts)


def folder_arrays(folder: str) -> dict[str, str]:
    """The arrays kept as folders under `folder`: name (`/`-joined relative folder) -> zarr
    driver (`zarr` for v2, `zarr3`). A folder holding an array is not searched further."""
    found: dict[str, str] = {}

    def walk(sub: str, depth: int) -> None:
        here = paths.join(folder, sub) if sub else folder
        names = paths.listdir(here)
        for marker, driver in ARRAY_FILES.items():
            if marker in names and sub:
                found[sub] = driver
                return
        if depth >= MAX_DEPTH:
            return
        for name in sorted(names):
            child = f"{sub}/{name}" if sub else name
            if paths.isdir(paths.join(folder, child)):
                walk(child, depth + 1)

    walk("", 0)
    return found


def folder_spec(folder: str, name: str, driver: str = "zarr") -> dict[str, Any]:
    """The spec of the array kept in the folder `folder/name`."""
    return {"driver": driver, "kvstore": storage.tensorstore_kvstore(paths.join(folder, name))}


def ocdbt_spec(folder: str, name: str, driver: str = "zarr3") -> dict[str, Any]:
    """The spec of the array at key `name` of the OCDBT database in `folder`."""
    base = storage.tensorstore_kvstore(folder)
    return {"driver": driver, "kvstore": {"driver": "ocdbt", "base": base, "path": name}}


def ocdbt_arrays(folder: str) -> list[str]:
    """The array names of the OCDBT database in `folder` (the keys ending `/zarr.json`; a walk
    of its index, read only where no manifest lists them)."""
    import tensorstore as ts

    store = ts.KvStore.open(ocdbt_spec(folder, "")["kvstore"]).result()
    keys = [k.decode("utf-8") for k in store.list().result()]
    return sorted(k[: -len("/zarr.json")] for k in keys if k.endswith("/zarr.json"))


def shapes(specs: dict[str, dict[str, Any]], where: str) -> Stored:
    """name -> (shape, dtype) of each array, from its metadata only (no chunk is read).

    Raises:
      CheckpointError: an array whose metadata cannot be read, naming it and `where`.
    """
    import tensorstore as ts

    out: Stored = {}
    futures = {n: ts.open(s, open=True, read=True) for n, s in specs.items()}
    for name, future in futures.items():
        try:
            array = future.result()
        except Exception as e:  # TensorStore's own errors: missing or damaged metadata
            raise CheckpointError(
                f"{where}: the stored array '{name}' cannot be opened "
                f"({str(e).splitlines()[0][:200]}); the step is damaged or incomplete."
            ) from None
        out[name] = (tuple(int(d) for d in array.shape), np.dtype(array.dtype.numpy_dtype))
    return out


def reader(specs: dict[str, dict[str, Any]], inline: dict[str, np.ndarray] | None = None):
    """A storage backend (`storage.Read`) over `specs`, and over arrays stored inline (T5X's
    small leaves kept in its msgpack file)."""
    read_ts = storage.tensorstore_read(specs)
    inline = inline or {}

    def read(name: str, index: tuple[slice, ...]) -> np.ndarray:
        if name in inline:
            return np.asarray(inline[name])[index]
        return read_ts(name, index)

    return read


def wrap_read_errors(read, where: str):
    """`read` with TensorStore's errors (a missing or truncated chunk) as one sentence."""

    def safe(name: str, index: tuple[slice, ...]) -> np.ndarray:
        try:
            return read(name, index)
        except CheckpointError:
            raise
        except Exception as e:
            raise CheckpointError(
                f"{where}: the stored array '{name}' cannot be read "
                f"({str(e).splitlines()[0][:200]}); the step is damaged or incomplete."
            ) from None

    return safe
