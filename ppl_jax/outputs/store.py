"""The results store of `output.dir`: `results.jsonl`, a record per (step, dataset), and averages.

Each line is one strict JSON object (no NaN, no infinity):

    {"kind": "dataset" | "average", "step": int | null, "dataset": name,
     "tags": {key: value}, "fingerprint": sha256 hex (datasets only),
     "metrics": {"perplexity": ..., "bits_per_byte": ..., ...}, "notes": {metric: reason},
     "sums": {"nll_sum": ..., "num_tokens": ..., ...} (datasets and micro),
     "datasets": [names] (averages), "checkpoint": path, "time": ISO-8601 UTC,
     "wall_seconds": float, "details": {...} (datasets: the keys of results.json for one
     dataset, `ppl_jax.evaluation.summary.dataset_dict`)}

`metrics` are `ppl_jax.metrics.sums.derive` of the sums (the same numbers as results.json); a value
that is undefined (no bytes, no words) or overflows float64 is null, and `notes` says why.

The averages of a step follow Paloma (Magnusson et al. 2023, "Paloma: A Benchmark for Evaluating
Language Model Fit", which reports both over its domains):

- `micro`: over every token of every dataset, from the summed sums: perplexity
  exp(sum nll_sum / sum num_tokens), bits per byte sum nll_sum / (sum num_bytes * ln 2), and so on
  for every metric of `derive`.
- `macro`: the unweighted mean over datasets of each dataset's metric (each dataset counts once,
  however large).
- `macro/<key>=<value>`: the same over the datasets whose tags give `key` the value `value`.

The store is rewritten whole on every `append` (temporary file, fsync, `os.replace`): a reader or
a crash sees the old file or the new one, never half a line.
"""

from __future__ import annotations

import copy
import dataclasses
import datetime
import json
import math
import os
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ppl_jax.data.spec import parse_tags  # noqa: F401  (a dataset's tags, named here too)
from ppl_jax.errors import DataError
from ppl_jax.metrics import sums as metrics_lib
from ppl_jax.outputs import files
from ppl_jax.outputs.folder import OutputDir

FILENAME = files.RESULTS_JSONL
KINDS = ("dataset", "average")
# The unweighted mean over datasets is taken of every metric of `metrics.derive`: each is a rate per
# token, byte or word of one dataset (perplexity, NLL and bits per token, bits per byte, byte and
# word perplexity, predictive entropy and its perplexity, top-1 accuracy), so the mean weighs each
# dataset equally, as Paloma's macro average does for perplexity.
MACRO_METRICS = tuple(metrics_lib.derive(metrics_lib.Sums()))


def now() -> str:
    """The current time, ISO-8601 UTC to the second (`2025-01-31T12:00:00+00:00`)."""
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")


def _metrics(sums: metrics_lib.Sums) -> tuple[dict[str, float | None], dict[str, str]]:
    """`derive(sums)` as strict JSON: inf (overflow) becomes null; notes say why for each null."""
    derived = metrics_lib.derive(sums)
    values = {k: (v if v is not None and math.isfinite(v) else None) for k, v in derived.items()}
    return values, dict(derived.notes)


def _sums_dict(sums: metrics_lib.Sums) -> dict[str, Any]:
    if not math.isfinite(sums.nll_sum) or not math.isfinite(sums.entropy_sum):
        raise ValueError(f"sums must be finite to be stored, got {sums}")
    return {
        f.name: (float if f.type in ("float", float) else int)(getattr(sums, f.name))
        for f in dataclasses.fields(sums)
    }


def sums_of(record: Mapping[str, Any]) -> metrics_lib.Sums:
    """The `Sums` of a dataset or micro record (fields absent from it are 0)."""
    names = {f.name for f in dataclasses.fields(metrics_lib.Sums)}
    return metrics_lib.Sums(**{k: v for k, v in record["sums"].items() if k in names})


