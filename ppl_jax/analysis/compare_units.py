"""Where `ppl-jax compare` finds the per-unit sums of a run: every step of a sweep, every dataset
of a suite.

A run's output folder holds one `units*.npz` per (step, dataset) it scored
(`ppl_jax.outputs.files.units_name`): `units.npz` for a run of one step and one dataset,
`units-<dataset>.npz` per dataset of a suite, `units-step<step>[-<dataset>].npz` per step of a
sweep. Each file's identity says its `step` and `dataset` (`uncertainty.units_npz`); for a file
written before it did, they are taken from its name and the folder's `results.json`.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from typing import Any

from ppl_jax.errors import DataError
from ppl_jax.metrics import uncertainty
from ppl_jax.outputs import files

_PATTERN = re.compile(r"^units(?:-step(?P<step>\d+|none))?(?:-(?P<dataset>.+))?\.npz$")


@dataclasses.dataclass(frozen=True)
class UnitsFile:
    """One (step, dataset) of a run: `path` of its units file, its `identity`."""

    path: str
    step: int | None
    dataset: str
    identity: dict[str, Any]


@dataclasses.dataclass(frozen=True)
class Run:
    """A run's output folder: its `results.json` (or {}), and its units files by (step,
    dataset), in order of step."""

    folder: str
    results: dict[str, Any]
    units: list[UnitsFile]

    @property
    def steps(self) -> list[int | None]:
        return sorted({u.step for u in self.units}, key=lambda s: (s is not None, s or 0))

    def datasets(self, step: int | None) -> list[str]:
        return [u.dataset for u in self.units if u.step == step]

    def pick(self, step: int | None, dataset: str) -> UnitsFile:
        (found,) = [u for u in self.units if u.step == step and u.dataset == dataset]
        return found

    def bootstrap_defaults(self) -> tuple[int | None, int | None]:
        """The run's own `metrics.bootstrap_samples` and `metrics.seed` (results.json: its
        intervals, its datasets' intervals, or its config), None where it says nothing."""
        own = self.results.get("intervals") or {}
        for record in (self.results.get("datasets") or {}).values():  # a suite's or a sweep's
            own = own or ((record or {}).get("details") or {}).get("intervals") or {}
        config = (self.results.get("config") or {}).get("metrics") or {}
        samples = own.get("samples") or config.get("bootstrap_samples") or None
        seed = own.get("seed", config.get("seed"))
        return samples, seed


def open_run(path: str) -> Run:
    """The run at `path`: an output folder, or its results.json.

    Raises:
      DataError: the folder does not exist, its results.json cannot be read, or it holds no
        units file (with what a run writes and when).
    """
    folder = path if os.path.isdir(path) else os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder) or not (os.path.isdir(path) or os.path.isfile(path)):
        raise DataError(f"{path} does not exist; give a run's output.dir or its results.json.")
    results_path = os.path.join(folder, files.RESULTS_JSON)
    results: dict[str, Any] = {}
    if os.path.exists(results_path):
        try:
            with open(results_path, encoding="utf-8") as f:
                results = json.load(f)
        except (OSError, ValueError) as e:
            raise DataError(f"{results_path} is not a readable results.json ({e}).") from None
        if not isinstance(results, dict):
            raise DataError(f"{results_path} is not a results.json (not an object).")
    found = []
    for name in sorted(os.listdir(folder)):
        match = _PATTERN.match(name)
        if match is None:
            continue
        identity = uncertainty.read_identity(os.path.join(folder, name))
        step, dataset = _where(match, identity, results)
        found.append(UnitsFile(os.path.join(folder, name), step, dataset, identity))
    if not found:
        raise DataError(
            f"{folder} holds no {files.UNITS} (nor units-<dataset>.npz): a run writes one per "
            f"step and dataset beside results.json once that pair is scored; give a finished "
            f"run's output.dir."
        )
    found.sort(key=lambda u: (u.step is not None, u.step or 0, u.dataset))
    return Run(folder, results, found)


def _where(match: re.Match, identity: dict[str, Any], results: dict[str, Any]) -> tuple[Any, str]:
    """(step, dataset) of a units file: from its identity, else from its name and results.json."""
    if "dataset" in identity:
        return identity.get("step"), str(identity["dataset"])
    named = match.group("step")
    step = None if named in (None, "none") else int(named)
    if named is None:  # a file of a run of one step: the step results.json names
        step = results.get("step", (results.get("checkpoint") or {}).get("step"))
    dataset = match.group("dataset") or (results.get("data") or {}).get("name") or "?"
    return step, dataset


LATEST = "latest"


def choose(run: Run, step: Any, datasets: list[str] | None, which: str) -> list[UnitsFile]:
    """The units files of `run` at `step` (an integer, None for a checkpoint without steps, or
    `LATEST`: its last step) and of `datasets` (None: all at that step).

    Raises:
      DataError: the step or a dataset is not among the run's, naming those that are.
    """
    steps = run.steps
    if step == LATEST:
        step = steps[-1]
    elif step not in steps:
        raise DataError(
            f"run {which} ({run.folder}) holds per-unit sums of step{'s' if len(steps) > 1 else ''} "
            f"{_list(steps)}, not of step {step}; choose one of those (a sweep written before "
            f"per-step units kept only its last step's: score that step again)."
        )
    names = run.datasets(step)
    missing = [d for d in datasets or [] if d not in names]
    if missing:
        raise DataError(
            f"run {which} ({run.folder}) has no dataset {missing[0]!r} at step {step}; its "
            f"datasets there are {_list(names)}."
        )
    return [run.pick(step, d) for d in (datasets or names)]


def _list(values: list[Any]) -> str:
    return ", ".join("none" if v is None else str(v) for v in values)
