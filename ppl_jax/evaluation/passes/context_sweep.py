"""The context-length sweep (`eval.context_lengths`): the same targets scored again with each
context length, by the run's model and params on the run's step (`pass_scorer`), after the run's
pass; its curve with each length's 95% interval (`context_curve.json`; docs/diagnostics.md)."""

from __future__ import annotations

from typing import Any

import jax

from ppl_jax.evaluation.passes.intervals import curve_interval, with_intervals
from ppl_jax.evaluation.passes.shared import BarFactory, pass_scorer
from ppl_jax.evaluation.spec import DiagnosticsSpec, RunSpec
from ppl_jax.metrics import curves, uncertainty
from ppl_jax.models.interface import LanguageModel
from ppl_jax.outputs import curve_figures
from ppl_jax.plans import windows
from ppl_jax.plans.layout import plan_layout
from ppl_jax.plans.protocols import Plan
from ppl_jax.scoring.observers import ScoreObserver


def context_targets(d: DiagnosticsSpec, length: int, model: LanguageModel) -> int:
    """Targets per window of the sweep at context `length`: `eval.context_targets`, or by default
    `min(L, max_positions - L + 1)` (each target then sees L..2L-1 tokens; about 2 model
    positions per target), at least 1."""
    return d.context_targets or max(1, min(length, model.max_positions - length + 1))


def context_sweep(
    model: LanguageModel,
    params: Any,
    mesh: Any,
    shardings: Any,
    plan: Plan,
    spec: RunSpec,
    stop: ScoreObserver | None = None,
    bar: BarFactory | None = None,
) -> dict[str, Any] | None:
    """Scores the same targets with each of `eval.context_lengths` (`windows.context_windows`).

    The targets are every token of the stream from position `max(context_lengths)` on, in
    windows of S targets (`context_targets`); with context length L each target sees between L
    and L + S - 1 tokens. Returns the context curve (`curves.context_curve`) with each length's
    95% interval (`with_intervals`; {} on a process other than 0, which writes nothing), or None
    if `stop` (the run's `StopRequest`) ended it.
    `bar` (given the number of windows of every length together, returns an observer of the
    loop: `Passes.bar("context sweep")`) shows the sweep's progress.

    Raises:
      DataError: the stream is not longer than the longest context length.
    """
    d: DiagnosticsSpec = spec.diagnostics
    scorer = pass_scorer(model, mesh, shardings, spec, per_token=False)
    first = d.context_lengths[-1]
    results, targets, units, sweep = [], {}, [], []
    for length in d.context_lengths:
        targets[length] = context_targets(d, length, model)
        w = windows.context_windows(plan.windows.tokens, length, targets[length], first)
        sweep.append((length, w, plan_layout(w, spec.batch.batch_size, pack=False)))
    total = sum(w.num_windows for _, w, _ in sweep)
    progress = bar(total) if bar else None
    observers = [o for o in (stop, progress) if o is not None]
    try:
        for length, w, layout in sweep:
            totals = scorer.score(params, w, layout, observers=observers)
            if totals.stopped_at is not None:
                return None
            results.append((length, totals.nll_sum, totals.num_tokens))
            units.append((totals.window_nll, totals.window_tokens))
    finally:
        if progress is not None:
            progress.close()
    if jax.process_index() != 0:  # scored on every process; its curve built where it is written
        return {}
    curve = curves.context_curve(results, targets_per_window=targets)
    for row, (nll, tokens) in zip(curve["context_lengths"], units, strict=True):
        block = uncertainty.block_length(nll.size)
        row[curve_figures.INTERVAL] = curve_interval(nll[:, None], tokens[:, None], spec, block)[0]
    return with_intervals(curve, spec, "window", [w.num_windows for _, w, _ in sweep])
