"""What a run reports beyond its sums: per-token output, loss by position, the context-length
sweep, the divergence from a reference model, and the long-context measures of a protocol that
scores documents whole (`ppl_jax.evaluation.passes.long_context`) (`config.DiagnosticsSpec`).

Each is an extra output of the same compiled scoring step (`scoring.StepOptions`) watched on the
host by an observer of the loop (`StepObservers`): `tokens.TokenWriter` (tokens.parquet),
`divergence.Divergence`, `study.Study` (a study's copies), `long_context.Gather` (the per-token
NLLs of the long-context measures); the position sums are in `ScoreTotals`. The context-length sweep scores extra window
sets with the same model and params (`context_sweep`, after the run's pass); the long-context
measures' short-context pass (and LongPPL's evaluator) runs before the run's pass (`before`).
`check` makes every check that needs no weights (called by
`ppl_jax.evaluation.run.setup.set_up`); `write` writes the files once the run is done.

A run with any of these keeps no journal: its per-token rows and position sums are not in one, so
an interrupted run starts again from its first batch (README, "Diagnostics").
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import numpy as np

from ppl_jax.errors import ConfigError
from ppl_jax.evaluation.passes import long_context, short_context
from ppl_jax.evaluation.passes.context_sweep import context_targets
from ppl_jax.evaluation.passes.intervals import position_intervals
from ppl_jax.evaluation.passes.shared import Passes
from ppl_jax.evaluation.spec import RunSpec
from ppl_jax.metrics import curves, divergence, study
from ppl_jax.models.interface import LanguageModel
from ppl_jax.outputs import curve_figures, figures, files, study_figure
from ppl_jax.outputs.folder import OutputDir
from ppl_jax.plans import planner
from ppl_jax.plans.planner import Dataset
from ppl_jax.plans.protocols import Plan
from ppl_jax.plans.windows import NO_PREFIX
from ppl_jax.scoring.observers import ScoreObserver
from ppl_jax.scoring.step import StepOptions

POSITION_CURVE = files.POSITION_CURVE
CONTEXT_CURVE = files.CONTEXT_CURVE
TOKENS = files.TOKENS
LONG_CONTEXT = "long_context"  # results.json's key of the context gains and LongPPL
STUDY = files.STUDY  # results.json's key and study.json: the copies against the original


@dataclasses.dataclass
class StepObservers:
    """What watches the step's optional outputs on the host (process 0 writes; the others
    gather what they must): observers of the scoring loop
    (`ppl_jax.scoring.observers.ScoreObserver`).

    Attributes:
      options: the step's optional statistics.
      token_writer: the tokens.parquet writer (process 0 with output.tokens), else None.
      divergence: the divergence gatherer (with a reference model), else None.
      study: the copies' gatherer (`study.copies`), else None; plan: the run's plan (its
        units and bytes, for the study's intervals).
      gather: the run's per-token NLLs by stream index, for the long-context measures (a
        protocol that scores documents whole, with the position curve or a short context).
      short: the short-context NLLs by stream index (`before`), else None.
      keys: LongPPL's key tokens found by another evaluator (`before`): `(mask, found, name)`.
      match: with the model as its own evaluator, `long_context.matched_keys` of its plan and
        tokenizer, given its key tokens once its pass is done.
      tokens_pending: the token writer's arguments while the short pass has not run.
    """

    options: StepOptions
    token_writer: Any = None
    divergence: divergence.Divergence | None = None
    study: study.Study | None = None
    plan: Plan | None = None
    gather: long_context.Gather | None = None
    short: np.ndarray | None = None
    keys: tuple[np.ndarray, int, str] | None = None
    match: Any = None
    tokens_pending: dict[str, Any] | None = None

    @property
    def observers(self) -> list[Any]:
        """The loop's observers among them, in order."""
        found = (self.token_writer, self.divergence, self.study, self.gather)
        return [o for o in found if o is not None]

    def abort(self) -> None:
        """Removes a partial token file (an error or a signal stopped the run)."""
        if self.token_writer is not None:
            self.token_writer.abort()
            self.token_writer = None


