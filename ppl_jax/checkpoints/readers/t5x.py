"""T5X's checkpoints: `T5XCheckpoint`, read in place with TensorStore.

Layout (google-research/t5x `t5x/checkpoints.py`, measured on a checkpoint its `Checkpointer`
wrote in tests/golden/trainers/t5x):

- a model directory of steps `checkpoint_<step>/` (a save in progress is `checkpoint_<step>
  .tmp-<time>`, renamed when complete); each holds the file `checkpoint`, a msgpack state dict
  (`flax.serialization`): `{"version", "optimizer": {"target": params, "state": {"step",
  "param_states"}}}`, whose leaves are small arrays kept inline or TensorStore spec dicts
  (`driver: zarr`, `kvstore: {driver: file, path: "target.decoder.layers_0...kernel/"}`, or
  `gcs` with the dummy bucket `t5x-dummy-bucket`), the arrays in those sibling folders;
- the params are `optimizer/target` (`target` in older states); `checkpoint.params` names
  another subtree. T5X has no one model: the names are the Flax module's, and the architecture
  and the mapping are given (`checkpoint.architecture`, `checkpoint.mapping`).

A stored spec's path is read relative to the step folder, whatever its driver said, and never
leads out of it. The msgpack file is decoded by `flax.serialization.msgpack_restore`, which makes
arrays and plain data only.
"""

from __future__ import annotations

import re
from typing import Any

import jax
import numpy as np

from ppl_jax.checkpoints.checkpoint import Checkpoint, Options, Stored
from ppl_jax.checkpoints.formats import tensorstore_tree
from ppl_jax.checkpoints.mapping import storage
from ppl_jax.checkpoints.readers.step_folders import StepFolders
from ppl_jax.errors import CheckpointError
from ppl_jax.runtime import paths

STATE = "checkpoint"
STEP = re.compile(r"checkpoint_(\d+)")
PARAMS = ("optimizer/target", "target")


def _number(name: str) -> int | None:
    found = STEP.fullmatch(name.rstrip("/").rsplit("/", 1)[-1])
    return int(found.group(1)) if found else None


def _flatten(tree: Any, prefix: str = "") -> dict[str, Any]:
    """Leaves of the msgpack state by `/`-joined path; a TensorStore spec dict is a leaf."""
    if isinstance(tree, dict) and not {"driver", "kvstore"} <= set(tree):
        out: dict[str, Any] = {}
        for key, value in tree.items():
            out.update(_flatten(value, f"{prefix}/{key}" if prefix else str(key)))
        return out
    return {prefix: tree}


class T5XCheckpoint(StepFolders, Checkpoint):
    """A T5X model directory of `checkpoint_<step>/` steps, or one step (module docstring)."""

    format = "t5x"
    STEP, FOLDER = STEP, "checkpoint_{step}"
    NONE_YET = "complete T5X checkpoint step yet"
    formats = ("t5x",)
    layout_name = "a T5X checkpoint (msgpack state, TensorStore arrays; no architecture)"
    tokenizer_files = "T5X keeps the vocabulary in its gin config, not in the checkpoint"

    def __init__(self, path: str, options: Options | None = None, why: str = ""):
        super().__init__(path, options, why)
        self.single = paths.isfile(paths.join(path, STATE))
        self._trees: dict[int | None, tuple[Stored, dict[str, Any], dict[str, Any]]] = {}

    @classmethod
    def claims(cls, path: str, options: Options) -> str | None:
        if _number(path) is not None and paths.isfile(paths.join(path, STATE)):
            return f"a T5X step folder (checkpoint_<step>/{STATE})"
        if paths.isdir(path) and any(
            _number(n) is not None and paths.isfile(paths.join(path, n, STATE))
            for n in paths.listdir(path)
        ):
            return f"checkpoint_<step> folders with T5X's msgpack '{STATE}' file"
        return None

    def complete(self, folder: str) -> bool:
        return paths.isfile(paths.join(folder, STATE))

    def _tree(self, step: int | None) -> tuple[Stored, dict[str, Any], dict[str, Any]]:
        """(name -> shape, dtype), name -> TensorStore spec, name -> inline array."""
        if step in self._trees:
            return self._trees[step]
        from flax import serialization

        folder, where = self._folder(step), self._where(step)
        try:
            state = serialization.msgpack_restore(paths.read_bytes(paths.join(folder, STATE)))
        except Exception as e:  # msgpack's own errors for a truncated or foreign file
            raise CheckpointError(
                f"{where}: its '{STATE}' file is not a T5X msgpack state ({e})."
            ) from None
        leaves = _flatten(state)
        given = self.mapping_file().get("params", "") or self.options.params
        prefix = given.strip("/") if given else next(
            (p for p in PARAMS if any(n.startswith(p + "/") for n in leaves)), ""
        )  # fmt: skip
        if not any(n.startswith(prefix + "/") for n in leaves):
            tops = sorted({n.split("/")[0] for n in leaves})
            raise CheckpointError(
                f"{where}: no params subtree '{prefix or PARAMS[0]}' (top-level names: "
                f"{', '.join(tops)}); set checkpoint.params."
            )
        stored: Stored = {}
        specs: dict[str, Any] = {}
        inline: dict[str, Any] = {}
        for full, leaf in leaves.items():
            if not full.startswith(prefix + "/"):
                continue
            name = full[len(prefix) + 1 :]
            if isinstance(leaf, dict):
                rel = tensorstore_tree.check_inside(str(leaf["kvstore"].get("path", "")), where)
                spec = tensorstore_tree.folder_spec(folder, rel, str(leaf.get("driver", "zarr")))
                specs[name] = spec
                shape = tuple(int(d) for d in leaf.get("metadata", {}).get("shape", ()))
                stored[name] = (shape, np.dtype(leaf.get("dtype", "float32")))
            elif isinstance(leaf, np.ndarray | np.generic):
                inline[name] = np.asarray(leaf)
                stored[name] = (inline[name].shape, inline[name].dtype)
        self._trees[step] = (stored, specs, inline)
        return self._trees[step]

    def stored(self, step: int | None) -> Stored:
        return self._tree(self.resolve_step(step))[0]

    def read(self, step: int | None, abstract: dict[str, jax.ShapeDtypeStruct]) -> dict[str, Any]:
        step = self.resolve_step(step)
        _, specs, inline = self._tree(step)
        read = tensorstore_tree.reader(specs, inline)
        return storage.place(abstract, tensorstore_tree.wrap_read_errors(read, self._where(step)))

    def layout_lines(self, step: int | None) -> list[str]:
        step = self.resolve_step(step)
        return [
            f"{'checkpoint' if step is None else f'step {step}'}: {self._folder(step)}/{STATE}",
            f"params: {len(self.stored(step))} arrays (msgpack state, TensorStore folders)",
        ]
