"""The names of every file a run writes into `output.dir`: spelled here and nowhere else."""

from __future__ import annotations

import os
import re

RESULTS_JSON = "results.json"  # the run's summary (`ppl_jax.outputs.results_json`)
RESULTS_JSONL = "results.jsonl"  # a record per (step, dataset) and averages (`outputs.store`)
UNITS = "units.npz"  # per-unit sums for `ppl-jax compare` (`metrics.uncertainty.to_npz`)
DOCUMENTS = "documents.jsonl"  # per-document records (`output.per_document`)
TOKENS = "tokens.parquet"  # per-token rows (`output.tokens`, `outputs.tokens`)
JOURNAL = "journal.npz"  # the journal of a run of one step and one dataset (`outputs.journal`)
POSITION_CURVE = "position_curve"  # .json and .png
CONTEXT_CURVE = "context_curve"  # .json and .png
STUDY = "study"  # study.json: a study's copies against the original (`study.copies`)
TENSORBOARD = "tensorboard"  # the TensorBoard event folder (`output.sinks=tensorboard`)
REPORT_CSV = "report.csv"
REPORT_PNG = "report.png"
VIEW_HTML = "view.html"


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name)


def units_name(dataset: str | None, step: int | None = None, sweep: bool = False) -> str:
    """`units.npz` for a run of one dataset; `units-<dataset>.npz` for each dataset of a suite;
    in a sweep over steps, one per step: `units-step<step>.npz`, `units-step<step>-<dataset>.npz`
    (so that `ppl-jax compare` finds every step's, not the last one's)."""
    if sweep:
        where = f"step{step if step is not None else 'none'}"
        return f"units-{where}.npz" if dataset is None else f"units-{where}-{_safe(dataset)}.npz"
    return UNITS if dataset is None else f"units-{_safe(dataset)}.npz"


def journal_name(step: int | None, dataset: str) -> str:
    """The journal of one (step, dataset) pair of a training run."""
    return f"journal-{step if step is not None else 'hf'}-{_safe(dataset)}.npz"


def tensorboard_dir(output_dir: str) -> str:
    """The TensorBoard folder inside `output_dir`."""
    return os.path.join(output_dir, TENSORBOARD)
