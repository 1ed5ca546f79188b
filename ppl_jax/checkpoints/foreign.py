"""Orbax checkpoints that other trainers write: where the params are, and reading them through a
mapping (`ppl_jax.checkpoints.mapping`) into a model's params.

Layouts (measured in `INTEROP.md`):

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
from collections import defaultdict
from typing import Any

import jax
import numpy as np

from ppl_jax.checkpoints import blocks, damage, mapping, orbax, storage
from ppl_jax.errors import CheckpointError
from ppl_jax.models.interface import nest_weights, weight_paths
from ppl_jax.runtime import paths

ITEMS = ("state", "items", "default", "model", "pytree")
PARAMS = ("params/params", "params")
ITEM_FILES = ("_METADATA", "manifest.ocdbt", "checkpoint")
READ_GROUP_BYTES = 1 << 30  # stored bytes restored at a time


@dataclasses.dataclass(frozen=True)
class Layout:
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


def locate(directory: str, item: str = "", params: str = "") -> Layout:
    """The layout of `directory`, from its latest finalized step.

    Args:
      directory: the checkpoint folder (a run folder with `checkpoints/`, a folder of steps, or
        a bare item folder).
      item, params: explicit item name and params path ('' : found).

    Raises:
      CheckpointError: no such folder, no finalized step, no item or no params found (naming
        what is there and the setting to give).
    """
    if is_item(directory) and not item:
        return Layout(directory, True, "", params)
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
    return Layout(root, False, item, params)


def has_steps(directory: str) -> bool:
    """Whether `directory` holds an item or a finalized step (itself or under `checkpoints/`)."""
    if is_item(directory):
        return True
    return bool(orbax_steps(directory) or orbax_steps(paths.join(directory, "checkpoints")))


def kind_of(directory: str, options: bool) -> str | None:
    """`own` (ppl_jax's layout: a `metadata` item in the latest step) or `foreign` for an Orbax
    directory; None while it holds no step to tell (watch mode). `options`: a mapping, item or
    params path was given (foreign)."""
    if options or is_item(directory) or paths.isdir(paths.join(directory, "checkpoints")):
        return "foreign"
    steps = orbax_steps(directory)
    if not steps:
        return None
    own = paths.isdir(paths.join(directory, str(steps[-1]), orbax.METADATA))
    return "own" if own else "foreign"


def orbax_steps(folder: str) -> list[int]:
    try:
        return orbax.finalized_steps(folder)
    except CheckpointError:
        return []


def stored_params(
    layout: Layout, directory: str, step: int | None
) -> tuple[dict[str, tuple[tuple[int, ...], Any]], dict[str, str], str]:
    """The params the item stores: (name -> (shape, dtype), name -> stored name, params path).

    Names are relative to the params subtree, with a trailing `/value` removed; stored names are
    the item's own (what `orbax.read_arrays` takes).

    Raises:
      CheckpointError: damaged tree metadata; no params subtree (naming `checkpoint.params`).
    """
    item_dir = layout.item_dir(step)
    damage.check_links_inside(item_dir, directory)
    damage.check_tree_metadata(item_dir, directory, step, layout.item)
    try:
        tree = orbax.tree_metadata(item_dir)
    except Exception as e:  # Orbax's own errors for an unreadable `_METADATA`
        raise damage.damaged(
            directory, step, "the tree metadata of its item cannot be read", e
        ) from None
    prefix = layout.params
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


def restore(
    layout: Layout,
    directory: str,
    step: int | None,
    rules: list[dict[str, Any]],
    architecture: dict[str, Any],
    target: Any,
    where: str,
) -> Any:
    """The model's params from the stored item through `rules`, in the target shardings.

    Each stored tensor is restored once onto the devices, with the sharding under which each
    device's shard holds what its blocks of the model weights need (`blocks.stored_sharding`:
    each process reads only the chunks of its own shards), and the model weights are made block
    by block from it (`blocks.place`, reading through `storage.DeviceArrays`); tensors are read
    in groups of about `READ_GROUP_BYTES`, each dropped once its weights are made.

    Raises:
      CheckpointError: as `mapping.resolve` (unmatched names, shapes) and `orbax.read_arrays`.
    """
    shapes, stored_names, _ = stored_params(layout, directory, step)
    expected = weight_paths(target)
    sources = mapping.resolve(rules, shapes, expected, architecture, where)
    numbers = {k: v for k, v in architecture.items() if isinstance(v, int | float)}
    names = {v: k for k, v in stored_names.items()}
    out: dict[str, Any] = {}
    item_dir = layout.item_dir(step)
    for group in blocks.read_groups(sources, shapes, READ_GROUP_BYTES):
        pieces: dict[str, list] = defaultdict(list)
        for weight in group:
            for piece in sources[weight].pieces:
                pieces[piece.stored].append((piece, expected[weight]))
        abstract = {}
        for name, used in pieces.items():
            shape, dtype = shapes[name]
            sharding = blocks.stored_sharding(used, shape, shapes, numbers)
            abstract[stored_names[name]] = jax.ShapeDtypeStruct(
                shape, np.dtype(dtype), sharding=sharding
            )
        read = orbax.read_arrays(item_dir, directory, step, abstract, layout.item)
        for full, array in read.items():
            if not isinstance(array, jax.Array):
                raise CheckpointError(
                    f"{where}: stored '{names[full]}' did not restore as an array "
                    f"(got {type(array).__name__})."
                )
        arrays = storage.DeviceArrays({names[full]: array for full, array in read.items()})
        made = blocks.place(
            {w: sources[w] for w in group}, shapes, {w: expected[w] for w in group}, arrays, numbers
        )
        out.update(jax.block_until_ready(made))
        for array in read.values():
            array.delete()
    damage.check_restored(out, expected, where)
    return nest_weights(out)
