"""Orbax checkpoints: every Orbax call of ppl_jax lives here.

Two kinds of directory are read:

- ppl_jax's own: an Orbax `CheckpointManager` directory of numbered steps, each with the items
  `state` (the training state `{"step", "params", "opt_state"}`), `metadata` (JSON `{"model":
  <architecture>, "tokenizer": <tokenizer description>}`) and, from `save_train_state`,
  `checksums` (a fingerprint of each weight, checked on restore: Orbax checks none of the array
  data it reads; `ppl_jax.checkpoints.formats.checksums`);
- any other Orbax item folder (another trainer's step item, a bare `StandardCheckpointer`
  directory), whose stored tree `tree_metadata` lists and whose arrays `read_arrays` restores by
  name (`ppl_jax.checkpoints.readers.foreign` finds the item and maps the names).

Restoring reads only the named arrays (the optimizer state is never read), straight into their
target shardings, and then checks every weight (MaxText's `_raise_on_weight_mismatch` habit: Orbax
does not raise for a leaf missing from the checkpoint when partial restore is on; we do). A
damaged step (lost, truncated or corrupt files, links leading out of the checkpoint folder) raises
`CheckpointError` naming the directory, the step and the weights concerned
(`ppl_jax.checkpoints.formats.damage`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp

from ppl_jax.checkpoints.formats import checksums as checksums_lib
from ppl_jax.checkpoints.formats import damage
from ppl_jax.checkpoints.formats.checksums import CHECKSUM_ALGORITHM, fingerprint  # noqa: F401 (API)
from ppl_jax.errors import CheckpointError
from ppl_jax.models.interface import nest_weights, weight_paths
from ppl_jax.runtime import paths

STATE = "state"
METADATA = "metadata"
CHECKSUMS = "checksums"
CAST_GROUP_BYTES = 1 << 30  # stored-dtype bytes restored at a time when weights are cast


def save_train_state(
    directory: str,
    step: int,
    state: dict[str, Any],
    metadata: dict[str, Any],
    max_to_keep: int | None = None,
) -> None:
    """Saves a training state `{"step", "params", "opt_state"}` and its metadata as `step`.

    Args:
      directory: the checkpoint directory (created if absent).
      step: the step number.
      state: the training state; `params` is a string-keyed dict of arrays.
      metadata: `{"model": architecture dict, "tokenizer": tokenizer description}`.
      max_to_keep: how many steps to keep (None keeps all).

    A third item, `checksums`, holds a fingerprint of each weight of `params` (see
    `fingerprint`): Orbax stores no checksum of array data, and `restore_params` checks these.
    """
    checksums = {
        "algorithm": CHECKSUM_ALGORITHM,
        "params": {name: fingerprint(x) for name, x in weight_paths(state["params"]).items()},
    }
    options = ocp.CheckpointManagerOptions(max_to_keep=max_to_keep, create=True)
    with ocp.CheckpointManager(paths.absolute(directory), options=options) as manager:
        manager.save(
            step,
            args=ocp.args.Composite(
                **{
                    STATE: ocp.args.StandardSave(state),
                    METADATA: ocp.args.JsonSave(metadata),
                    CHECKSUMS: ocp.args.JsonSave(checksums),
                }
            ),
        )
        manager.wait_until_finished()


def _manager(directory: str) -> ocp.CheckpointManager:
    damage.drop_leftover_task_reports()  # before any read of a step (see `read_arrays`)
    try:
        found = paths.isdir(directory)
    except ImportError as e:
        raise paths.missing_backend(directory, e) from None
    if not found:
        raise CheckpointError(
            f"checkpoint.dir: no such directory {directory!r}. Give an Orbax checkpoint "
            f"directory (numbered step folders inside)."
        )
    try:
        return ocp.CheckpointManager(
            paths.absolute(directory),
            item_handlers={METADATA: ocp.JsonCheckpointHandler()},
            options=ocp.CheckpointManagerOptions(read_only=True),
        )
    except ImportError as e:  # a remote filesystem's package, needed by Orbax itself
        raise paths.missing_backend(directory, e) from None


def _pick_step(steps: list[int], directory: str, step: int | None) -> int:
    if not steps:
        raise CheckpointError(
            f"checkpoint.dir {directory!r} holds no finalized checkpoint step (an interrupted save "
            f"leaves none). Point checkpoint.dir at a directory of saved steps."
        )
    if step is None:
        return steps[-1]
    if step not in steps:
        raise CheckpointError(
            f"checkpoint.step={step} is not in {directory!r}; its finalized steps are "
            f"{steps}. Set checkpoint.step to one of them, or to 'latest'."
        )
    return step


def finalized_steps(directory: str) -> list[int]:
    """The finalized steps of an Orbax checkpoint directory, ascending.

    Orbax's own notion, the same for Orbax v0 (`CheckpointManager`) and v1 layouts: a numbered
    step folder whose save committed (a save in progress or interrupted is a temporary folder,
    `<step>.orbax-checkpoint-tmp-*`, or on object stores lacks `commit_success.txt`).

    Raises:
      CheckpointError: no such directory.
      ConfigError: a remote path without its package.
    """
    with _manager(directory) as manager:
        return sorted(int(s) for s in manager.all_steps())


def unfinished_step(name: str) -> int | None:
    """The step of Orbax's temporary folder `name` (`<step>.orbax-checkpoint-tmp-<timestamp>`: a
    save not finalized, in progress or killed), or None for any other name."""
    found = re.fullmatch(r"(\d+)" + re.escape(ocp.path.step.TMP_DIR_SUFFIX) + r".*", name)
    return int(found.group(1)) if found else None


def pick_step(directory: str, step: int | None) -> int:
    """`step` checked against the finalized steps, or the latest for None.

    Raises:
      CheckpointError: no such directory, no finalized step, or `step` is not one.
    """
    return _pick_step(finalized_steps(directory), directory, step)


def read_metadata(directory: str, step: int | None) -> tuple[int, dict[str, Any]]:
    """The chosen step and its ppl_jax metadata (`model` architecture, `tokenizer` description).

    Args:
      directory: the checkpoint directory.
      step: a step number, or None for the latest finalized step.

    Raises:
      CheckpointError: no such directory, no finalized step, the step is absent, the step has no
        metadata item, or the item is not a JSON object (damaged).
    """
    with _manager(directory) as manager:
        chosen = _pick_step(sorted(int(s) for s in manager.all_steps()), directory, step)
        if not paths.isdir(paths.join(directory, str(chosen), METADATA)):
            raise CheckpointError(
                f"step {chosen} of {directory!r} has no '{METADATA}' item (the model "
                f"architecture and tokenizer); save checkpoints with "
                f"ppl_jax.checkpoints.formats.orbax.save_train_state, or give the architecture "
                f"(checkpoint.architecture) and a mapping (checkpoint.mapping)."
            )
        paths.refuse_links_out(paths.join(directory, str(chosen), METADATA), directory)
        try:
            restored = manager.restore(
                chosen, args=ocp.args.Composite(**{METADATA: ocp.args.JsonRestore()})
            )
            meta = restored[METADATA]
        except Exception as e:  # JSONDecodeError, AttributeError and Orbax's own errors
            raise damage.damaged(
                directory, chosen, f"its '{METADATA}' item is not readable JSON", e
            ) from None
        if not isinstance(meta, dict) or not isinstance(meta.get("model"), dict):
            raise damage.damaged(
                directory, chosen, f"its '{METADATA}' item holds no 'model' description object"
            )
        return chosen, dict(meta)


def _read_json_item(item_dir: str) -> Any:
    return ocp.Checkpointer(ocp.JsonCheckpointHandler()).restore(
        paths.absolute(item_dir), args=ocp.args.JsonRestore()
    )


def tree_metadata(item_dir: str) -> dict[str, tuple[tuple[int, ...], np.dtype | None]]:
    """The stored tree of an Orbax PyTree item: each leaf's `/`-joined name, shape and dtype.

    Names join dict keys and sequence indices (`opt_state/0/mu/...`); scalars have shape `()`;
    a leaf stored without a dtype (a Python object) has dtype None. Nothing of the arrays is read.

    Raises:
      Exception: Orbax's own errors for an unreadable `_METADATA` (callers turn them into
        sentences: `ppl_jax.checkpoints.formats.damage`).
    """
    meta = ocp.PyTreeCheckpointer().metadata(paths.absolute(item_dir))
    tree = getattr(meta, "item_metadata", meta)
    return flatten_metadata(getattr(tree, "tree", tree))


def flatten_metadata(tree: Any) -> dict[str, tuple[tuple[int, ...], np.dtype | None]]:
    """A nested tree of Orbax leaf metadata (`.shape`, `.dtype`; v0's or v1's) as `/`-joined
    name -> (shape, dtype or None)."""
    out: dict[str, tuple[tuple[int, ...], np.dtype | None]] = {}

    def walk(node: Any, prefix: str) -> None:
        if isinstance(node, dict):
            for k, v in node.items():
                walk(v, f"{prefix}/{k}" if prefix else str(k))
        elif isinstance(node, list | tuple):
            for i, v in enumerate(node):
                walk(v, f"{prefix}/{i}" if prefix else str(i))
        elif node is not None:
            dtype = getattr(node, "dtype", None)
            out[prefix] = (
                tuple(getattr(node, "shape", ()) or ()),
                np.dtype(dtype) if dtype else None,
            )

    walk(tree, "")
    return out


def _restore_names(item_dir: str, abstract: dict[str, Any]) -> dict[str, jax.Array]:
    nested = nest_weights(abstract)
    restored = ocp.PyTreeCheckpointer().restore(
        paths.absolute(item_dir),
        args=ocp.args.PyTreeRestore(
            item=nested,
            restore_args=ocp.checkpoint_utils.construct_restore_args(nested),
            partial_restore=True,
        ),
    )
    got = weight_paths(restored)
    return {name: got.get(name) for name in abstract}


def read_arrays(
    item_dir: str,
    directory: str,
    step: int | None,
    abstract: dict[str, jax.ShapeDtypeStruct],
    item: str = STATE,
    shown: str = "",
    restore: Callable[[dict[str, jax.ShapeDtypeStruct]], dict[str, Any]] | None = None,
) -> dict[str, jax.Array]:
    """Restores the stored arrays named in `abstract`, each into its leaf's sharding and dtype.

    Each process reads only the chunks of its own devices' shards (Orbax through TensorStore).
    Before anything is read, the item's tree metadata and OCDBT index are checked and every file
    under the item must resolve inside the checkpoint folder.

    Args:
      item_dir: the item folder (`<dir>/<step>/state`, `<dir>/<step>/items`, a bare directory).
      directory, step, item: the checkpoint, its step (None: no steps) and the item's name, for
        the sentences of errors.
      abstract: stored name (`params/params/decoder/...`) -> `jax.ShapeDtypeStruct(shape, dtype,
        sharding=...)`; the stored dtype is cast to `dtype` by Orbax.
      shown: a prefix of the stored names left out of the sentences (`params/`).
      restore: what reads a subset of `abstract` (None: Orbax's `PyTreeCheckpointer` on
        `item_dir`; the Orbax v1 reader gives `ocp.v1.load`'s).

    Returns:
      stored name -> `jax.Array` of its leaf's shape, dtype and sharding.

    Raises:
      CheckpointError: a link out of the folder; damaged tree metadata, OCDBT index or array
        files, naming the weights that cannot be read.
    """
    if restore is None:
        restore = lambda subset: _restore_names(item_dir, subset)  # noqa: E731
    paths.refuse_links_out(item_dir, directory)
    damage.check_tree_metadata(item_dir, directory, step, item)
    damage.check_ocdbt_index(item_dir, directory, step, item)
    damage.drop_leftover_task_reports()  # of a failed read, before its sentence (a race)
    try:
        return restore(abstract)
    except CheckpointError:
        raise
    except Exception as e:  # Orbax re-raises TensorStore's errors as bare Exceptions
        # Only strings leave this block, so the failed reads can be collected quietly.
        with damage.quiet_failed_reads():
            why = damage.reason(e, directory)
            del e
            failed = {}
            for name, leaf in abstract.items():
                try:
                    jax.block_until_ready(restore({name: leaf}))
                except Exception as e:  # as above
                    failed[name] = damage.reason(e, directory)
        if not failed:
            what = f"its arrays cannot be read ({why})"
        elif len(failed) == len(abstract):
            what = f"none of its weights can be read ({why})"
        else:
            names = ", ".join(f"'{n.removeprefix(shown)}'" for n in list(failed)[:5])
            if len(failed) > 5:
                names += f" and {len(failed) - 5} more"
            plural = "s" if len(failed) > 1 else ""
            what = f"weight{plural} {names} cannot be read ({next(iter(failed.values()))})"
        raise damage.damaged(directory, step, what) from None


def _read_checksums(directory: str, step: int) -> dict | None:
    """The weight fingerprints saved with the step, or None (saved without them, or by a newer
    ppl_jax with another algorithm)."""
    item = paths.join(directory, str(step), CHECKSUMS)
    if not paths.isdir(item):
        return None
    paths.refuse_links_out(item, directory)
    try:
        saved = _read_json_item(item)
    except Exception as e:  # Orbax's own errors for a missing or corrupt JSON file
        raise damage.damaged(directory, step, "its checksums item cannot be read", e) from None
    if not isinstance(saved, dict) or saved.get("algorithm") != CHECKSUM_ALGORITHM:
        return None
    return dict(saved.get("params") or {})


def restore_params(directory: str, step: int, target: Any) -> Any:
    """Restores only `params` of ppl_jax's training state at `step`, into the given shardings.

    Args:
      directory: the checkpoint directory.
      step: a finalized step (see `read_metadata`).
      target: the params tree with `jax.ShapeDtypeStruct(shape, dtype, sharding=...)` leaves;
        stored weights are cast to each leaf's dtype.

    Returns:
      The params tree of `jax.Array`s, each with its target sharding.

    Raises:
      CheckpointError: naming every weight that is missing or of another shape; or, when the
        step's files are damaged (a lost, truncated or corrupt array file, OCDBT manifest or
        B+tree node, unreadable array metadata), naming the directory, the step and every weight
        that cannot be read; or naming every weight whose bytes no longer match the fingerprint
        saved with it. Orbax stores no checksum of array data (zarr chunks compressed with zstd,
        without zstd's content checksum: a flipped bit in a chunk decodes to a wrong value), so
        only steps written by `save_train_state` (with their `checksums` item) are checked
        bit for bit; flipped bits in other checkpoints' array data go unnoticed.
    """
    item_dir = paths.join(directory, str(step), STATE)
    paths.refuse_links_out(item_dir, directory)
    damage.check_tree_metadata(item_dir, directory, step, STATE)
    damage.check_ocdbt_index(item_dir, directory, step, STATE)
    try:
        stored_tree = tree_metadata(item_dir)
    except Exception as e:  # a corrupt `state/_METADATA`, in Orbax's own errors
        raise damage.damaged(
            directory, step, "the tree metadata of its training state cannot be read", e
        ) from None
    stored = {k[len("params/") :]: v for k, v in stored_tree.items() if k.startswith("params/")}
    if not stored:
        raise CheckpointError(
            f"step {step} of {directory!r} holds no training state with 'params'."
        )
    expected = weight_paths(target)
    problems = []
    for name, want in expected.items():
        if name not in stored:
            problems.append(f"'{name}' is missing")
        elif stored[name][0] != tuple(want.shape):
            problems.append(
                f"'{name}' has shape {stored[name][0]}, the architecture says {tuple(want.shape)}"
            )
    if problems:
        raise CheckpointError(
            f"step {step} of {directory!r} does not match the stored architecture: "
            + "; ".join(problems)
            + ". The checkpoint is partial or belongs to another model."
        )
    checksums = _read_checksums(directory, step) or {}
    as_stored = {
        name: jax.ShapeDtypeStruct(
            leaf.shape, stored[name][1] or leaf.dtype, sharding=leaf.sharding
        )
        for name, leaf in expected.items()
    }
    casts = any(as_stored[n].dtype != leaf.dtype for n, leaf in expected.items())
    out, changed = {}, []
    # Checked weights are restored in their stored dtype (the fingerprint is of the stored bytes),
    # in groups when cast, so that a float32 model evaluated in bfloat16 never sits whole in
    # float32 on the devices.
    groups = (
        checksums_lib.cast_groups(as_stored, CAST_GROUP_BYTES if casts else math.inf)
        if checksums
        else [expected]
    )
    for group in groups:
        read = read_arrays(
            item_dir, directory, step, {f"params/{n}": v for n, v in group.items()}, shown="params/"
        )
        for name in group:
            array, want = read[f"params/{name}"], expected[name]
            if not isinstance(array, jax.Array):
                out[name] = array
                continue
            if name in checksums and fingerprint(array) != checksums[name]:
                changed.append(name)
            if array.dtype != want.dtype:
                cast = jax.jit(lambda a, d=want.dtype: a.astype(d), out_shardings=want.sharding)
                array, stored_array = cast(array), array
                stored_array.delete()
            out[name] = array
    if changed:
        names = ", ".join(f"'{n}'" for n in changed[:5])
        if len(changed) > 5:
            names += f" and {len(changed) - 5} more"
        plural = "s" if len(changed) > 1 else ""
        raise damage.damaged(
            directory,
            step,
            f"the stored bytes of weight{plural} {names} changed after the save (they do not "
            f"match the checksums saved with them)",
        )
    damage.check_restored(out, expected, f"step {step} in {directory!r}")
    return nest_weights(out)
