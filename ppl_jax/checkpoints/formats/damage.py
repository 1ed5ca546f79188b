"""Diagnosing damaged Orbax steps: one sentence naming the directory, the step and the weights,
never the hundreds of lines of asyncio tracebacks that a failed Orbax read leaves behind."""

from __future__ import annotations

import contextlib
import gc
import glob
import json
import logging
import os
import sys
from typing import Any

import jax
import numpy as np
import tensorstore as ts

from ppl_jax.errors import CheckpointError
from ppl_jax.runtime import paths


def reason(e: BaseException, directory: str) -> str:
    """The innermost cause of an Orbax/TensorStore error, in one short line."""
    while e.__cause__ is not None or e.__context__ is not None:
        e = e.__cause__ or e.__context__
    text = " ".join(str(e).split())
    text = text.split(" [tensorstore_spec=")[0]  # TensorStore appends its whole spec
    text = text.replace(paths.join(paths.absolute(directory), ""), "")  # relative to the dir
    return text if len(text) <= 400 else text[:397] + "..."


def damaged(
    directory: str, step: int | None, what: str, e: BaseException | None = None
) -> CheckpointError:
    """The one sentence for a damaged step (`step` None: a checkpoint without steps)."""
    why = f" ({reason(e, directory)})" if e is not None else ""
    if step is None:
        return CheckpointError(
            f"the checkpoint {directory!r} is damaged: {what}{why}. Restore its files from a copy."
        )
    return CheckpointError(
        f"step {step} of {directory!r} is damaged: {what}{why}. Restore the step's files from a "
        f"copy, or evaluate another step (checkpoint.step)."
    )


def check_tree_metadata(item_dir: str, directory: str, step: int | None, item: str) -> None:
    """The item's `_METADATA` (Orbax's JSON tree of stored arrays) is there and parses.

    Args:
      item_dir: the item's folder; directory: the checkpoint (for the sentence); step: its step;
      item: the item's name as the sentence shows it (`state`, `items`, or '' for a bare one).
    """
    label = f"{item}/_METADATA" if item else "_METADATA"
    if paths.isfile(paths.join(item_dir, "checkpoint")):
        return  # an older Orbax checkpoint, with msgpack tree metadata
    try:
        json.loads(paths.read_bytes(paths.join(item_dir, "_METADATA")).decode("utf-8"))
    except FileNotFoundError:
        raise damaged(directory, step, f"its tree metadata '{label}' is missing") from None
    except (OSError, ValueError) as e:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise damaged(
            directory, step, f"its tree metadata '{label}' is not valid JSON ({e})"
        ) from None


def check_ocdbt_index(item_dir: str, directory: str, step: int | None, item: str) -> None:
    """Reads the OCDBT manifest and B+tree of an item (they carry CRC-32C checksums).

    Orbax stores the arrays of an item in one OCDBT key-value database: `manifest.ocdbt`
    points at B+tree nodes under `d/` and `ocdbt.process_*/d/`, which point at the array chunks.
    A lost or damaged manifest or node makes every weight unreadable; listing the database reads
    them all, so such damage is reported here in one sentence, before Orbax opens any array (it
    would print one asyncio traceback per array).

    A remote step is read through TensorStore's own driver for its URL (`gs://` is TensorStore's
    `gcs` kvstore, as Orbax uses), not through `etils.epath`.
    """
    state = paths.absolute(item_dir)
    local = paths.is_local(state)
    label = f"{item}/manifest.ocdbt" if item else "manifest.ocdbt"
    if not paths.isfile(paths.join(state, "manifest.ocdbt")):
        processes = (
            glob.glob(os.path.join(state, "ocdbt.process_*"))
            if local
            else [n for n in _names(state) if n.startswith("ocdbt.process_")]
        )
        if processes:
            raise damaged(directory, step, f"its OCDBT manifest '{label}' is missing")
        return  # not an OCDBT checkpoint: Orbax reads one directory per array
    try:
        # Local: no URL, so that any character may appear in the path.
        base = {"driver": "file", "path": state + os.sep} if local else state + "/"
        kvstore = ts.KvStore.open({"driver": "ocdbt", "base": base}).result()
        kvstore.list().result()
    except Exception as e:  # TensorStore raises ValueError with a status code in the text
        raise damaged(directory, step, "the OCDBT index of its arrays cannot be read", e) from None


def _names(folder: str) -> list[str]:
    try:
        return paths.listdir(folder)
    except FileNotFoundError:
        return []


