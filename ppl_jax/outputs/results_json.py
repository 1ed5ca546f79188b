"""`results.json`: a run's summary, assembled here (`assemble`) and written once, last, by a sink
(`ResultsJsonSink`) when the run finished; once it is there, the run's files are all there.

It holds the last step's records (`datasets`, `averages`; `ppl_jax.outputs.store`'s schema), the
path of `results.jsonl`, `run` (what ran, where and when: `run_dict`) and `config` (the command
line's). A run of one dataset also has that dataset's result at the top level (its record's
`details`, `ppl_jax.evaluation.summary.dataset_dict`: the keys a single run has always written).
The file is strict JSON: a non-finite value is null and `notes` says why, by its path.
"""

from __future__ import annotations

import datetime
import importlib.metadata
import math
import platform
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ppl_jax.outputs import files
from ppl_jax.outputs.folder import OutputDir

VERSIONED_PACKAGES = ("ppl_jax", "jax", "jaxlib", "flax", "orbax-checkpoint")
Record = Mapping[str, Any]


def assemble(
    step: int | None,
    records: Sequence[Record],
    checkpoint: Mapping[str, Any],
    results_jsonl: str | None,
    wall_seconds: float,
    config: Mapping[str, Any] | None,
) -> dict[str, Any]:
    """`results.json` of a run whose last step is `step`.

    Args:
      records: every record of that step (`ppl_jax.outputs.store`): its datasets' and averages.
      checkpoint: `{"path", "format"}` (a run of one dataset has its record's instead).
      results_jsonl: the store's path (None: none kept); wall_seconds: the whole run's.
      config: the command line's config as JSON, or None.

    Returns:
      The dict: `step`, `datasets` and `averages` (by name), `results_jsonl`, `wall_seconds`,
      `run`, `config`, `checkpoint`, `notes`; for one dataset its `details` at the top level.
    """
    stored = [r for r in records if r["kind"] == "dataset"]
    averages = [r for r in records if r["kind"] == "average"]
    top: dict[str, Any] = {}
    if len(stored) == 1 and "details" in stored[0]:
        top = dict(stored[0]["details"])
    top.update(
        {
            "step": step,
            "datasets": {r["dataset"]: r for r in stored},
            "averages": {r["dataset"]: r for r in averages},
            "results_jsonl": results_jsonl,
            "wall_seconds": wall_seconds,
            "run": run_dict(wall_seconds),
            "config": config,
        }
    )
    top.setdefault("checkpoint", dict(checkpoint))
    notes = dict(top.pop("notes", {}))
    top = strict_json(top, "", notes)
    top["notes"] = notes
    return top


class ResultsJsonSink:
    """Writes `results.json` into `out` at `close()`, from the last finished step's records
    (`end_step`); a run that fails or is stopped (`abort()`) writes none.

    Args:
      out: the output folder; results_jsonl: the store's path.
      checkpoint: `{"path", "format"}`; config: the command line's config as JSON, or None.
      started: `time.perf_counter()` when the run started (for `wall_seconds`).

    Attributes:
      results: the dict written (after `close`), else None; path: where.
    """

    def __init__(
        self,
        out: OutputDir,
        results_jsonl: str,
        checkpoint: Mapping[str, Any],
        config: Mapping[str, Any] | None,
        started: float,
    ):
        self.out, self.results_jsonl = out, results_jsonl
        self.checkpoint, self.config, self.started = checkpoint, config, started
        self.results: dict[str, Any] | None = None
        self.path: str | None = None
        self._last: tuple[int | None, list[Record]] | None = None

    def write(self, records: Sequence[Record]) -> None:
        pass

    def end_step(self, step: int | None, records: Sequence[Record]) -> None:
        self._last = (step, list(records))

    def close(self) -> None:
        if self._last is None:
            return
        step, records = self._last
        wall = time.perf_counter() - self.started
        self.results = assemble(
            step, records, self.checkpoint, self.results_jsonl, wall, self.config
        )
        self.path = self.out.write_json(files.RESULTS_JSON, self.results)

    def abort(self) -> None:
        pass


def run_dict(wall_seconds: float) -> dict[str, Any]:
    """What ran, where and when: for a reader of `results.json` months later.

    Returns:
      `started_utc`/`finished_utc` (ISO 8601, seconds; the end is now, the start `wall_seconds`
      before), `command` (sys.argv), `versions` (package -> version from
      `importlib.metadata`, None where not installed), `python`, `platform` (JAX's backend:
      cpu, gpu, tpu), `device_kind` (e.g. `NVIDIA H100 80GB HBM3`; kinds joined by `, ` on a
      mixed cluster), `device_count` (global), `process_count`, `host` (`platform.platform()`).
    """
    import jax

    finished = datetime.datetime.now(datetime.UTC)
    started = finished - datetime.timedelta(seconds=wall_seconds)
    devices = jax.devices()
    return {
        "started_utc": started.isoformat(timespec="seconds"),
        "finished_utc": finished.isoformat(timespec="seconds"),
        "command": list(sys.argv),
        "versions": versions(),
        "python": platform.python_version(),
        "platform": jax.default_backend(),
        "device_kind": ", ".join(sorted({d.device_kind for d in devices})),
        "device_count": len(devices),
        "process_count": jax.process_count(),
        "host": platform.platform(),
    }


def versions() -> dict[str, str | None]:
    """`VERSIONED_PACKAGES` -> installed version (`importlib.metadata`), None where absent."""
    found: dict[str, str | None] = {}
    for package in VERSIONED_PACKAGES:
        try:
            found[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            found[package] = None
    return found


def strict_json(value: Any, path: str, notes: dict[str, str]) -> Any:
    """`value` with NumPy scalars made Python and non-finite floats made None (noted by path in
    `notes`, e.g. `{"word_perplexity": "inf"}`)."""
    if isinstance(value, dict):
        return {
            k: strict_json(v, f"{path}.{k}" if path else str(k), notes) for k, v in value.items()
        }
    if isinstance(value, (list, tuple)):
        return [strict_json(v, f"{path}[{i}]", notes) for i, v in enumerate(value)]
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        notes.setdefault(path, "undefined (not a number)" if math.isnan(value) else f"{value}")
        return None
    return value
