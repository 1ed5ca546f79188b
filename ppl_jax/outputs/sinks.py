"""Sinks: where a run's records go. A record is a dict of `ppl_jax.outputs.store`'s schema (a
dataset at a step, or a step's average); every sink takes the same records, so adding one (W&B,
a database) adds a class here and touches no scoring code.

The protocol is clu's `MetricWriter` reduced to what an evaluation needs: `write(records)` as
they are made, `close()` at the end (google/CommonLoopUtils, clu/metric_writers/interface.py).
`ppl_jax.outputs.tensorboard.TensorBoardSink` is one too.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from ppl_jax.outputs import console
from ppl_jax.outputs.store import ResultsStore

Record = Mapping[str, Any]


class Sink(Protocol):
    """Takes a run's records as they are made."""

    def write(self, records: Sequence[Record]) -> None: ...

    def close(self) -> None: ...


class StoreSink:
    """Appends records to `results.jsonl` (`ResultsStore.append`: atomic, a record replaces the
    stored one of the same kind, step and dataset)."""

    def __init__(self, store: ResultsStore):
        self.store = store

    def write(self, records: Sequence[Record]) -> None:
        if records:
            self.store.append(records)

    def close(self) -> None:
        pass


class ConsoleSink:
    """Prints one line per record (`console.record_line`)."""

    def __init__(self, printer: Callable[[str], None] = print):
        self.printer = printer

    def write(self, records: Sequence[Record]) -> None:
        for record in records:
            self.printer(console.record_line(record))

    def close(self) -> None:
        pass