class _ItemReadNoise(logging.Filter):
    """Orbax's warnings that say only what ppl_jax asked for, so not shown: an item folder read
    on its own has no step `_CHECKPOINT_METADATA` (the step folder has it), and a
    `CheckpointManager` opened read-only (as every reader opens it: `orbax._manager`) says so
    three times per opening ("Given directory is read only", "read_only=True, setting
    create=False" and "... save_interval_steps=0"), five openings per restore. Every other
    warning of Orbax's is shown."""

    NOISE = (
        "Metadata file does not exist",
        "Given directory is read only=",
        "CheckpointManagerOptions.read_only=True, setting create=False",
        "CheckpointManagerOptions.read_only=True, setting save_interval_steps=0",
    )

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not any(n in message for n in self.NOISE)


logging.getLogger("absl").addFilter(_ItemReadNoise())


def _from_the_readers(code_or_tb: Any) -> bool:
    """Whether a code object or traceback lies in Orbax's or TensorStore's own modules."""
    while code_or_tb is not None:
        code = getattr(code_or_tb, "tb_frame", None)
        code = code.f_code if code is not None else code_or_tb
        name = getattr(code, "co_filename", "")
        if any(part in name for part in _READER_MODULES):
            return True
        code_or_tb = getattr(code_or_tb, "tb_next", None)
    return False


_READER_MODULES = (f"{os.sep}orbax{os.sep}", f"{os.sep}tensorstore{os.sep}")


def is_failed_read_leftover(obj: Any, traceback: Any = None) -> bool:
    """Whether an object reported at garbage collection (`sys.unraisablehook`'s `object`, an
    asyncio task or future) is the leftover of a failed Orbax read: a coroutine (or the task of
    one) of Orbax's or TensorStore's modules, or an exception raised inside them."""
    coroutine = obj.get_coro() if hasattr(obj, "get_coro") else obj
    if _from_the_readers(getattr(coroutine, "cr_code", None)):
        return True
    return traceback is not None and _from_the_readers(traceback)


class _LeftoverTasks(logging.Filter):
    """asyncio's "Task exception was never retrieved" reports of failed Orbax reads."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        return not (
            "never retrieved" in str(record.msg)
            and exc is not None
            and is_failed_read_leftover(None, exc.__traceback__)
        )


def drop_leftover_task_reports() -> None:
    """From now on, asyncio's "Task exception was never retrieved" reports of failed Orbax reads
    (`_LeftoverTasks`: exceptions raised in Orbax's or TensorStore's modules) are dropped.

    Called before Orbax reads a step (its manager, its arrays): when a read fails, Orbax's
    event loop thread may collect the failed tasks of its other reads (and asyncio log them, a
    traceback ending in `ValueError: NOT_FOUND ...`) before the failure reaches ppl_jax, ahead of
    its one sentence.
    """
    log = logging.getLogger("asyncio")
    if not any(isinstance(f, _LeftoverTasks) for f in log.filters):
        log.addFilter(_LeftoverTasks())


def _quiet_leftovers_from_now_on() -> None:
    """After a failed read, Orbax's other pending reads can outlive any collection here (its
    event loop thread holds them) and are reported when the interpreter shuts down, after the
    one sentence: hundreds of lines of "Exception ignored in: <coroutine object
    _read_array_index_and_device_put>". From the first failed read on, those reports (and only
    those: coroutines and exceptions of Orbax's and TensorStore's modules) are dropped; any other
    unraisable exception is reported as before."""
    drop_leftover_task_reports()
    if getattr(sys.unraisablehook, "ppl_jax", False):
        return
    previous = sys.unraisablehook

    def hook(unraisable: Any) -> None:
        if not is_failed_read_leftover(unraisable.object, unraisable.exc_traceback):
            previous(unraisable)

    hook.ppl_jax = True  # type: ignore[attr-defined]
    sys.unraisablehook = hook


@contextlib.contextmanager
def quiet_failed_reads():
    """Keeps the leftovers of failed Orbax reads off stderr while the failure is diagnosed, and
    after it (`_quiet_leftovers_from_now_on`).

    When one shard of a restore fails, Orbax's other pending reads end as never-retrieved asyncio
    task exceptions and unawaited coroutines, which Python prints (tracebacks of hundreds of lines)
    when they are garbage collected. The failure itself is raised as a `CheckpointError`; these
    leftovers are collected here, silently.
    """
    _quiet_leftovers_from_now_on()
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


def check_restored(got: dict[str, Any], expected: dict[str, Any], where: str) -> None:
    """Every expected weight came back as a `jax.Array` of its leaf's shape and dtype.

    Raises:
      CheckpointError: naming the first weight that did not.
    """
    for name, want in expected.items():
        leaf = got.get(name)
        if not isinstance(leaf, jax.Array) or leaf.shape != want.shape or leaf.dtype != want.dtype:
            raise CheckpointError(
                f"weight '{name}' of {where} did not restore as "
                f"{want.dtype}{list(want.shape)} (got {type(leaf).__name__} "
                f"{getattr(leaf, 'dtype', '')}{list(np.shape(leaf)) if leaf is not None else ''})."
            )
