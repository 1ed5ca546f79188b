"""Sinks: where a run's records go, chosen by name (`output.sinks`). A record is a dict of
`ppl_jax.outputs.store`'s schema (a dataset at a step, or a step's average); every sink takes the
same records, so adding one (W&B, a database) adds a class and a `SINKS` row, and touches no
scoring code and no run wiring.

The protocol is clu's `MetricWriter` reduced to what an evaluation needs
(google/CommonLoopUtils, clu/metric_writers/interface.py): `write(records)` as they are made,
`end_step` with every record of a finished step, `close()` at the end of a run that finished,
`abort()` at the end of one that did not; the registry is levanter's `TrackerConfig` in
miniature (the config names the sinks, the registry opens them).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from ppl_jax.errors import ConfigError
from ppl_jax.outputs import console, files, tensorboard
from ppl_jax.outputs.folder import OutputDir
from ppl_jax.outputs.results_json import ResultsJsonSink
from ppl_jax.outputs.store import ResultsStore

Record = Mapping[str, Any]


class Sink(Protocol):
    """Takes a run's records as they are made."""

    def write(self, records: Sequence[Record]) -> None:
        """New records: each dataset's when it is scored, a step's averages once its datasets
        are in."""
        ...

    def end_step(self, step: int | None, records: Sequence[Record]) -> None:
        """Every record of a finished step: its datasets' (scored now, or stored by an earlier
        run with the same fingerprint) and its averages."""
        ...

    def close(self) -> None:
        """The run finished: the sink's files are complete."""
        ...

    def abort(self) -> None:
        """The run failed or was stopped: what the sink wrote so far stays; nothing that says
        a run is complete is written."""
        ...


class StoreSink:
    """Appends records to `results.jsonl` (`ResultsStore.append`: atomic, a record replaces the
    stored one of the same kind, step and dataset)."""

    def __init__(self, store: ResultsStore):
        self.store = store

    def write(self, records: Sequence[Record]) -> None:
        if records:
            self.store.append(records)

    def end_step(self, step: int | None, records: Sequence[Record]) -> None:
        pass

    def close(self) -> None:
        pass

    def abort(self) -> None:
        pass


class ConsoleSink:
    """Prints one line per record (`console.record_line`)."""

    def __init__(self, printer: Callable[[str], None] = print):
        self.printer = printer

    def write(self, records: Sequence[Record]) -> None:
        for record in records:
            self.printer(console.record_line(record))

    def end_step(self, step: int | None, records: Sequence[Record]) -> None:
        pass

    def close(self) -> None:
        pass

    def abort(self) -> None:
        pass


@dataclasses.dataclass(frozen=True)
class RunInfo:
    """What a sink may need of the run that opens it.

    Attributes:
      out: the locked output folder (process 0).
      store: its `results.jsonl`.
      printer: where the console's lines go.
      checkpoint: `{"path", "format"}` of the checkpoint scored.
      config: the command line's config as JSON (recorded in results.json), or None.
      started: `time.perf_counter()` when the run started.
    """

    out: OutputDir
    store: ResultsStore
    printer: Callable[[str], None] = print
    checkpoint: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    config: Mapping[str, Any] | None = None
    started: float = 0.0


@dataclasses.dataclass(frozen=True)
class Kind:
    """A sink by name: `open(run)` makes it; `check(out)` refuses, before any work, what would
    make it fail later (a missing package, a folder it cannot write)."""

    open: Callable[[RunInfo], Sink]
    check: Callable[[OutputDir], None] = lambda out: None


SINKS: dict[str, Kind] = {
    # results.json: the run's summary, written last, once the run finished.
    "results_json": Kind(
        lambda run: ResultsJsonSink(
            run.out, run.store.path, run.checkpoint, run.config, run.started
        )
    ),
    # results.jsonl: a record per (step, dataset) and the averages.
    "jsonl": Kind(lambda run: StoreSink(run.store)),
    # a line per record on the console (a training run: a suite or a sweep).
    "console": Kind(lambda run: ConsoleSink(run.printer)),
    # TensorBoard scalars in output.dir/tensorboard (the `diagnostics` extra).
    "tensorboard": Kind(
        lambda run: tensorboard.TensorBoardSink(files.tensorboard_dir(run.out.path)),
        lambda out: tensorboard.check_available(files.tensorboard_dir(out.path)),
    ),
}
ALWAYS = ("jsonl", "results_json")  # every run with an output folder keeps these


def names(text: Any, where: str = "output.sinks") -> tuple[str, ...]:
    """The sinks a setting names: `"tensorboard"`, `"jsonl,tensorboard"` or a sequence;
    distinct, in the order given.

    Raises:
      ConfigError: a name that is not in `SINKS`.
    """
    items = text.split(",") if isinstance(text, str) else list(text or ())
    found = tuple(dict.fromkeys(str(x).strip() for x in items if str(x).strip()))
    for name in found:
        if name not in SINKS:
            raise ConfigError(f"{where}: {name!r} is not a sink ({', '.join(SINKS)}).")
    return found


def check(chosen: Sequence[str], out: OutputDir | None) -> None:
    """Every sink's check (`Kind.check`), on process 0 (`out` given).

    Raises:
      ConfigError: a sink that cannot work (its package missing, its folder not writable).
    """
    if out is not None:
        for name in chosen:
            SINKS[name].check(out)


def open_sinks(chosen: Sequence[str], run: RunInfo) -> list[Sink]:
    """The sinks `ALWAYS` and `chosen` name, in that order (results.json last: once it is
    there, the run's files are all there), each opened once."""
    order = [n for n in dict.fromkeys([*ALWAYS, *chosen]) if n != "results_json"]
    return [SINKS[name].open(run) for name in [*order, "results_json"]]


def close_all(sinks: Sequence[Sink], finished: bool) -> None:
    """`close()` (a finished run) or `abort()` every sink, in order; once one fails, the others
    are aborted (no results.json after a file that could not be completed), and the first error
    is raised."""
    error: BaseException | None = None
    for sink in sinks:
        try:
            if finished and error is None:
                sink.close()
            else:
                sink.abort()
        except BaseException as e:  # noqa: BLE001  (raised below, once every sink is closed)
            error = error or e
    if error is not None:
        raise error