def dataset_record(
    *,
    step: int | None,
    dataset: str,
    sums: metrics_lib.Sums,
    fingerprint: str,
    tags: Mapping[str, str] | None = None,
    checkpoint: str | None = None,
    wall_seconds: float | None = None,
    time: str | None = None,
    details: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The record of one dataset scored at one checkpoint step.

    Args:
      step: the checkpoint's training step; None for a checkpoint without one (a Hugging Face
        directory).
      dataset: the suite entry's `name` (or `data` for the single dataset).
      sums: its sufficient statistics (nats and counts; `nll_sum` finite).
      fingerprint: sha256 hex of everything that decides the numbers (`ppl_jax.runtime.fingerprint`).
      tags: the entry's tags (`parse_tags`).
      checkpoint: the checkpoint's path.
      wall_seconds: seconds spent scoring it.
      time: ISO-8601 UTC; default now.
      details: the dataset's full result (`ppl_jax.evaluation.summary.dataset_dict`: counts,
        protocol, intervals, gzip baseline, timings, model, tokenizer), or None.

    Returns:
      A JSON-ready dict (see the module docstring); `metrics` from `metrics.derive(sums)`.
    """
    values, notes = _metrics(sums)
    return {
        "kind": "dataset",
        "step": None if step is None else int(step),
        "dataset": dataset,
        "tags": dict(tags or {}),
        "fingerprint": fingerprint,
        "metrics": values,
        "notes": notes,
        "sums": _sums_dict(sums),
        "checkpoint": checkpoint,
        "time": time or now(),
        "wall_seconds": None if wall_seconds is None else float(wall_seconds),
        **({"details": dict(details)} if details is not None else {}),
    }


def _mean(records: Sequence[Mapping[str, Any]], metric: str) -> tuple[float | None, str | None]:
    """The unweighted mean of `metric` over `records`; None (with a note) if any is null."""
    undefined = [r["dataset"] for r in records if r["metrics"].get(metric) is None]
    if undefined:
        return None, f"undefined ({metric} is null for {', '.join(undefined)})"
    total = math.fsum(float(r["metrics"][metric]) for r in records)
    mean = total / len(records)
    return (mean, None) if math.isfinite(mean) else (None, "undefined (overflow)")


def _average(
    name: str, records: Sequence[Mapping[str, Any]], tags: dict[str, str], base: dict[str, Any]
) -> dict[str, Any]:
    values: dict[str, float | None] = {}
    notes: dict[str, str] = {}
    for metric in MACRO_METRICS:
        values[metric], note = _mean(records, metric)
        if note:
            notes[metric] = note
    return {
        **base,
        "dataset": name,
        "tags": tags,
        "metrics": values,
        "notes": notes,
        "datasets": [r["dataset"] for r in records],
    }


def average_records(
    dataset_records: Sequence[Mapping[str, Any]],
    tags: Iterable[str] | None = None,
    time: str | None = None,
) -> list[dict[str, Any]]:
    """The averages of one step's dataset records: micro, macro, and macro per tag value.

    Micro sums the datasets' sums and derives every metric from the total (null where a dataset's
    value is undefined, as bits per byte of a dataset without bytes: its NLL would enter the sum
    without its bytes); macro is the unweighted mean over datasets of each metric in
    `MACRO_METRICS` (all of `metrics.derive`'s);
    `macro/<key>=<value>` is that mean over the datasets tagged `key=value`, for each key in
    `tags` (default: every key any dataset carries), in sorted order. A mean over datasets is null
    when a dataset's value is null (a dataset without bytes has no bits per byte, and a mean that
    left it out would silently change what is averaged); `notes` names the datasets. Formulas and
    reference: the module docstring (Paloma, Magnusson et al. 2023).

    Args:
      dataset_records: records of kind "dataset" (`dataset_record`), all of the same step and
        checkpoint, with distinct dataset names.
      tags: the tag keys to average by; None for all.
      time: ISO-8601 UTC; default now.

    Returns:
      `[micro, macro, macro/<key>=<value>, ...]`; `wall_seconds` is the datasets' total. Empty
      for no dataset records.

    Raises:
      ValueError: the records are not dataset records of one step and checkpoint, or repeat a
        dataset (a bug of the caller, not a user's mistake).
    """
    records = list(dataset_records)
    if not records:
        return []
    _check_one_step(records)
    walls = [r.get("wall_seconds") for r in records]
    base = {
        "kind": "average",
        "step": records[0]["step"],
        "checkpoint": records[0]["checkpoint"],
        "time": time or now(),
        "wall_seconds": None if None in walls else math.fsum(walls),
    }
    out = [_micro(records, base), _average("macro", records, {}, base)]
    keys = sorted({k for r in records for k in r["tags"]} if tags is None else set(tags))
    for key in keys:
        for value in sorted({r["tags"][key] for r in records if key in r["tags"]}):
            group = [r for r in records if r["tags"].get(key) == value]
            out.append(_average(f"macro/{key}={value}", group, {key: value}, base))
    return out


def _check_one_step(records: Sequence[Mapping[str, Any]]) -> None:
    """Raises ValueError unless `records` are dataset records of one step and checkpoint, each
    dataset once."""
    if any(r["kind"] != "dataset" for r in records):
        raise ValueError("average_records takes records of kind 'dataset' only")
    if len({r["step"] for r in records}) != 1 or len({r["checkpoint"] for r in records}) != 1:
        raise ValueError("average_records takes the records of one step and checkpoint")
    names = [r["dataset"] for r in records]
    if len(set(names)) != len(names):
        raise ValueError(f"average_records: a dataset is given twice in {names}")


def _micro(records: Sequence[Mapping[str, Any]], base: dict[str, Any]) -> dict[str, Any]:
    """The micro average: every metric of the summed sums, null where a dataset's value is
    undefined (a dataset without bytes adds NLL but no bytes: no pooled ratio)."""
    total = metrics_lib.Sums.merge(sums_of(r) for r in records)
    values, notes = _metrics(total)
    for metric in values:
        undefined = [r["dataset"] for r in records if _undefined(r, metric)]
        if undefined:
            values[metric] = None
            notes[metric] = f"undefined ({metric} is undefined for {', '.join(undefined)})"
    return {
        **base,
        "dataset": "micro",
        "tags": {},
        "metrics": values,
        "notes": notes,
        "sums": _sums_dict(total),
        "datasets": [r["dataset"] for r in records],
    }


def _undefined(record: Mapping[str, Any], metric: str) -> bool:
    """True if the record's metric is undefined (a zero denominator), not merely overflowing."""
    return record["metrics"].get(metric) is None and not record.get("notes", {}).get(
        metric, "undefined"
    ).startswith("inf")


def _key(record: Mapping[str, Any]) -> tuple[str, int | None, str]:
    return record["kind"], record["step"], record["dataset"]


class ResultsStore:
    """`results.jsonl`: the records of every (step, dataset) evaluated into one `output.dir`.

    Only one process writes it (process 0, holding the output folder's lock); every write
    replaces the whole file atomically. The parsed records are kept in memory while the file's
    inode, size and times stay the same, so `done` for every dataset of a long sweep does not
    parse the file again each time.

    Attributes:
      path: the file.
    """

    def __init__(self, path: str):
        self.path = path
        self._cache: tuple[tuple[int, ...], list[dict[str, Any]]] | None = None

    @classmethod
    def in_dir(cls, folder: str) -> ResultsStore:
        """The store `folder/results.jsonl`."""
        return cls(os.path.join(folder, FILENAME))

    def _signature(self) -> tuple[int, ...]:
        st = os.stat(self.path)
        return st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns

    def _load(self) -> list[dict[str, Any]]:
        """The parsed records (shared with the cache: not to be changed)."""
        try:
            signature = self._signature()  # before reading: a file replaced meanwhile re-reads
        except FileNotFoundError:
            return []
        if self._cache is None or self._cache[0] != signature:
            self._cache = signature, self._parse()
        return self._cache[1]

    def _parse(self) -> list[dict[str, Any]]:
        try:
            with open(self.path, encoding="utf-8") as f:
                lines = f.read().splitlines()
        except FileNotFoundError:
            return []
        except (OSError, UnicodeDecodeError) as e:
            raise DataError(f"{self.path} cannot be read ({e}); fix or remove it.") from None
        out = []
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line, parse_constant=_reject_constant)
                valid = (
                    isinstance(record, dict)
                    and record.get("kind") in KINDS
                    and isinstance(record.get("dataset"), str)
                    and "step" in record
                    and (record["step"] is None or type(record["step"]) is int)
                )
                if not valid:
                    raise ValueError("not a record with kind, step and dataset")
            except ValueError as e:
                raise DataError(
                    f"{self.path} line {number} is not a results record ({e}); remove that "
                    f"line, or move the file away to start a new store."
                ) from None
            out.append(record)
        return out

    def records(self) -> list[dict[str, Any]]:
        """Every record (a copy), in file order; [] for a missing or empty file.

        Raises:
          DataError: a line is not a strict JSON object with `kind`, `step` and `dataset`
            (naming the file and the line).
        """
        return copy.deepcopy(self._load())

    def dataset_records(
        self, step: int | None, names: Iterable[str] | None = None
    ) -> list[dict[str, Any]]:
        """The dataset records (copies) of `step`, of the datasets `names` if given, in file
        order: what `average_records` takes, including datasets stored by an earlier run.

        Raises:
          DataError: the file is malformed (see `records`).
        """
        wanted = None if names is None else set(names)
        return copy.deepcopy(
            [
                r
                for r in self._load()
                if r["kind"] == "dataset"
                and r["step"] == step
                and (wanted is None or r["dataset"] in wanted)
            ]
        )

    def done(self, step: int | None, dataset: str, fingerprint: str) -> bool:
        """True if a dataset record with this step, dataset and fingerprint is stored.

        Raises:
          DataError: the file is malformed (see `records`).
        """
        return any(
            r["kind"] == "dataset"
            and r["step"] == step
            and r["dataset"] == dataset
            and r.get("fingerprint") == fingerprint
            for r in self._load()
        )

    def append(self, records: Sequence[Mapping[str, Any]]) -> None:
        """Adds `records` at the end; each replaces a stored record of the same (kind, step,
        dataset), so a re-run (with a new fingerprint) supersedes the old numbers.

        Written atomically: the whole new file goes to a temporary file in the same folder, is
        flushed to disk and renamed over the old one (`OutputDir.write_jsonl`); if anything
        fails, the old file is left as it was.

        Raises:
          DataError: the stored file is malformed (see `records`).
          ValueError: a record holds NaN or infinity, or two of `records` share a key.
          ConfigError: the folder cannot be written (no space left, ...), in one sentence.
        """
        keys = [_key(r) for r in records]
        if len(set(keys)) != len(keys):
            raise ValueError(f"append: records with the same (kind, step, dataset) in {keys}")
        # As they will read back (and NaN or infinity refused before anything is written).
        added = [json.loads(json.dumps(r, allow_nan=False)) for r in records]
        new = set(keys)
        after = [r for r in self._load() if _key(r) not in new] + added
        folder = os.path.dirname(os.path.abspath(self.path))
        self._cache = None
        OutputDir(folder, None).write_jsonl(os.path.basename(self.path), after)
        self._cache = self._signature(), after


def _reject_constant(name: str) -> None:
    raise ValueError(f"{name} is not strict JSON")
