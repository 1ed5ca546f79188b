"""Orbax checkpoints: training states saved by a training loop, restored as params for scoring.

All Orbax calls of ppl_jax live here. A checkpoint directory is an Orbax `CheckpointManager`
directory of numbered steps; each step holds two items:

- `state`: the training state `{"step", "params", "opt_state"}` (optax state included);
- `metadata`: JSON `{"model": <architecture>, "tokenizer": <tokenizer description>}`,

so that evaluation needs only the directory; steps written by `save_train_state` also hold
`checksums` (a fingerprint of each weight, checked on restore: Orbax checks none of the array
data it reads). A damaged step (lost, truncated or corrupt files) raises `CheckpointError` naming
the directory, the step and the weights concerned. Restoring reads the `metadata`, then only the
`params` subtree of `state` (the optimizer state is never read), straight into the target
shardings, and then checks every weight (MaxText's `_raise_on_weight_mismatch` habit: Orbax does
not raise for a leaf missing from the checkpoint when partial restore is on; we do).
"""

from __future__ import annotations

import contextlib
import gc
import glob
import json
import logging
import math
import os
import sys
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import tensorstore as ts

from ppl_jax.errors import CheckpointError
from ppl_jax.models.interface import nest_weights, weight_paths
from ppl_jax.runtime import paths

STATE = "state"
METADATA = "metadata"
CHECKSUMS = "checksums"
CHECKSUM_ALGORITHM = "ppl_jax.weighted_byte_sums.v1"
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
    try:
        found = paths.isdir(directory)
    except ImportError as e:
        raise paths.missing_backend(directory, e) from None
    if not found:
        raise CheckpointError(
            f"checkpoint.dir: no such directory {directory!r}. Give an Orbax checkpoint "
            f"directory (numbered step folders inside)."
        )
    return ocp.CheckpointManager(
        paths.absolute(directory),
        item_handlers={
            STATE: ocp.PyTreeCheckpointHandler(),
            METADATA: ocp.JsonCheckpointHandler(),
            CHECKSUMS: ocp.JsonCheckpointHandler(),
        },
        options=ocp.CheckpointManagerOptions(read_only=True),
    )


def _pick_step(manager: ocp.CheckpointManager, directory: str, step: int | None) -> int:
    steps = sorted(manager.all_steps())
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
    """The finalized steps of an Orbax checkpoint directory, ascending (Orbax's own notion: a
    step whose save committed; a save in progress or interrupted is not one).

    Raises:
      CheckpointError: no such directory.
    """
    with _manager(directory) as manager:
        return sorted(int(s) for s in manager.all_steps())


def read_metadata(directory: str, step: int | None) -> tuple[int, dict[str, Any]]:
    """The chosen step and its metadata (`model` architecture, `tokenizer` description).

    Args:
      directory: the checkpoint directory.
      step: a step number, or None for the latest finalized step.

    Raises:
      CheckpointError: no such directory, no finalized step, the step is absent, or the step
        has no metadata item.
    """
    with _manager(directory) as manager:
        chosen = _pick_step(manager, directory, step)
        if not paths.isdir(paths.join(directory, str(chosen), METADATA)):
            raise CheckpointError(
                f"step {chosen} of {directory!r} has no '{METADATA}' item (the model "
                f"architecture and tokenizer); save checkpoints with "
                f"ppl_jax.checkpoints.orbax.save_train_state."
            )
        restored = manager.restore(
            chosen, args=ocp.args.Composite(**{METADATA: ocp.args.JsonRestore()})
        )
        return chosen, dict(restored[METADATA])


@jax.jit
def _byte_sums(bytes_: jax.Array) -> jax.Array:
    """Two wrapping uint32 sums of `bytes_` (uint8, any shape) times odd positional weights."""
    bytes_ = bytes_.astype(jnp.uint32)
    index = jnp.zeros(bytes_.shape, jnp.uint32)  # the row-major position of each byte
    for axis in range(bytes_.ndim):
        stride = np.uint32(math.prod(bytes_.shape[axis + 1 :]) % (1 << 32))
        index = index + jax.lax.broadcasted_iota(jnp.uint32, bytes_.shape, axis) * stride
    odd_1 = index * np.uint32(0x9E3779B1) + np.uint32(0x7F4A7C15) | np.uint32(1)
    odd_2 = (index ^ (index >> 15)) * np.uint32(0x2C1B3C6D) + np.uint32(0x297A2D39) | np.uint32(1)
    return jnp.stack([jnp.sum(bytes_ * odd_1), jnp.sum(bytes_ * odd_2)])


