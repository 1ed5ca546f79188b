"""Writes the column-size thumbnails of docs/diagnostics.md (`docs/images/paper_*.png`).

    python docs/make_paper_figures.py

Synthetic data (the shapes the tests draw: a results store of two datasets at three steps, a
position curve over 4,096 positions), drawn at one column (3.5 x 2.5 in) as a paper would:
no title (the caption says it), the legend right of the axes, the report's panels on one value
range. PNG at 150 dpi, each under 60 kB.
"""

from __future__ import annotations

import math
import os
import tempfile

import numpy as np

from ppl_jax.analysis import report
from ppl_jax.metrics import curves
from ppl_jax.metrics.sums import Sums
from ppl_jax.outputs import curve_figures, figures, store

IMAGES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "images")
COLUMN = (3.5, 2.5)  # inches
DPI = 150


def results_store(folder: str) -> list[dict]:
    """Two datasets tagged by domain at steps 1k, 2k, 3k, with 95% intervals of bits per byte."""
    s = store.ResultsStore.in_dir(folder)
    for step in (1000, 2000, 3000):
        records = []
        for k, name in enumerate(("web", "code")):
            nll = 1000.0 / math.log10(step + 20) + 50 * k
            bpb = nll / 2000 / math.log(2)
            records.append(
                store.dataset_record(
                    step=step,
                    dataset=name,
                    sums=Sums(nll_sum=nll, num_tokens=500, num_bytes=2000),
                    fingerprint="f",
                    tags={"domain": name},
                    details={"intervals": {"bits_per_byte": [bpb * 0.97, bpb * 1.03]}},
                )
            )
        s.append(records + store.average_records(records))
    return s.records()


def position() -> dict:
    """A position curve over 4,096 positions (log buckets), with 95% intervals."""
    rng = np.random.default_rng(1)
    count = rng.integers(1, 1000, 4097).astype(np.int64)
    count[0] = 0
    curve = curves.position_curve(count * (2.0 + 3.0 / np.sqrt(np.arange(4097) + 1.0)), count)
    for b in curve["buckets"]:
        if b["perplexity"] is not None:
            b[curve_figures.INTERVAL] = [b["perplexity"] * 0.95, b["perplexity"] * 1.05]
    curve["intervals"] = {"unit": "batch", "units": 12}
    return curve


def main() -> None:
    with tempfile.TemporaryDirectory() as folder:
        records = results_store(folder)
    fig = report.figure(records, "bits_per_byte", None, COLUMN, legend="right", share_y=True)
    figures.save_figure(fig, os.path.join(IMAGES, "paper_report.png"), DPI)
    fig = curve_figures.position_figure(position(), "", COLUMN, title=False, legend="right")
    figures.save_figure(fig, os.path.join(IMAGES, "paper_position.png"), DPI)


if __name__ == "__main__":
    main()
