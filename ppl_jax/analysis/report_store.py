"""The records of `ppl-jax report`: a results store read and checked, and its columns.

A results store (`ppl_jax.outputs.store`: `results.jsonl`) holds one record per checkpoint step
and dataset (`kind: dataset`) and the averages of each step (`kind: average`: micro, macro,
macro/<key>=<value>). `ppl_jax.analysis.report` draws its table and CSV from these, and
`ppl_jax.analysis.report_figure` its figure.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from ppl_jax.errors import DataError
from ppl_jax.outputs.store import FILENAME, ResultsStore

Column = tuple[str, str]  # (kind, dataset)


def load(path: str) -> tuple[str, list[dict[str, Any]]]:
    """The results store at `path` (a results folder or its results.jsonl) and its records.

    Raises:
      DataError: the folder or file does not exist, is malformed, or holds no record.
    """
    if not os.path.exists(path):
        raise DataError(f"{path} does not exist; give a run's output.dir or its {FILENAME}.")
    store = ResultsStore.in_dir(path) if os.path.isdir(path) else ResultsStore(path)
    if not os.path.exists(store.path):
        raise DataError(
            f"{store.path} does not exist; a run writes it into its output.dir, one record per "
            f"checkpoint step and dataset."
        )
    records = store.records()
    if not records:
        raise DataError(f"{store.path} holds no record; nothing to report.")
    bad = [i for i, r in enumerate(records) if not _has_metrics(r)]
    if bad:
        raise DataError(
            f"{store.path} line {_line_of(store.path, bad[0])} has no metrics (an object of "
            f"numbers or nulls); remove that line, or score that step and dataset again."
        )
    return store.path, records


def _has_metrics(record: Mapping[str, Any]) -> bool:
    metrics = record.get("metrics")
    return isinstance(metrics, dict) and all(
        v is None or (isinstance(v, (int, float)) and not isinstance(v, bool))
        for v in metrics.values()
    )


def _line_of(path: str, index: int) -> int:
    """The file line of the store's record `index` (the store skips blank lines)."""
    with open(path, encoding="utf-8") as f:
        filled = [n for n, line in enumerate(f, start=1) if line.strip()]
    return filled[index]


def step_order(step: int | None) -> tuple[int, int]:
    """The sort key of a step: a null step (a checkpoint without one) first, then by number."""
    return (0, 0) if step is None else (1, step)


def columns(records: Sequence[Mapping[str, Any]]) -> list[Column]:
    """The datasets in order of first appearance, then micro, macro and the tag averages."""
    datasets = list(dict.fromkeys(r["dataset"] for r in records if r["kind"] == "dataset"))
    averages = {r["dataset"] for r in records if r["kind"] == "average"}
    first = [a for a in ("micro", "macro") if a in averages]
    rest = sorted(averages - set(first))
    return [("dataset", d) for d in datasets] + [("average", a) for a in first + rest]


def metric_names(records: Sequence[Mapping[str, Any]]) -> list[str]:
    """Every metric any record holds, in order of first appearance."""
    return list(dict.fromkeys(m for r in records for m in r["metrics"]))


def by_cell(records: Sequence[Mapping[str, Any]]) -> dict[tuple[int | None, Column], Mapping]:
    """Each record by `(step, (kind, dataset))`. The store keeps one record per cell; if a file
    holds more, the last wins."""
    return {(r["step"], (r["kind"], r["dataset"])): r for r in records}
