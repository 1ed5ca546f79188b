"""A TensorBoard sink: the results store's metrics as scalars (`output.sinks=tensorboard`).

Tags (one scalar per metric of a record, at the record's checkpoint step):

    eval/<dataset>/<metric>                         a dataset record
    eval/average/micro/<metric>                     the micro average of a step
    eval/average/macro/<metric>                     the macro average
    eval/average/macro/<key>=<value>/<metric>       the macro average over datasets tagged key=value

A record whose step is null (a checkpoint without a step, such as a Hugging Face directory) is
written at step 0. A null metric (undefined or overflowing) is not written. TensorBoard stores a
scalar as float32 (`Summary.Value.simple_value`), so the values are rounded to float32; the exact
float64 numbers are in `results.jsonl`.

The event files are written by tensorboardX (no TensorFlow needed; `pip install
'ppl_jax[diagnostics]'`) with `Event` and `Summary` protocol buffers built here, through its
synchronous `EventsWriter`: each `write` is on disk (flushed, fsynced) when it returns, where
`SummaryWriter` hands events to a background thread and only `close` waits for them. Its
`add_scalar` would also rename a tag holding `=` (`macro/domain=web` -> `macro/domain_web`), while
TensorBoard itself takes any tag. Each sink writes its own event file
(`events.out.tfevents.<time>.<host>.ppl_jax.<pid>.<n>`), so two sinks opened within one second
never overwrite each other's file; TensorBoard reads every event file of the folder.
"""

from __future__ import annotations

import datetime
import itertools
import os
import tempfile
import time
from collections.abc import Mapping, Sequence
from typing import Any

from ppl_jax.errors import ConfigError

_MISSING = "output.tensorboard=true needs tensorboardX: pip install 'ppl_jax[diagnostics]'."
_SINKS = itertools.count()


def check_available(folder: str | None = None) -> None:
    """Raises ConfigError (before any work) if tensorboardX, which the sink needs, is missing, or
    if `folder` (the event folder) is a file or cannot be created or written."""
    _tensorboardx()
    if folder is None:
        return
    if os.path.exists(folder) and not os.path.isdir(folder):
        raise ConfigError(
            f"output.tensorboard=true writes into {folder}, which is a file; move it away or "
            f"set output.dir to another folder."
        )
    try:
        os.makedirs(folder, exist_ok=True)
        probe = tempfile.NamedTemporaryFile(dir=folder, prefix=".probe-")
        probe.close()
    except OSError as e:
        raise ConfigError(
            f"output.tensorboard=true writes into {folder}, which cannot be written "
            f"({e.strerror or e}); fix its permissions or set output.dir to another folder."
        ) from None


def _tensorboardx() -> Any:
    try:
        from tensorboardX.event_file_writer import EventsWriter
        from tensorboardX.proto import event_pb2, summary_pb2
    except ImportError:
        raise ConfigError(_MISSING) from None
    return EventsWriter, event_pb2, summary_pb2


def tag_prefix(record: Mapping[str, Any]) -> str:
    """`eval/<dataset>` for a dataset record, `eval/average/<name>` for an average."""
    if record["kind"] == "average":
        return f"eval/average/{record['dataset']}"
    return f"eval/{record['dataset']}"


def scalars(record: Mapping[str, Any]) -> dict[str, float]:
    """The tags and values a record becomes (null metrics left out), float64 as stored."""
    prefix = tag_prefix(record)
    return {f"{prefix}/{k}": float(v) for k, v in record["metrics"].items() if v is not None}


def _walltime(record: Mapping[str, Any]) -> float:
    """The record's `time` in seconds since the epoch; now if it has none or it is unreadable."""
    try:
        return datetime.datetime.fromisoformat(record["time"]).timestamp()
    except (KeyError, TypeError, ValueError):
        return time.time()


class TensorBoardSink:
    """Writes records (`ppl_jax.outputs.store`) as TensorBoard scalars into `logdir`.

    Args:
      logdir: the folder (`output.dir/tensorboard`); created if needed.

    Raises:
      ConfigError: tensorboardX is not installed.
    """

    def __init__(self, logdir: str):
        events_writer, self._event_pb2, self._summary_pb2 = _tensorboardx()
        os.makedirs(logdir, exist_ok=True)
        self.logdir = logdir
        self._writer = events_writer(
            os.path.join(logdir, "events"), f".ppl_jax.{os.getpid()}.{next(_SINKS)}"
        )
        self._writer.flush()

    def write(self, records: Sequence[Mapping[str, Any]]) -> None:
        """Writes each record's metrics at its step (0 for a null step) and flushes to disk."""
        summary_pb2 = self._summary_pb2
        for record in records:
            values = [
                summary_pb2.Summary.Value(tag=tag, simple_value=value)
                for tag, value in scalars(record).items()
            ]
            if values:
                event = self._event_pb2.Event(
                    wall_time=_walltime(record),
                    step=record["step"] if record["step"] is not None else 0,
                    summary=summary_pb2.Summary(value=values),
                )
                self._writer.write_event(event)
        self._writer.flush()

    def end_step(self, step: int | None, records: Sequence[Mapping[str, Any]]) -> None:
        """Nothing more: each record was written as it was made (`write`)."""

    def close(self) -> None:
        """Flushes and closes the event file."""
        self._writer.close()

    def abort(self) -> None:
        """`close()`: what was written stays (each record's scalars were complete)."""
        self.close()

    def __enter__(self) -> TensorBoardSink:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
