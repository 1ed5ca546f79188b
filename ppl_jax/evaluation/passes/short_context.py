"""The long-context measures' extra passes (`ppl_jax.evaluation.passes.long_context`): every
target scored again with a short context (`eval.short_context` C, `eval.short_targets` S; the
LongPPL reference's `trunc_len` and `sliding_window`), and LongPPL's evaluator model's full and
short passes over its own plan, whose NLLs give its key tokens. Each is an ordinary scoring pass
of the run's step (`pass_scorer`), its NLLs gathered by stream index (`Gather`)."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from ppl_jax.evaluation.passes.long_context import Gather, KeyEvaluator
from ppl_jax.evaluation.passes.shared import BarFactory, Passes, pass_scorer
from ppl_jax.evaluation.spec import RunSpec
from ppl_jax.metrics import longppl
from ppl_jax.models.interface import LanguageModel
from ppl_jax.plans import windows as windows_lib
from ppl_jax.plans.layout import plan_layout
from ppl_jax.plans.windows import Windows
from ppl_jax.scoring.observers import ScoreObserver


def score_pass(
    model: LanguageModel,
    params: Any,
    mesh: Any,
    shardings: Any,
    windows: Windows,
    spec: RunSpec,
    stop: ScoreObserver | None,
    pack: bool,
    bar: BarFactory | None = None,
) -> np.ndarray | None:
    """`[N] float32` nats: the NLL of every target of `windows` by stream index (NaN
    elsewhere), scored by `model` on its own scorer; None if `stop` (the run's `StopRequest`)
    ended the pass. `bar`, given the pass's windows, makes its progress bar (closed after)."""
    if not windows.num_windows:
        return np.full(windows.tokens.size, np.nan, np.float32)
    scorer = pass_scorer(model, mesh, shardings, spec, per_token=True)
    layout = plan_layout(windows, spec.batch.batch_size, pack=pack)
    gather = Gather(windows)
    progress = None if bar is None else bar(windows.num_windows)
    observers = [o for o in (stop, gather, progress) if o is not None]
    try:
        totals = scorer.score(params, windows, layout, observers=observers)
    finally:
        if progress is not None:
            progress.close()
    return None if totals.stopped_at is not None else gather.nll


def short_pass(
    model: LanguageModel,
    params: Any,
    mesh: Any,
    shardings: Any,
    windows: Windows,
    spec: RunSpec,
    stop: ScoreObserver | None,
    pack: bool,
    bar: BarFactory | None = None,
) -> np.ndarray | None:
    """The short-context NLL of every target of `windows` at position >= C, by stream index
    (NaN elsewhere); None if stopped. `bar`: as in `score_pass`."""
    lc = spec.diagnostics.long_context
    short = windows_lib.short_windows(windows, lc.short_context, lc.short_targets)
    return score_pass(model, params, mesh, shardings, short, spec, stop, pack, bar)


def evaluator_keys(
    key_eval: KeyEvaluator,
    params: Any,
    mesh: Any,
    spec: RunSpec,
    stop: ScoreObserver | None,
    passes: Passes | None = None,
) -> np.ndarray | None:
    """`[N_e] bool`: the evaluator's key tokens over its own plan's stream (its full and short
    passes, with its params, each with its progress bar from `passes`); None if stopped."""
    w = key_eval.plan.windows
    # Rows as wide as its longest window: eval.seq_len counts the scored model's tokens, often
    # several of each of the evaluator's (bytes against BPE tokens).
    w = dataclasses.replace(w, seq_len=max(1, int(w.row_lengths().max(initial=2)) - 1))
    pack = spec.batch.packing and key_eval.model.honours_segments
    passes = passes or Passes()
    m, s = key_eval.model, key_eval.shardings
    full = score_pass(m, params, mesh, s, w, spec, stop, pack, passes.bar("LongPPL evaluator"))
    if full is None:
        return None
    bar = passes.bar("LongPPL evaluator, short context")
    short = short_pass(m, params, mesh, s, w, spec, stop, pack, bar)
    if short is None:
        return None
    lc = spec.diagnostics.long_context
    return longppl.key_tokens(full, short, lc.alpha, lc.beta)
