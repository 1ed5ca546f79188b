"""The one job path: a checkpoint's steps x a suite of datasets -> records -> sinks.

A single run is the one-step, one-dataset case of a training run; the command line, a sweep,
watch mode and `evaluate` all run `run`:

    set_up (checkpoint, tokenizer, plans, checks; no weights) -> Evaluator ->
    for each step: each pair's journal (refused if another run's) -> restore ->
        for each dataset: score (observers: journal, stop request, progress, diagnostics)
        -> record -> sinks

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
import signal
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from ppl_jax.checkpoints import architecture
from ppl_jax.errors import Interrupted
from ppl_jax.evaluation import diagnostics, summary
from ppl_jax.evaluation.evaluator import Evaluator
from ppl_jax.evaluation.passes import Passes
from ppl_jax.evaluation.result import Evaluation, per_document
from ppl_jax.evaluation.setup import RunSetup, set_up
from ppl_jax.evaluation.spec import RunSpec
from ppl_jax.evaluation.steps import agree, steps_to_score
from ppl_jax.metrics import sums as metrics
from ppl_jax.metrics import uncertainty
from ppl_jax.outputs import files, journal, sinks, store
from ppl_jax.outputs.folder import OutputDir
from ppl_jax.outputs.model_record import model_record
from ppl_jax.outputs.results_json import ResultsJsonSink
from ppl_jax.plans import planner
from ppl_jax.plans.planner import Dataset
from ppl_jax.runtime import fingerprint as fingerprint_lib
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
    setup_seconds = time.perf_counter() - started
    evaluator = Evaluator(
        p.model,
        p.mesh,
        p.datasets,
        param_shardings=p.shardings,
        options=diagnostics.step_options(spec),
        reference=None if p.reference is None else (p.reference.model, p.reference.shardings),
        compile=False,
    )
    job = _Job(spec, p, evaluator, out, progress_factory, started, stop, setup_seconds)
    results = store.ResultsStore.in_dir(out.path) if out is not None else None
    opened: list[sinks.Sink] = []
    if out is not None and results is not None:
        info = sinks.RunInfo(
            out, results, printer, {"path": p.ckpt.path, "format": p.ckpt.format}, config, started
        )
        opened = sinks.open_sinks(spec.sinks + (("console",) if spec.is_training_run else ()), info)
    names = [d.name for d in p.datasets]
    finished = False
    kept = (
        "every finished (step, dataset) is in results.jsonl; run the same command again to resume."
        if spec.is_training_run
        else "nothing more was scored; run the same command again (it goes on from the journal "
        "of an earlier stop, if any)."
    )
    try:
        stop.check("before scoring began", kept)
        for step in steps_to_score(
            spec, p.ckpt, p.first_step, lambda: stop.check("while watching", kept)
        ):
            before, restored = (
                (f"before step {step}", f"after restoring step {step}, before scoring it")
                if spec.is_training_run
                else ("before scoring began", "after reading the weights, before scoring them")
            )
            stop.check(before, kept)
            parts = {d.name: p.fingerprint(d, step) for d in p.datasets}
            todo = [1] * len(p.datasets)
            if spec.is_training_run:  # a pair stored with the same fingerprint is skipped
                todo = agree(
                    [
                        int(not results.done(step, n, fingerprint_lib.digest(parts[n])))
                        for n in names
                    ]
                    if results is not None
                    else [0] * len(names)
                )
            # Each pair's journal before any weight is read: one of another run is refused now.
            recorders = {
                d.name: job.recorder(d, step, parts[d.name])
                for d, needed in zip(p.datasets, todo, strict=True)
                if needed
            }
            if any(todo):
                job.restore(step)
                stop.check(restored, kept)
            for d in p.datasets:
                if d.name in recorders:
                    job.score(d, step, recorders[d.name], opened)
            if results is None:
                continue
            stored = results.dataset_records(step, names)
            averages = store.average_records(stored) if len(stored) > 1 else []
            if any(todo) or not _has_averages(results, step):  # else stored by a past run
                for sink in opened:
                    sink.write(averages)
            for sink in opened:
                sink.end_step(step, stored + averages)
        finished = True
    finally:
        sinks.close_all(opened, finished)
    summary_sink = opened[-1] if opened else None
    if not isinstance(summary_sink, ResultsJsonSink) or summary_sink.results is None:
        return RunResult(None, job.evaluations, job.written)
    if not job.evaluations and spec.is_training_run:
        printer(
            f"nothing to score: every (step, dataset) pair is in {results.path} with the same "
            f"fingerprint (what decides its numbers); results.json summarises step "
            f"{summary_sink.results['step']}."
        )
    return RunResult(summary_sink.results, job.evaluations, job.written, summary_sink.path)


def _has_averages(results: store.ResultsStore, step: int | None) -> bool:
    return any(r["kind"] == "average" and r["step"] == step for r in results.records())


@dataclasses.dataclass
class _Job:
    """One run's scoring: what `set_up` built, the evaluator, the params of the step being
    scored, and what every (step, dataset) pair adds to (its evaluations, the files written)."""

    spec: RunSpec
    setup: RunSetup
    evaluator: Evaluator
    out: OutputDir | None
    progress_factory: Callable[..., Any] | None
    started: float
    stop: preemption.StopRequest
    setup_seconds: float = 0.0
    params: Any = None
    reference_params: Any = None
    restore_seconds: dict[str, float | None] = dataclasses.field(default_factory=dict)
    evaluations: list[Evaluation] = dataclasses.field(default_factory=list)
    written: list[str] = dataclasses.field(default_factory=list)
    _gzip: dict[str, tuple[float | None, int | None]] = dataclasses.field(default_factory=dict)

    def recorder(self, d: Dataset, step: int | None, parts: dict[str, Any]) -> journal.Recorder:
        """The pair's journal: the one in the output folder if it is this pair's (resumed from),
        else an empty one (`output.resume=false`: always).

        Raises:
          ConfigError: the folder's journal is another run's (its message names what changed).
        """
        spec = self.spec
        name = files.journal_name(step, d.name) if spec.is_training_run else files.JOURNAL
        # A run with diagnostics keeps no journal: its per-token rows and curves are not in one.
        journal_out = None if spec.diagnostics.any_beyond_sums else self.out
        w, b = d.plan.windows.num_windows, d.layout.num_batches
        state = journal.load_everywhere(journal_out if spec.resume else None, parts, w, b, name)
        return journal.Recorder(
            journal_out, parts, state or journal.State.empty(w, b), spec.journal_every, name
        )

    def restore(self, step: int | None) -> None:
        """The step's params (and, once, the reference's) onto the mesh."""
        p = self.setup
        t0 = time.perf_counter()
        if step != p.first_step:
            architecture.check_same(p.ckpt, step, p.model)
        self.params = p.ckpt.restore(step, p.target)
        t1 = time.perf_counter()
        self.restore_seconds = {"restore_seconds": t1 - t0, "reference_restore_seconds": None}
        if p.reference is not None and self.reference_params is None:
            self.reference_params = p.reference.restore()
            self.restore_seconds["reference_restore_seconds"] = time.perf_counter() - t1

    def score(
        self, d: Dataset, step: int | None, recorder: journal.Recorder, opened: list[sinks.Sink]
    ) -> None:
        """Scores one (step, dataset) pair under its journal, with the run's diagnostics; its
        files and its record (to every sink) are written on process 0."""
        ev = self._evaluation(d, step, recorder)
        self.evaluations.append(ev)
        if self.out is None:
            return
        self.written += _write_pair_files(self.out, ev, len(self.setup.datasets) == 1, self.spec)
        record = summary.dataset_record(ev, self.spec)
        for sink in opened:
            sink.write([record])
        ev.recorder.discard()  # once the record is stored

    def _evaluation(self, d: Dataset, step: int | None, recorder: journal.Recorder) -> Evaluation:
        spec, p, out = self.spec, self.setup, self.out
        w, b = d.plan.windows.num_windows, d.layout.num_batches
        watch = diagnostics.step_observers(spec, d.plan, p.tok, out)
        passes = Passes(self.progress_factory)
        passes.seconds.update(setup_seconds=self.setup_seconds, **self.restore_seconds)
        progress = None
        params = self.params
        params_in = params if self.reference_params is None else (params, self.reference_params)
        stop = self.stop
        try:
            if not diagnostics.before(p, params, d, spec, watch, stop, passes):
                raise _interrupted(recorder, stop, step, d.name, b, spec)
            if self.progress_factory is not None:  # starts where the journal stopped
                done = np.flatnonzero(recorder.state.batch_done)
                windows_done = sum(len(r) for i in done for r in d.layout.batch_rows(int(i)))
                others = spec.diagnostics.long_context or spec.diagnostics.context_lengths
                named = {"desc": "scoring"} if others else {}
                progress = self.progress_factory(w, windows_done, **named)
            observers = [stop, *watch.observers, recorder, *([progress] if progress else [])]
            sums, totals = self.evaluator.score(params_in, d, observers, recorder.state)
            if progress is not None:
                progress.close()
                progress = None
            sweep = None
            if totals.stopped_at is None and spec.diagnostics.context_lengths:
                with passes.timed("context_sweep_seconds"):
                    sweep = diagnostics.context_sweep(
                        p.model, params, p.mesh, p.shardings, d.plan, spec, stop,
                        passes.bar("context sweep"),
                    )  # fmt: skip
                if sweep is None:
                    totals.stopped_at = b
            if totals.stopped_at is not None:
                raise _interrupted(recorder, stop, step, d.name, b, spec)
            found = diagnostics.collect(spec, totals, watch, sweep)
        except BaseException:
            watch.abort()
            raise
        finally:
            if progress is not None:
                progress.close()
        gzip_bpb, gzip_bytes = self._gzip_baseline(d, passes)
        passes.seconds.update(
            compile_seconds=totals.compile_seconds, scoring_seconds=totals.scoring_seconds
        )
        return Evaluation(
            sums=sums,
            metrics=metrics.derive(sums),
            totals=totals,
            plan=d.plan,
            step=step,
            documents=per_document(d.plan, totals) if spec.per_document else None,
            # `context` only where it splits windows: other runs' records as before.
            mesh_shape={k: v for k, v in p.mesh.shape.items() if k != "context" or v > 1},
            model_description=model_record(
                p.model, dict(spec.checkpoint_options).get("architecture")
            ),
            tokenizer_name=p.tok.name,
            checkpoint_format=p.ckpt.format,
            layout=d.layout,
            attention=p.attention,
            gzip_bits_per_byte=gzip_bpb,
            gzip_sample_bytes=gzip_bytes,
            wall_seconds=time.perf_counter() - self.started,
            dataset=d.data,
            protocol_spec=d.protocol,
            fingerprint=recorder.parts,
            tokenizer_note=p.tokenizer_note,
            tokenizer_is_checkpoints=d.data.tokenizer == "auto",
            resumed_batches=recorder.resumed_batches,
            recorder=recorder,
            diagnostics=found,
            timing=passes.seconds,
        )

    def _gzip_baseline(self, d: Dataset, passes: Passes) -> tuple[float | None, int | None]:
        """gzip -9's bits per byte on the dataset's text and the bytes it compressed (process 0
        only, on a bounded sample; once per dataset: its seconds in `passes`), or (None, None)."""
        if d.name not in self._gzip:
            self._gzip[d.name] = (None, None)
            if self.spec.gzip_baseline and self.out is not None:
                p = self.setup
                with passes.timed("gzip_seconds"):
                    docs = p.documents.get(d.name) or planner.documents(d.data, p.tok)
                    joined = d.protocol.rules.joiner(d.data)
                    texts = (x.text for x in docs)
                    self._gzip[d.name] = metrics.gzip_bits_per_byte_of(texts, joined)
        return self._gzip[d.name]


def _write_pair_files(out: OutputDir, ev: Evaluation, only: bool, spec: RunSpec) -> list[str]:
    """A pair's files beside its record: units.npz (for `ppl-jax compare`), documents.jsonl,
    the diagnostics' curves and token file; returns the lines that name them."""
    name = files.units_name(None if only else ev.dataset.name, ev.step, spec.steps.is_sweep)
    out.write_bytes(name, uncertainty.units_npz(ev))
    lines = []
    if ev.documents is not None:
        lines.append(f"documents: {out.write_jsonl(files.DOCUMENTS, ev.documents)}")
    return lines + diagnostics.write(out, ev.diagnostics, ev.dataset.name, spec.diagnostics.figures)


