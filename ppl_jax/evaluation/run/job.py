"""The one job path: a checkpoint's steps x a suite of datasets -> records -> sinks.

A single run is the one-step, one-dataset case of a training run; the command line, a sweep,
watch mode and `evaluate` all run `run`:

    set_up (checkpoint, tokenizer, plans, checks, the Evaluator; no weights) ->
    for each step: the evaluator's call, the one evaluation loop, with the run's hooks
        (`ppl_jax.evaluation.run.hooks`): each pair's journal (refused if another run's) ->
        restore -> for each dataset: score (observers: journal, stop request, progress,
        diagnostics) -> record -> sinks -> the step's averages

A training loop calls the same evaluator with its params (`ppl_jax.evaluation.hooks`' defaults),
so both write the same records, fingerprint included.

Every dataset of every step gets the same outputs: its record (with its 95% intervals, gzip
baseline, protocol and timings under `details`) for the sinks the run opens
(`ppl_jax.outputs.sinks`: `results.jsonl`, the console, TensorBoard, ... and `results.json`,
written last once the run finished), and its `units.npz`. A training run (a suite, or several
steps: a sweep, watch; the sinks do not make one) skips a (step, dataset) pair stored with the
same fingerprint; each pair keeps its own journal while it is scored, so an interrupted run
resumes the pair it was scoring (a run of one step and one dataset keeps `journal.npz`). On
several processes, process 0 decides which steps and pairs to score and broadcasts the decision;
the others write nothing.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any

from ppl_jax.evaluation.result import Evaluation
from ppl_jax.evaluation.run.hooks import RunHooks
from ppl_jax.evaluation.run.setup import RunSetup, set_up
from ppl_jax.evaluation.run.steps import steps_to_score
from ppl_jax.evaluation.spec import RunSpec
from ppl_jax.outputs import sinks, store
from ppl_jax.outputs.folder import OutputDir
from ppl_jax.outputs.results_json import ResultsJsonSink
from ppl_jax.runtime import preemption


@dataclasses.dataclass
class RunResult:
    """What `run` returns: `results` (the results.json dict written, process 0; else None),
    `evaluations` (every (step, dataset) scored in this process, in order), `files` (lines
    naming the files written beside the records: documents, curves, tokens) and `results_path`
    (where results.json was written, or None)."""

    results: dict[str, Any] | None
    evaluations: list[Evaluation]
    files: list[str] = dataclasses.field(default_factory=list)
    results_path: str | None = None


def run(
    spec: RunSpec,
    out: OutputDir | None = None,
    progress_factory: Callable[[int, int], Any] | None = None,
    printer: Callable[[str], None] = print,
    config: dict[str, Any] | None = None,
) -> RunResult:
    """Runs the job (see the module docstring).

    Args:
      spec: the checked run.
      out: the locked output folder (process 0), or None (the other processes, and library
        calls that keep no files).
      progress_factory: given the number of windows and those a journal holds already (and,
        for a run of several scoring passes, `desc=` the pass's name: `scoring`, `short
        context`, `LongPPL evaluator`, `context sweep`; `ppl_jax.evaluation.passes`), returns
        an observer of the scoring loop (`ppl_jax.outputs.console.ProgressBar`), or None.
      printer: where a training run's per-record lines go.
      config: the command line's config as JSON (recorded in results.json), or None.

    Raises:
      PplJaxError subclasses for every user mistake (see `ppl_jax.errors`); `Interrupted` when
      a signal stopped the run (the pair being scored keeps its journal; the same command
      resumes it).
    """
    started = time.perf_counter()
    # One set of signal handlers for the whole run, before its setup: a signal between its
    # phases (setup, a step's restore, the next pair) stops it there, in one sentence.
    with preemption.StopRequest() as stop:
        return _run(spec, out, progress_factory, printer, config, started, stop)


def _run(
    spec: RunSpec,
    out: OutputDir | None,
    progress_factory: Callable[[int, int], Any] | None,
    printer: Callable[[str], None],
    config: dict[str, Any] | None,
    started: float,
    stop: preemption.StopRequest,
) -> RunResult:
    p = set_up(spec, out)
    results = store.ResultsStore.in_dir(out.path) if out is not None else None
    hooks = RunHooks(
        spec=spec,
        setup=p,
        out=out,
        results=results,
        progress_factory=progress_factory,
        started=started,
        stop=stop,
        setup_seconds=time.perf_counter() - started,
        kept=KEPT[spec.is_training_run],
    )
    opened = _open_sinks(spec, p, out, results, printer, config, started)
    finished = False
    try:
        stop.check("before scoring began", hooks.kept)
        waiting = lambda: stop.check("while watching", hooks.kept)  # noqa: E731
        for step in steps_to_score(spec, p.ckpt, p.first_step, waiting):
            where = f"before step {step}" if spec.is_training_run else "before scoring began"
            stop.check(where, hooks.kept)
            p.evaluator(None, step, opened, hooks=hooks)
        finished = True
    finally:
        sinks.close_all(opened, finished)
    summary_sink = opened[-1] if opened else None
    if not isinstance(summary_sink, ResultsJsonSink) or summary_sink.results is None:
        return RunResult(None, hooks.evaluations, hooks.written)
    if not hooks.evaluations and spec.is_training_run:
        printer(
            f"nothing to score: every (step, dataset) pair is in {results.path} with the same "
            f"fingerprint (what decides its numbers); results.json summarises step "
            f"{summary_sink.results['step']}."
        )
    return RunResult(summary_sink.results, hooks.evaluations, hooks.written, summary_sink.path)


# What a stop between phases keeps, and how to go on: a training run's, a single run's.
KEPT = {
    True: "every finished (step, dataset) is in results.jsonl; run the same command again to "
    "resume.",
    False: "nothing more was scored; run the same command again (it goes on from the journal "
    "of an earlier stop, if any).",
}


def _open_sinks(
    spec: RunSpec,
    p: RunSetup,
    out: OutputDir | None,
    results: store.ResultsStore | None,
    printer: Callable[[str], None],
    config: dict[str, Any] | None,
    started: float,
) -> list[sinks.Sink]:
    """The run's sinks on process 0 (`out` given; the console's for a training run), results.json
    last; none elsewhere."""
    if out is None or results is None:
        return []
    checkpoint = {"path": p.ckpt.path, "format": p.ckpt.format}
    info = sinks.RunInfo(out, results, printer, checkpoint, config, started)
    return sinks.open_sinks(spec.sinks + (("console",) if spec.is_training_run else ()), info)


def evaluate(
    spec: RunSpec,
    progress_factory: Callable[[int, int], Any] | None = None,
    out: OutputDir | None = None,
) -> Evaluation:
    """The one job for one step and one dataset, returning its `Evaluation` (library and tests;
    with `out`, the run's files are written there as the command line writes them, results.json
    included).

    Raises:
      As `run`.
    """
    found = run(spec, out, progress_factory, printer=lambda line: None)
    return found.evaluations[-1]
