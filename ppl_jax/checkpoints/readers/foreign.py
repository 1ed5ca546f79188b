"""Orbax checkpoints that other trainers write (`ForeignOrbax`): where the params are, read through
a mapping (`ppl_jax.checkpoints.mapping.language`) into a model's params.

Layouts (measured with the trainers themselves; docs/other-trainers.md):

- a `CheckpointManager` directory of numbered steps (or a MaxText run folder, whose steps are
  under `checkpoints/`), each step with one PyTree item: `state` (ppl_jax), `items` (MaxText),
  `default` (`CheckpointManager.save(step, args=StandardSave(state))`), `model` (an NNX
  `Composite(model=..., opt=...)`), `pytree` (Orbax v1), or a named one (`checkpoint.item`);
- a bare `StandardCheckpointer` directory (gemma's `gm.ckpts.save_params`): no steps.

Inside the item, the params subtree is `params/params` (MaxText's train state), `params` (a
Linen `TrainState`), or the whole tree (an NNX model state, a bare params tree), or a named one
(`checkpoint.params`). A trailing `/value` (NNX variables, Linen boxed metadata such as
`nn.Partitioned`) is unwrapped. Finalized steps are Orbax's own notion (`orbax.finalized_steps`).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax

from ppl_jax.checkpoints.checkpoint import Checkpoint, Options, Stored
from ppl_jax.checkpoints.formats import damage, orbax
from ppl_jax.errors import CheckpointError
from ppl_jax.runtime import paths

ITEMS = ("state", "items", "default", "model", "pytree")
PARAMS = ("params/params", "params")
ITEM_FILES = ("_METADATA", "manifest.ocdbt", "checkpoint")


@dataclasses.dataclass(frozen=True)
class TreeLocation:
    """Where an Orbax checkpoint keeps its params.

    Attributes:
      root: the folder of step folders (or the bare item folder).
      bare: no steps (a `StandardCheckpointer` directory): `root` is the item.
      item: the item's name inside a step folder ('' : the step folder is the item).
      params: the params subtree's `/`-joined path inside the item ('' : the whole tree).
    """

    root: str
    bare: bool
    item: str
    params: str

    def item_dir(self, step: int | None) -> str:
        if self.bare:
            return self.root
        folder = paths.join(self.root, str(step))
        return paths.join(folder, self.item) if self.item else folder


def is_item(folder: str) -> bool:
    """An Orbax item folder (its tree metadata, OCDBT manifest or msgpack file is there)."""
    return any(paths.isfile(paths.join(folder, f)) for f in ITEM_FILES)


def locate(directory: str, item: str = "", params: str = "") -> TreeLocation:
    """Where `directory` keeps its params, from its latest finalized step.

    Args:
      directory: the checkpoint folder (a run folder with `checkpoints/`, a folder of steps, or
        a bare item folder).
      item, params: explicit item name and params path ('' : found).

    Raises:
      CheckpointError: no such folder, no finalized step, no item or no params found (naming
        what is there and the setting to give).
    """
    if is_item(directory) and not item:
        return TreeLocation(directory, True, "", params)
    root = directory
    sub = paths.join(directory, "checkpoints")
    if not orbax_steps(directory) and paths.isdir(sub) and orbax_steps(sub):
        root = sub  # a MaxText run folder
    steps = orbax.finalized_steps(root)
    if not steps:
        orbax.pick_step(root, None)  # the sentence for a folder of no finalized step
    step_dir = paths.join(root, str(steps[-1]))
    names = sorted(paths.listdir(step_dir))
    if item:
        if item not in names:
            raise CheckpointError(
                f"checkpoint.item={item!r} is not an item of step {steps[-1]} in {directory!r} "
                f"(it holds {', '.join(names)})."
            )
    else:
        found = [n for n in ITEMS if n in names and is_item(paths.join(step_dir, n))]
        if found:
            item = found[0]
        elif not is_item(step_dir):
            items = [n for n in names if is_item(paths.join(step_dir, n))]
            if len(items) != 1:
                raise CheckpointError(
                    f"step {steps[-1]} of {directory!r} holds the items {items or names}, none "
                    f"of them a known one ({', '.join(ITEMS)}); set checkpoint.item to the one "
                    f"with the params."
                )
            item = items[0]
    return TreeLocation(root, False, item, params)


def has_steps(directory: str) -> bool:
    """Whether `directory` holds an item or a finalized step (itself or under `checkpoints/`)."""
    if is_item(directory):
        return True
    return bool(orbax_steps(directory) or orbax_steps(paths.join(directory, "checkpoints")))


def orbax_steps(folder: str) -> list[int]:
    try:
        return orbax.finalized_steps(folder)
    except CheckpointError:
        return []


def stored_params(
    location: TreeLocation, directory: str, step: int | None
) -> tuple[Stored, dict[str, str], str]:
    """The params the item stores: (name -> (shape, dtype), name -> stored name, params path).

    Names are relative to the params subtree, with a trailing `/value` removed; stored names are
    the item's own (what `orbax.read_arrays` takes). The item's tree metadata and OCDBT index are
    checked first, so that lost array files are reported as damage, not as missing names.

    Raises:
      CheckpointError: damaged tree metadata or index; no params subtree (naming
        `checkpoint.params`).
    """
    item_dir = location.item_dir(step)
    paths.refuse_links_out(item_dir, directory)
    damage.check_tree_metadata(item_dir, directory, step, location.item)
    damage.check_ocdbt_index(item_dir, directory, step, location.item)
    try:
        tree = orbax.tree_metadata(item_dir)
    except Exception as e:  # Orbax's own errors for an unreadable `_METADATA`
        raise damage.damaged(
            directory, step, "the tree metadata of its item cannot be read", e
        ) from None
    return params_of(tree, location.params, directory, step)


def params_of(
    tree: Stored, params: str, directory: str, step: int | None
) -> tuple[Stored, dict[str, str], str]:
    """`stored_params` of a stored tree already read: the params subtree `params` ('' : found,
    `PARAMS`), its names relative to it with a trailing `/value` removed.

    Raises:
      CheckpointError: an empty tree (its metadata lost: damage); no params subtree.
    """
    if not tree:
        raise damage.damaged(directory, step, "its tree metadata lists no arrays")
    prefix = params
    if not prefix:
        prefix = next((p for p in PARAMS if any(n.startswith(p + "/") for n in tree)), "")
    elif not any(n.startswith(prefix + "/") for n in tree):
        tops = sorted({n.split("/")[0] for n in tree})
        raise CheckpointError(
            f"checkpoint.params={prefix!r} is not a subtree of the stored item in {directory!r} "
            f"(its top-level names: {', '.join(tops)})."
        )
    cut = len(prefix) + 1 if prefix else 0
    shapes, names = {}, {}
    for full, (shape, dtype) in tree.items():
        if prefix and not full.startswith(prefix + "/"):
            continue
        name = full[cut:].removesuffix("/value") if full[cut:] != "value" else full[cut:]
        if dtype is None:
            continue  # Python scalars (a step counter) are not weights
        shapes[name], names[name] = (shape, dtype), full
    return shapes, names, prefix


class ForeignOrbax(Checkpoint):
    """Another trainer's Orbax checkpoint (MaxText, the gemma library, a Linen `TrainState`, an
    NNX state; see the module docstring), read through a mapping; its architecture is given
    (`checkpoint.architecture`)."""

    format = "orbax"
    formats = ("orbax",)
    layout_name = "another trainer's Orbax checkpoint"
    tokenizer_files = "another trainer's Orbax checkpoint keeps none"

    def __init__(self, path: str, options: Options | None = None, why: str = ""):
        super().__init__(path, options, why)
        self._location: TreeLocation | None = None
        self._trees: dict[int | None, tuple[Stored, dict[str, str], str]] = {}
        self._finalized: set[int] = set()  # steps seen finalized (a finalized step stays so)

    def _tree(self, step: int | None) -> tuple[Stored, dict[str, str], str]:
        """`stored_params` of a resolved step, read once (a finalized step does not change)."""
        if step not in self._trees:
            self._trees[step] = stored_params(self.location(), self.path, step)
        return self._trees[step]

    @classmethod
    def claims(cls, path: str, options: Options) -> str | None:
        if is_item(path):
            return "an Orbax item folder (_METADATA, manifest.ocdbt) without steps"
        if options.names_a_tree:
            return "checkpoint.mapping, item or params given"
        if orbax_steps(paths.join(path, "checkpoints")) and not orbax_steps(path):
            return "a run folder whose Orbax steps are under checkpoints/ (MaxText)"
        steps = orbax_steps(path)
        if steps:
            return f"numbered Orbax steps whose latest ({steps[-1]}) has no ppl_jax metadata item"
        return None

    def location(self) -> TreeLocation:
        """Where the params are (`locate`, with `checkpoint.item`/`params` or the mapping
        file's)."""
        if self._location is None:
            file = self.mapping_file()
            item = self.options.item or file.get("item", "")
            self._location = locate(self.path, item, file.get("params", "") or self.options.params)
        return self._location

    def steps(self) -> list[int]:
        if self._location is None and not has_steps(self.path):
            return []  # a run that has not finalized its first step yet (watch mode)
        location = self.location()
        return [] if location.bare else orbax.finalized_steps(location.root)

    def resolve_step(self, step: int | None) -> int | None:
        """As `Checkpoint.resolve_step`; a step seen finalized before is not looked up again
        (each look opens an Orbax `CheckpointManager`, a barrier of every process)."""
        location = self.location()
        if location.bare:
            return None
        if step is None or step not in self._finalized:
            step = orbax.pick_step(location.root, step)
            self._finalized.add(step)
        return step

    def stored(self, step: int | None) -> Stored:
        return self._tree(self.resolve_step(step))[0]

    def read(self, step: int | None, abstract: dict[str, jax.ShapeDtypeStruct]) -> dict[str, Any]:
        step = self.resolve_step(step)
        location = self.location()
        full = self._tree(step)[1]
        got = orbax.read_arrays(
            location.item_dir(step), self.path, step, {full[n]: v for n, v in abstract.items()},
            location.item,
        )  # fmt: skip
        return {n: got[full[n]] for n in abstract}

    def files(self, step: int | None) -> str:
        location = self.location()
        return location.root if location.bare else paths.join(location.root, str(step))

    def layout_lines(self, step: int | None) -> list[str]:
        step = self.resolve_step(step)
        location = self.location()
        lines = []
        if not location.bare:
            folder = paths.join(location.root, str(step))
            lines.append(f"step {step} items: {', '.join(sorted(paths.listdir(folder)))}")
        prefix = self._tree(step)[2]
        item = "(bare directory)" if location.bare else location.item or "(the step folder)"
        lines.append(f"item: {item}   params: {prefix or '(the whole item)'}")
        return lines