def _interrupted(
    recorder: journal.Recorder,
    stop: preemption.StopRequest,
    step: int | None,
    dataset: str,
    num_batches: int,
    spec: RunSpec,
) -> Interrupted:
    code = preemption.EXIT_CODE.get(stop.signal, 1)
    if spec.diagnostics.any_beyond_sums:  # no journal
        return Interrupted(
            f"stopped by {signal_name(stop.signal)}; a run with diagnostics (output.tokens, "
            f"output.position_curve, eval.context_lengths, eval.short_context, reference.*) keeps "
            f"no journal, so the same command starts it again from the first batch.",
            code,
        )
    path = recorder.save()
    where = path or "process 0 output.dir"
    if spec.is_training_run:
        return Interrupted(
            f"stopped by {signal_name(stop.signal)} at step {step}, dataset {dataset!r}; its "
            f"journal is saved in {where} and every finished (step, dataset) is in "
            f"results.jsonl. Run the same command again to resume.",
            code,
        )
    done = int(recorder.state.batch_done.sum())
    return Interrupted(
        f"stopped by {signal_name(stop.signal)} with {done} of {num_batches} batches scored; "
        f"the journal is saved in {where}. Run the same command again to resume.",
        code,
    )


def signal_name(sig: int | None) -> str:
    return signal.Signals(sig).name if sig is not None else "a signal"


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
