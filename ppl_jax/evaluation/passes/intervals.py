"""The 95% bootstrap intervals of the diagnostics' curves: each point's `perplexity_interval`
(`ppl_jax.metrics.uncertainty.curve_intervals`) and the curve's `intervals`, how they were drawn.
The position curve resamples the batches of windows as they were scored; the context sweep, its
windows, per context length (`ppl_jax.evaluation.passes.context_sweep`)."""

from __future__ import annotations

from typing import Any

import numpy as np

from ppl_jax.evaluation.spec import RunSpec
from ppl_jax.metrics import curves, uncertainty
from ppl_jax.outputs import curve_figures


def curve_interval(nll: np.ndarray, tokens: np.ndarray, spec: RunSpec, block: int) -> list:
    """`uncertainty.curve_intervals`, or Nones when `metrics.bootstrap_samples` is 0."""
    if spec.bootstrap_samples == 0:
        return [None] * nll.shape[1]
    return uncertainty.curve_intervals(nll, tokens, spec.bootstrap_samples, spec.seed, block)


def with_intervals(
    curve: dict[str, Any], spec: RunSpec, unit: str, units: int | list[int]
) -> dict[str, Any]:
    """`curve` with `intervals`: how its points' `perplexity_interval`s were drawn (`method`,
    `unit`, `units`, `samples`, `seed`, `level`), or None when `metrics.bootstrap_samples` is 0."""
    if spec.bootstrap_samples == 0:
        curve["intervals"] = None
        return curve
    method = {
        "batch": "bootstrap over batches (the batches of windows as scored)",
        "window": uncertainty.METHODS["window"] + ", per context length",
    }[unit]
    curve["intervals"] = {
        "method": method,
        "unit": unit,
        "units": units,
        "samples": spec.bootstrap_samples,
        "seed": spec.seed,
        "level": uncertainty.LEVEL,
    }
    return curve


def position_intervals(curve: dict[str, Any], totals: Any, spec: RunSpec) -> dict[str, Any]:
    """The position curve with each bucket's 95% interval of perplexity (`perplexity_interval`),
    from its per-batch sums (`ScoreTotals.batch_buckets`: the batches of windows as they were
    scored are the resampled units), and `intervals` saying how (`with_intervals`)."""
    buckets = totals.batch_buckets
    if buckets is None:
        return curve
    used = buckets[:, 1].sum(axis=1) > 0  # batches that scored something (all, unless resumed)
    found = curve_interval(buckets[used, 0], buckets[used, 1], spec, 1)
    starts = curves.bucket_edges(curve["num_positions"], curve["max_points"])[:-1].tolist()
    by_first = dict(zip(starts, found, strict=True))
    for b in curve["buckets"]:
        b[curve_figures.INTERVAL] = by_first[b["first"]]
    return with_intervals(curve, spec, "batch", int(used.sum()))