def check(
    spec: RunSpec,
    plan: Plan,
    model: LanguageModel,
    mesh: Any = None,
    docs: Any = None,
    tok: Any = None,
) -> long_context.KeyEvaluator | None:
    """Every check of the diagnostics that needs no weights; returns LongPPL's evaluator, opened
    and planned, when one is named (`docs`: the run's documents, or None to read them again
    with the run's tokenizer `tok`).

    Raises:
      ConfigError: a package the output needs is missing, the context-length sweep does not
        fit the protocol, the corpus or the model's positions, or the long-context measures do
        not fit them (`long_context.check`).
    """
    d = spec.diagnostics
    if d.tokens:
        from ppl_jax.outputs import tokens

        tokens.check_available()
    if d.position_curve or d.context_lengths or d.long_context:
        curve_figures.check_available()
    if d.context_lengths:  # a stream protocol (`config.RunSpec` checks)
        for length in d.context_lengths:
            longest = length + context_targets(d, length, model) - 1
            if longest > model.max_positions:
                raise ConfigError(
                    f"eval.context_lengths holds {length}, which with eval.context_targets="
                    f"{d.context_targets} needs windows of {longest} tokens, beyond the model's "
                    f"{model.max_positions} positions; use shorter lengths."
                )
    return long_context.check(spec, plan, model, mesh, docs, tok)


def step_observers(spec: RunSpec, plan: Plan, tok: Any, out: OutputDir | None) -> StepObservers:
    """The run's observers of the step's optional outputs; the token file is opened on process 0
    (`out` given) only."""
    d = spec.diagnostics
    result = StepObservers(spec.step_options(), plan=plan)
    if d.tokens and out is not None:
        pending = dict(
            path=out.file(TOKENS),
            plan=plan,
            tokenizer=tok,
            dataset=spec.data.name,
            top_k=d.top_k,
            reference=d.reference is not None,
            copies=tuple(name for name, _ in d.study.copies) if d.study else (),
            both_directions=d.study is not None and d.study.both_directions,
        )
        if d.long_context is None:
            result.token_writer = _token_writer(pending)
        else:  # opened once the short pass has run (`before`): it writes the context gains
            result.tokens_pending = pending
    if d.reference is not None:
        result.divergence = divergence.Divergence(plan.describe_window)
    if d.study is not None:
        names = [name for name, _ in d.study.copies]
        describe = functools.partial(describe_token, plan, tok)
        result.study = study.Study(
            names, plan.windows.num_windows, d.study.both_directions, describe
        )
    if spec.by_document:
        result.gather = long_context.Gather(plan.windows)
    return result


def describe_token(plan: Plan, tok: Any, k: int, position: int) -> str:
    """Where the target at row position `position` of window `k` is, and its text."""
    w = plan.windows
    g = int(w.starts[k]) + position - int(w.prefix[k] != NO_PREFIX)
    text = tok.token_texts(np.asarray([w.tokens[g]]))[0] if tok is not None else ""
    return f"{plan.describe_window(k)}, row position {position}: {text!r}"


def _token_writer(arguments: dict[str, Any], **long: Any) -> Any:
    from ppl_jax.outputs import tokens

    return tokens.TokenWriter(**arguments, **long)


def before(
    setup: Any,
    params: Any,
    dataset: Dataset,
    spec: RunSpec,
    watch: StepObservers,
    stop: ScoreObserver | None = None,
    passes: Passes | None = None,
) -> bool:
    """What runs before the run's pass, for the long-context measures: the short-context pass
    (`short_context.short_pass`) and, when LongPPL's evaluator is another model, its weights,
    its two passes and its key tokens matched to the run's by characters; the token writer,
    opened here, then writes the short NLL, the context gain and the key flag of each token.
    Each pass has its progress bar and its seconds in `passes` (`short_context_seconds`,
    `longppl_evaluator_seconds`).

    Args:
      setup: the run's `ppl_jax.evaluation.run.setup.RunSetup` (model, mesh, tokenizer, documents,
        LongPPL's evaluator).
      params: the model's params, on the mesh.
      dataset: the pair's dataset (its plan and documents).
      watch: the pair's observers (`step_observers`), given the short NLLs, the key tokens (or
        how to find them) and the token writer.
      stop: the run's `StopRequest`, an observer of each pass, or None.
      passes: the pair's `Passes` (progress bars, seconds), or None.

    Returns False if `stop` ended it.
    """
    lc = spec.diagnostics.long_context
    if lc is None:
        return True
    p = setup
    passes = passes or Passes()
    pack = spec.batch.packing and p.model.honours_segments  # as `planner.batches`
    with passes.timed("short_context_seconds"):
        short = short_context.short_pass(
            p.model, params, p.mesh, p.shardings, dataset.plan.windows, spec, stop, pack,
            passes.bar("short context"),
        )  # fmt: skip
    if short is None:
        return False
    watch.short = short
    docs = p.documents.get(dataset.name)
    if docs is None:
        docs = list(planner.documents(dataset.data, p.tok))
    key_eval = p.long_context
    if key_eval is None:  # the model is its own evaluator: its key tokens once its pass is done
        watch.match = functools.partial(
            long_context.matched_keys, dataset.plan, p.tok, dataset.plan, p.tok, docs
        )
    else:
        with passes.timed("longppl_evaluator_seconds"):
            watch.keys = _evaluator_keys(p, dataset, docs, spec, stop, passes)
        if watch.keys is None:
            return False
    if watch.tokens_pending is not None:
        columns = long_context.TokenColumns(short)
        watch.token_writer = _token_writer(watch.tokens_pending, extra_columns=columns)
        watch.tokens_pending = None
    return True