_as_bytes = jax.jit(lambda x: jax.lax.bitcast_convert_type(x, jnp.uint8))


def fingerprint(x: Any) -> str:
    """A 64-bit fingerprint of an array's bytes and dtype, the same for any sharding.

    Two sums modulo 2**32 of every byte times an odd weight drawn from its row-major position
    (bytes in little-endian order): a change of one byte changes both (an odd multiple of a
    nonzero change below 2**8 is not 0 mod 2**32), a swap of bytes changes them too, and other
    corruption passes with probability about 2**-64. Integer sums do not depend on the order of
    addition, so neither the sharding nor the process count matters.

    Args:
      x: an array (NumPy, or a `jax.Array` sharded in any way) of any shape and dtype.

    Returns:
      `"<dtype>:<16 hex digits>"`.
    """
    if isinstance(x, jax.Array):
        bytes_ = _as_bytes(x)
    else:
        x = np.ascontiguousarray(x)
        bytes_ = x.view(np.uint8).reshape(*x.shape, x.dtype.itemsize)
    first, second = (int(v) for v in np.asarray(_byte_sums(bytes_)))
    return f"{np.dtype(x.dtype).name}:{first:08x}{second:08x}"


def _reason(e: BaseException, directory: str) -> str:
    """The innermost cause of an Orbax/TensorStore error, in one short line."""
    while e.__cause__ is not None or e.__context__ is not None:
        e = e.__cause__ or e.__context__
    text = " ".join(str(e).split())
    text = text.split(" [tensorstore_spec=")[0]  # TensorStore appends its whole spec
    text = text.replace(paths.join(paths.absolute(directory), ""), "")  # relative to the dir
    return text if len(text) <= 400 else text[:397] + "..."


def _damaged(
    directory: str, step: int, what: str, e: BaseException | None = None
) -> CheckpointError:
    why = f" ({_reason(e, directory)})" if e is not None else ""
    return CheckpointError(
        f"step {step} of {directory!r} is damaged: {what}{why}. Restore the step's files from a "
        f"copy, or evaluate another step (checkpoint.step)."
    )


def _check_tree_metadata(directory: str, step: int) -> None:
    """The step's `state/_METADATA` (Orbax's JSON tree of stored arrays) is there and parses."""
    state = paths.join(directory, str(step), STATE)
    if paths.isfile(paths.join(state, "checkpoint")):
        return  # an older Orbax checkpoint, with msgpack tree metadata
    try:
        json.loads(paths.read_bytes(paths.join(state, "_METADATA")).decode("utf-8"))
    except FileNotFoundError:
        raise _damaged(directory, step, "its tree metadata 'state/_METADATA' is missing") from None
    except (OSError, ValueError) as e:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise _damaged(
            directory, step, f"its tree metadata 'state/_METADATA' is not valid JSON ({e})"
        ) from None


def _check_ocdbt_index(directory: str, step: int) -> None:
    """Reads the OCDBT manifest and B+tree of the step's `state` (they carry CRC-32C checksums).

    Orbax stores the arrays of a step in one OCDBT key-value database: `state/manifest.ocdbt`
    points at B+tree nodes under `state/d/` and `state/ocdbt.process_*/d/`, which point at the
    array chunks. A lost or damaged manifest or node makes every weight unreadable; listing the
    database reads them all, so such damage is reported here in one sentence, before Orbax opens
    any array (it would print one asyncio traceback per array).

    A remote step is read through TensorStore's own driver for its URL (`gs://` is TensorStore's
    `gcs` kvstore, as Orbax uses), not through `etils.epath`.
    """
    state = paths.join(paths.absolute(directory), str(step), STATE)
    local = paths.is_local(state)
    if not paths.isfile(paths.join(state, "manifest.ocdbt")):
        processes = (
            glob.glob(os.path.join(state, "ocdbt.process_*"))
            if local
            else [n for n in _names(state) if n.startswith("ocdbt.process_")]
        )
        if processes:
            raise _damaged(directory, step, "its OCDBT manifest 'state/manifest.ocdbt' is missing")
        return  # not an OCDBT checkpoint: Orbax reads one directory per array
    try:
        # Local: no URL, so that any character may appear in the path.
        base = {"driver": "file", "path": state + os.sep} if local else state + "/"
        kvstore = ts.KvStore.open({"driver": "ocdbt", "base": base}).result()
        kvstore.list().result()
    except Exception as e:  # TensorStore raises ValueError with a status code in the text
        raise _damaged(directory, step, "the OCDBT index of its arrays cannot be read", e) from None


