"""Checkpoints written with the Orbax v1 API (`orbax.checkpoint.experimental.v1`, `ocp.v1`):
`OrbaxV1`, read with that API.

Layout (orbax.readthedocs.io, "Checkpoint format", and as orbax-checkpoint 0.12 writes it):

- a checkpoint is a folder holding `_CHECKPOINT_METADATA` (JSON; `item_handlers` names each
  checkpointable's handler) and, for one written by `ocp.save_pytree`/`save_checkpointables`,
  an empty marker file `orbax.checkpoint`; each checkpointable is a subfolder (`state` as 0.12's
  `save_pytree` names it, `pytree` in later releases), a PyTree of OCDBT arrays;
- a training run (`ocp.training.Checkpointer(root).save_pytree(step, tree)`) is a folder of
  numbered step folders, each such a checkpoint (finalized steps are Orbax's own notion,
  `ppl_jax.checkpoints.formats.orbax.finalized_steps`).

The PyTree checkpointable read is `checkpoint.item` or the one whose handler is a PyTree handler
(`pytree` first); inside it the params subtree is found as for other trainers' trees
(`ppl_jax.checkpoints.readers.foreign.params_of`), and mapped onto the model's weights
(`ppl_jax.checkpoints.mapping.language`). The tree's shapes and dtypes come from `ocp.v1.metadata`,
the arrays from `ocp.v1.load` with partial loading, straight into their target shardings.
"""

from __future__ import annotations

import json
from typing import Any

import jax

from ppl_jax.checkpoints.checkpoint import Checkpoint, Options, Stored
from ppl_jax.checkpoints.formats import damage, orbax
from ppl_jax.checkpoints.readers import foreign
from ppl_jax.errors import CheckpointError
from ppl_jax.models.interface import nest_weights, weight_paths
from ppl_jax.runtime import paths

MARKER = "orbax.checkpoint"
METADATA = "_CHECKPOINT_METADATA"
V1 = "orbax.checkpoint.experimental.v1"
PYTREE_NAMES = ("pytree", "state")


def _handlers(folder: str) -> dict[str, str]:
    """`item_handlers` of a checkpoint's `_CHECKPOINT_METADATA` ({} when absent or unreadable)."""
    try:
        meta = json.loads(paths.read_bytes(paths.join(folder, METADATA)).decode("utf-8"))
    except (OSError, ValueError):
        return {}
    handlers = meta.get("item_handlers") if isinstance(meta, dict) else None
    return {str(k): str(v) for k, v in handlers.items()} if isinstance(handlers, dict) else {}


def _latest_numbered(folder: str) -> int | None:
    """The largest numbered subfolder of `folder` (finalized or not), or None."""
    try:
        names = paths.listdir(folder) if paths.isdir(folder) else []
    except OSError:
        return None
    numbers = [int(n) for n in names if n.isdigit()]
    return max(numbers) if numbers else None


def is_v1(folder: str) -> bool:
    """A checkpoint written with the v1 API: its marker file, or v1 handlers named in its
    metadata."""
    if paths.isfile(paths.join(folder, MARKER)):
        return True
    return any(V1 in h for h in _handlers(folder).values())