def _evaluator_keys(
    p: Any,
    dataset: Dataset,
    docs: list[Any],
    spec: RunSpec,
    stop: ScoreObserver | None,
    passes: Passes,
) -> tuple[np.ndarray, int, str] | None:
    """LongPPL's key tokens found by its evaluator model (`p.long_context`: its weights, its two
    passes), matched to the run's tokens by characters: `(mask over the run's token stream, the
    evaluator's key count, its name)`, or None if `stop` ended a pass."""
    key_eval = p.long_context
    restored = key_eval.restore()
    keys_e = short_context.evaluator_keys(key_eval, restored, p.mesh, spec, stop, passes)
    del restored
    if keys_e is None:
        return None
    mask = long_context.matched_keys(
        dataset.plan, p.tok, key_eval.plan, key_eval.tokenizer, docs, keys_e
    )
    return mask, int(keys_e.sum()), key_eval.name


def collect(
    spec: RunSpec, totals: Any, watch: StepObservers, sweep: dict[str, Any] | None
) -> dict[str, Any]:
    """The run's diagnostics, JSON-ready: `position_curve`, `context_curve`, `divergence`,
    `long_context` (context gains, LongPPL) and `tokens_file` (the path of tokens.parquet), each
    present only when asked for; with LongPPL also `longppl_keys`, `[N] bool` over the plan's
    token stream, its key tokens (for a library caller; no file holds it)."""
    out: dict[str, Any] = {}
    if totals.nll_by_position is not None:
        curve = curves.position_curve(totals.nll_by_position, totals.tokens_by_position)
        out[POSITION_CURVE] = position_intervals(curve, totals, spec)
    if watch.gather is not None:
        found = long_context.measures(
            spec,
            watch.gather.windows,
            watch.gather.nll,
            watch.short,
            watch.keys,
            watch.match,
        )
        if spec.diagnostics.position_curve:  # with the gains by position bucket
            out[POSITION_CURVE] = found["position_curve"]
        if "long_context" in found:
            out[LONG_CONTEXT] = found["long_context"]
            out["longppl_keys"] = found["keys"]
    if sweep:
        out[CONTEXT_CURVE] = sweep
    if watch.divergence is not None:
        out["divergence"] = watch.divergence.summary()
    if watch.study is not None:
        out[STUDY] = watch.study.summary(watch.plan, spec.bootstrap_samples, spec.seed)
    if watch.token_writer is not None:
        out["tokens_file"] = watch.token_writer.close()
        watch.token_writer = None
    return out


def write(
    out: OutputDir, found: dict[str, Any], title: str, spec: figures.FigureSpec | None = None
) -> list[str]:
    """Writes the curves into `out`: JSON, and a figure in each of `spec.formats` (default
    PNG; `output.figures`); returns the lines to print."""
    spec = spec or figures.FigureSpec()
    lines = []
    for name, draw in (
        (POSITION_CURVE, curve_figures.position_figure),
        (CONTEXT_CURVE, curve_figures.context_figure),
    ):
        if name in found:
            path = out.write_json(f"{name}.json", found[name])
            figures.write_figures(out, name, draw(found[name], title, size=spec.size), spec)
            also = ", ".join(f".{f}" for f in spec.formats)
            lines.append(f"{name.replace('_', ' ')}: {path} (and {also})")
    if CONTEXT_CURVE in found:
        lines.insert(0, curves.context_table(found[CONTEXT_CURVE]))
    if LONG_CONTEXT in found:
        lines = long_context.summary_lines(found[LONG_CONTEXT]) + lines
    if STUDY in found:
        lines.append(f"study: {out.write_json(f'{STUDY}.json', found[STUDY])}")
        try:  # the KL figure is a bonus: drawn where matplotlib is installed
            study_figure.check_available()
        except ConfigError:
            lines.append("study figure: none (matplotlib is not installed)")
        else:
            fig = study_figure.kl_figure(found[STUDY], title, size=spec.size)
            paths = figures.write_figures(out, study_figure.NAME, fig, spec)
            lines.append(f"study figure: {', '.join(paths)}")
    if "tokens_file" in found:
        lines.append(f"tokens: {found['tokens_file']}")
    return lines