def _names(folder: str) -> list[str]:
    try:
        return paths.listdir(folder)
    except FileNotFoundError:
        return []


@contextlib.contextmanager
def _quiet_failed_reads():
    """Keeps the leftovers of failed Orbax reads off stderr while the failure is diagnosed.

    When one shard of a restore fails, Orbax's other pending reads end as never-retrieved asyncio
    task exceptions and unawaited coroutines, which Python prints (tracebacks of hundreds of lines)
    when they are garbage collected. The failure itself is raised as a `CheckpointError`; these
    leftovers are collected here, silently.
    """
    log = logging.getLogger("asyncio")
    level, hook = log.level, sys.unraisablehook
    log.setLevel(logging.CRITICAL)
    sys.unraisablehook = lambda unraisable: None
    try:
        yield
    finally:
        gc.collect()
        log.setLevel(level)
        sys.unraisablehook = hook


def _restore(manager: ocp.CheckpointManager, step: int, params: dict[str, Any]) -> Any:
    abstract = {"params": params}
    restored = manager.restore(
        step,
        args=ocp.args.Composite(
            **{
                STATE: ocp.args.PyTreeRestore(
                    item=abstract,
                    restore_args=ocp.checkpoint_utils.construct_restore_args(abstract),
                    partial_restore=True,
                )
            }
        ),
    )
    return restored[STATE]["params"]


def _read_checksums(manager: ocp.CheckpointManager, directory: str, step: int) -> dict | None:
    """The weight fingerprints saved with the step, or None (saved without them, or by a newer
    ppl_jax with another algorithm)."""
    if not paths.isdir(paths.join(directory, str(step), CHECKSUMS)):
        return None
    try:
        saved = manager.restore(
            step, args=ocp.args.Composite(**{CHECKSUMS: ocp.args.JsonRestore()})
        )
    except Exception as e:  # Orbax's own errors for a missing or corrupt JSON file
        raise _damaged(directory, step, "its checksums item cannot be read", e) from None
    saved = saved[CHECKSUMS]
    if not isinstance(saved, dict) or saved.get("algorithm") != CHECKSUM_ALGORITHM:
        return None
    return dict(saved.get("params") or {})


def _restore_verified(
    manager: ocp.CheckpointManager,
    directory: str,
    step: int,
    target: dict[str, Any],
    stored_dtypes: dict[str, Any],
    checksums: dict[str, str],
) -> Any:
    """Restores in the stored dtypes, checks each weight's fingerprint, then casts to the target.

    When weights are cast, they are restored in groups of about `CAST_GROUP_BYTES`, so that a
    model stored in float32 and evaluated in bfloat16 never sits whole in float32 on the devices.
    """
    expected = weight_paths(target)
    stored = {
        name: jax.ShapeDtypeStruct(
            leaf.shape, stored_dtypes.get(name, leaf.dtype), sharding=leaf.sharding
        )
        for name, leaf in expected.items()
    }
    casts = any(stored[n].dtype != leaf.dtype for n, leaf in expected.items())
    limit = CAST_GROUP_BYTES if casts else math.inf
    groups: list[dict[str, Any]] = [{}]
    size = 0
    for name, leaf in stored.items():
        nbytes = math.prod(leaf.shape) * leaf.dtype.itemsize
        if groups[-1] and size + nbytes > limit:
            groups.append({})
            size = 0
        groups[-1][name] = leaf
        size += nbytes
    out, changed = {}, []
    for group in groups:
        for name, array in weight_paths(_restore(manager, step, nest_weights(group))).items():
            if name in checksums and fingerprint(array) != checksums[name]:
                changed.append(name)
            want = expected[name]
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
        raise _damaged(
            directory,
            step,
            f"the stored bytes of weight{plural} {names} changed after the save (they do not "
            f"match the checksums saved with them)",
        )
    return nest_weights(out)