class OrbaxV1(Checkpoint):
    """A checkpoint (or a run of step checkpoints) of the Orbax v1 API (module docstring)."""

    format = "orbax"
    formats = ("orbax",)
    layout_name = "an Orbax v1 checkpoint"
    tokenizer_files = "an Orbax v1 checkpoint of a tree keeps none"

    def __init__(self, path: str, options: Options | None = None, why: str = ""):
        super().__init__(path, options, why)
        self.bare = paths.isfile(paths.join(path, MARKER)) or bool(_handlers(path))
        self._trees: dict[int | None, tuple[Stored, dict[str, str], str]] = {}
        self._finalized: set[int] = set()  # steps seen finalized (a finalized step stays so)

    @classmethod
    def claims(cls, path: str, options: Options) -> str | None:
        if paths.isfile(paths.join(path, MARKER)):
            return f"the Orbax v1 marker file '{MARKER}'"
        if any(V1 in h for h in _handlers(path).values()):
            return f"Orbax v1 handlers in {METADATA}"
        latest = _latest_numbered(path)
        if latest is not None and is_v1(paths.join(path, str(latest))):
            return f"numbered steps whose latest ({latest}) was written by the Orbax v1 API"
        return None

    def steps(self) -> list[int]:
        return [] if self.bare else orbax.finalized_steps(self.path)

    def resolve_step(self, step: int | None) -> int | None:
        """As `Checkpoint.resolve_step`; a step seen finalized before is not looked up again
        (each look opens an Orbax `CheckpointManager`, a barrier of every process)."""
        if self.bare:
            return None
        if step is None or step not in self._finalized:
            step = orbax.pick_step(self.path, step)
            self._finalized.add(step)
        return step

    def _checkpoint(self, step: int | None) -> str:
        return self.path if step is None else paths.join(self.path, str(step))

    def item(self, step: int | None) -> str:
        """The PyTree checkpointable read (`checkpoint.item`, else found).

        Raises:
          CheckpointError: none, or several and none of `PYTREE_NAMES` (naming them).
        """
        folder = self._checkpoint(step)
        handlers = _handlers(folder)
        if self.options.item:
            if self.options.item not in handlers and not paths.isdir(
                paths.join(folder, self.options.item)
            ):
                raise CheckpointError(
                    f"checkpoint.item={self.options.item!r} is not a checkpointable of "
                    f"{folder!r} (it holds {', '.join(sorted(handlers)) or 'none'})."
                )
            return self.options.item
        trees = [n for n, h in handlers.items() if h.endswith("PyTreeHandler")]
        for name in PYTREE_NAMES:
            if name in trees:
                return name
        if len(trees) == 1:
            return trees[0]
        raise CheckpointError(
            f"{folder!r} holds the checkpointables {', '.join(sorted(handlers)) or 'none'}, "
            f"{'none' if not trees else 'several'} of them a PyTree; set checkpoint.item to the "
            f"one with the params."
        )

    def _tree(self, step: int | None) -> tuple[Stored, dict[str, str], str]:
        if step not in self._trees:
            import orbax.checkpoint.experimental.v1 as ocp

            item = self.item(step)
            item_dir = paths.join(self._checkpoint(step), item)
            paths.refuse_links_out(self._checkpoint(step), self.path)
            damage.check_tree_metadata(item_dir, self.path, step, item)
            damage.check_ocdbt_index(item_dir, self.path, step, item)
            try:
                meta = ocp.metadata(
                    paths.absolute(self._checkpoint(step)), checkpointable_name=item
                )
                tree = orbax.flatten_metadata(meta.metadata)
            except Exception as e:  # Orbax's own errors for unreadable metadata
                raise damage.damaged(
                    self.path, step, f"the tree metadata of its '{item}' cannot be read", e
                ) from None
            params = self.mapping_file().get("params", "") or self.options.params
            self._trees[step] = foreign.params_of(tree, params, self.path, step)
        return self._trees[step]

    def stored(self, step: int | None) -> Stored:
        return self._tree(self.resolve_step(step))[0]

    def read(self, step: int | None, abstract: dict[str, jax.ShapeDtypeStruct]) -> dict[str, Any]:
        import orbax.checkpoint.experimental.v1 as ocp

        step = self.resolve_step(step)
        full = self._tree(step)[1]
        item = self.item(step)
        folder = paths.absolute(self._checkpoint(step))

        def load(subset: dict[str, jax.ShapeDtypeStruct]) -> dict[str, Any]:
            context = ocp.Context()
            context.pytree.loading.partial_load = True
            with context:
                got = ocp.load(folder, nest_weights(subset), checkpointable_name=item)
            flat = weight_paths(got)
            return {name: flat.get(name) for name in subset}

        got = orbax.read_arrays(
            paths.join(self._checkpoint(step), item), self.path, step,
            {full[n]: v for n, v in abstract.items()}, item, restore=load,
        )  # fmt: skip
        return {n: got[full[n]] for n in abstract}

    def files(self, step: int | None) -> str:
        return self._checkpoint(step)

    def layout_lines(self, step: int | None) -> list[str]:
        step = self.resolve_step(step)
        folder = self._checkpoint(step)
        handlers = _handlers(folder)
        names = ", ".join(f"{n} ({h.rsplit('.', 1)[-1]})" for n, h in sorted(handlers.items()))
        prefix = self._tree(step)[2]
        return [
            f"{'checkpoint' if self.bare else f'step {step}'}: checkpointables {names or '?'}",
            f"item: {self.item(step)}   params: {prefix or '(the whole item)'}",
        ]