def _unreadable_weights(
    manager: ocp.CheckpointManager, directory: str, step: int, expected: dict[str, Any]
) -> dict[str, str]:
    """Restores each weight on its own (only after a failed restore): which ones fail, and why."""
    failed = {}
    for name, leaf in expected.items():
        try:
            jax.block_until_ready(_restore(manager, step, nest_weights({name: leaf})))
        except Exception as e:  # Orbax re-raises TensorStore's errors as bare Exceptions
            failed[name] = _reason(e, directory)
    return failed


def restore_params(directory: str, step: int, target: Any) -> Any:
    """Restores only `params` of the training state at `step`, into the given shardings.

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
    _check_tree_metadata(directory, step)
    _check_ocdbt_index(directory, step)
    with _manager(directory) as manager:
        try:
            stored = manager.item_metadata(step)[STATE]
        except Exception as e:  # a corrupt `state/_METADATA`, in Orbax's own errors
            raise _damaged(
                directory, step, "the tree metadata of its training state cannot be read", e
            ) from None
        stored_tree = getattr(stored, "tree", stored)
        if not isinstance(stored_tree, dict) or "params" not in stored_tree:
            raise CheckpointError(
                f"step {step} of {directory!r} holds no training state with 'params'."
            )
        stored_shapes = {k: tuple(v.shape) for k, v in weight_paths(stored_tree["params"]).items()}
        expected = weight_paths(target)
        problems = []
        for name, want in expected.items():
            if name not in stored_shapes:
                problems.append(f"'{name}' is missing")
            elif stored_shapes[name] != tuple(want.shape):
                problems.append(
                    f"'{name}' has shape {stored_shapes[name]}, the architecture says "
                    f"{tuple(want.shape)}"
                )
        if problems:
            raise CheckpointError(
                f"step {step} of {directory!r} does not match the stored architecture: "
                + "; ".join(problems)
                + ". The checkpoint is partial or belongs to another model."
            )
        checksums = _read_checksums(manager, directory, step)
        try:
            if checksums is None:
                params = _restore(manager, step, target)
            else:
                stored_dtypes = {
                    name: np.dtype(v.dtype)
                    for name, v in weight_paths(stored_tree["params"]).items()
                    if getattr(v, "dtype", None) is not None
                }
                params = _restore_verified(
                    manager, directory, step, target, stored_dtypes, checksums
                )
        except CheckpointError:
            raise
        except Exception as e:  # Orbax re-raises TensorStore's errors as bare Exceptions
            # Only strings leave this block, so the failed reads can be collected quietly.
            with _quiet_failed_reads():
                reason = _reason(e, directory)
                del e
                failed = _unreadable_weights(manager, directory, step, expected)
            if not failed:
                what = f"its params cannot be read ({reason})"
            elif len(failed) == len(expected):
                what = f"none of its weights can be read ({reason})"
            else:
                names = ", ".join(f"'{n}'" for n in list(failed)[:5])
                if len(failed) > 5:
                    names += f" and {len(failed) - 5} more"
                plural = "s" if len(failed) > 1 else ""
                what = f"weight{plural} {names} cannot be read ({next(iter(failed.values()))})"
            raise _damaged(directory, step, what) from None
    got = weight_paths(params)
    for name, want in expected.items():
        leaf = got.get(name)
        if not isinstance(leaf, jax.Array) or leaf.shape != want.shape or leaf.dtype != want.dtype:
            raise CheckpointError(
                f"weight '{name}' of step {step} in {directory!r} did not restore as "
                f"{want.dtype}{list(want.shape)} (got {type(leaf).__name__} "
                f"{getattr(leaf, 'dtype', '')}{list(np.shape(leaf)) if leaf is not None else ''})."
            )
    return params
