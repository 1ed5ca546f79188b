"""The one job path: a checkpoint's steps x a suite of datasets -> records -> sinks.

A single run is the one-step, one-dataset case of a training run; the command line, a sweep,
watch mode and `evaluate` all run `run`:

    prepare (checkpoint, tokenizer, plans, checks; no weights) -> Evaluator ->
    for each step: restore -> for each dataset: journaled score -> record -> sinks

Every dataset of every step gets the same outputs: its record (with its 95% intervals, gzip
baseline, protocol and timings under `details`) for the sinks (`results.jsonl`, the console,
TensorBoard: `ppl_jax.outputs.sinks`), its `units.npz`, and `results.json` for the run. A
training run (a suite, several steps, watch, TensorBoard) skips a (step, dataset) pair stored with
the same fingerprint; each pair keeps its own journal while it is scored, so an interrupted run
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

from ppl_jax.errors import Interrupted
from ppl_jax.evaluation import diagnostics, summary
from ppl_jax.evaluation.evaluator import Evaluator
from ppl_jax.evaluation.outcome import Evaluation, per_document, run_fingerprint
from ppl_jax.evaluation.prepare import Prepared, prepare
from ppl_jax.evaluation.spec import RunSpec
from ppl_jax.evaluation.steps import agree, steps_to_score
from ppl_jax.metrics import sums as metrics
from ppl_jax.metrics import uncertainty
from ppl_jax.outputs import files, journal, sinks, store, tensorboard
from ppl_jax.outputs.folder import OutputDir
from ppl_jax.outputs.model_record import model_record
from ppl_jax.plans import protocols, suite
from ppl_jax.plans.suite import Dataset
from ppl_jax.runtime import fingerprint as fingerprint_lib
from ppl_jax.runtime import preemption


@dataclasses.dataclass
class RunResult:
    """What `run` returns: `results` (the results.json dict, process 0; else None),
    `evaluations` (every (step, dataset) scored in this process, in order) and `files` (lines
    naming the files written beside the records: documents, curves, tokens)."""

    results: dict[str, Any] | None
    evaluations: list[Evaluation]
    files: list[str] = dataclasses.field(default_factory=list)


def run(
    spec: RunSpec,
    out: OutputDir | None = None,
    progress_factory: Callable[[int], Any] | None = None,
    printer: Callable[[str], None] = print,
    config: dict[str, Any] | None = None,
) -> RunResult:
    """Runs the job (see the module docstring).

    Args:
      spec: the checked run.
      out: the locked output folder (process 0), or None (the other processes, and library
        calls that keep no files).
      progress_factory: given the number of windows, returns a `(tokens, windows)` callback.
      printer: where a training run's per-record lines go.
      config: the command line's config as JSON (recorded in results.json), or None.

    Raises:
      PplJaxError subclasses for every user mistake (see `ppl_jax.errors`); `Interrupted` when
      a signal stopped the run (the pair being scored keeps its journal; the same command
      resumes it).
    """
    t0 = time.perf_counter()
    p = prepare(spec, out)
    ref = p.reference
    evaluator = Evaluator(
        p.model,
        p.mesh,
        p.datasets,
        param_shardings=p.shardings,
        options=diagnostics.step_options(spec),
        reference=None if ref is None else (ref[2], ref[4]),
        compile=False,
    )
    results = store.ResultsStore.in_dir(out.path) if out is not None else None
    record_sinks: list[sinks.Sink] = []  # each dataset record and each step's averages
    step_sinks: list[sinks.Sink] = []  # a step's records, once its averages are in
    if results is not None:
        record_sinks.append(sinks.StoreSink(results))
        if spec.is_training_run:
            record_sinks.append(sinks.ConsoleSink(printer))
        if spec.tensorboard:
            step_sinks.append(tensorboard.TensorBoardSink(files.tensorboard_dir(out.path)))
    names = [d.name for d in p.datasets]
    evaluations: list[Evaluation] = []
    written: list[str] = []
    gzip: dict[str, tuple[float | None, int | None]] = {}
    last = None
    params = ref_params = None
    try:
        for step in steps_to_score(spec, p.ckpt, p.first_step):
            parts = {
                d.name: run_fingerprint(
                    spec, p.model, p.tok, d.plan, d.layout, p.mesh, p.ckpt, step,
                    p.attention, (d.data, d.protocol), spec.batch,
                )
                for d in p.datasets
            }  # fmt: skip
            digests = {n: fingerprint_lib.digest(x) for n, x in parts.items()}
            todo = [1] * len(p.datasets)
            if spec.is_training_run:  # a pair stored with the same fingerprint is skipped
                todo = agree(
                    [int(not results.done(step, n, digests[n])) for n in names]
                    if results is not None
                    else [0] * len(names)
                )
            if any(todo):
                if step != p.first_step:
                    p.ckpt.check_same_architecture(step, p.model)
                params = p.ckpt.restore(step, p.target)
                if ref is not None and ref_params is None:
                    ref_params = ref[0].restore(ref[1], ref[3])
            for d, needed in zip(p.datasets, todo, strict=True):
                if not needed:
                    continue
                ev = _score(
                    spec, p, evaluator, d, step, params, ref_params, parts[d.name], out,
                    progress_factory, gzip, t0,
                )  # fmt: skip
                evaluations.append(ev)
                if out is None:
                    continue
                written += _write_pair_files(out, ev, len(p.datasets) == 1, spec)
                record = store.dataset_record(
                    step=step,
                    dataset=d.name,
                    sums=ev.sums,
                    fingerprint=digests[d.name],
                    tags=d.tags,
                    checkpoint=p.ckpt.path,
                    wall_seconds=ev.totals.scoring_seconds,
                    details=summary.dataset_dict(ev, spec),
                )
                for sink in record_sinks:
                    sink.write([record])
                ev.recorder.discard()  # once the record is stored
            if results is None:
                continue
            stored = results.dataset_records(step, names)
            averages = store.average_records(stored) if len(stored) > 1 else []
            if any(todo) or not _has_averages(results, step):  # else stored by a past run
                for sink in record_sinks:
                    sink.write(averages)
                for sink in step_sinks:
                    sink.write(stored + averages)
            last = (step, stored, averages)
    finally:
        for sink in record_sinks + step_sinks:
            sink.close()
    if out is None or last is None:
        return RunResult(None, evaluations, written)
    step, stored, averages = last
    wall = time.perf_counter() - t0
    found = summary.results_json(spec, p.ckpt, step, stored, averages, results.path, wall, config)
    if not evaluations and spec.is_training_run:
        printer(
            f"nothing to score: every (step, dataset) pair is in {results.path} with the same "
            f"fingerprint (what decides its numbers); results.json summarises step {step}."
        )
    return RunResult(found, evaluations, written)


def _has_averages(results: store.ResultsStore, step: int | None) -> bool:
    return any(r["kind"] == "average" and r["step"] == step for r in results.records())


def _score(
    spec: RunSpec,
    p: Prepared,
    evaluator: Evaluator,
    d: Dataset,
    step: int | None,
    params: Any,
    ref_params: Any,
    parts: dict[str, Any],
    out: OutputDir | None,
    progress_factory: Callable[[int], Any] | None,
    gzip: dict[str, tuple[float | None, int | None]],
    t0: float,
) -> Evaluation:
    """Scores one (step, dataset) pair under its own journal, with the run's diagnostics."""
    name = files.journal_name(step, d.name) if spec.is_training_run else files.JOURNAL
    # A run with diagnostics keeps no journal: its per-token rows and curves are not in one.
    journal_out = None if spec.diagnostics.any_beyond_sums else out
    w, b = d.plan.windows.num_windows, d.layout.num_batches
    state = journal.load_everywhere(journal_out if spec.resume else None, parts, w, b, name)
    recorder = journal.Recorder(
        journal_out, parts, state or journal.State.empty(w, b), spec.journal_every, name
    )
    sinks = diagnostics.sinks(spec, d.plan, p.tok, out)
    progress = progress_factory(w) if progress_factory else None
    if progress is not None and recorder.resumed_batches:  # the bar starts where it stopped
        done = np.flatnonzero(recorder.state.batch_done)
        progress(0, sum(len(row) for i in done for row in d.layout.batch_rows(int(i))))
    params_in = params if ref_params is None else (params, ref_params)
    try:
        with preemption.StopRequest() as stop:
            sums, totals = evaluator.score(params_in, d, recorder, stop, progress, sinks.on_tokens)
            sweep = None
            if totals.stopped_at is None and spec.diagnostics.context_lengths:
                sweep = diagnostics.context_sweep(
                    p.model, params, p.mesh, p.shardings, d.plan, spec, stop.requested,
                    progress_factory,
                )  # fmt: skip
                if sweep is None:
                    totals.stopped_at = b
        if totals.stopped_at is not None:
            raise _interrupted(recorder, stop, step, d.name, b, journal_out is None, spec)
        found = diagnostics.collect(spec, totals, sinks, sweep)
    except BaseException:
        sinks.abort()
        raise
    if d.name not in gzip:
        gzip[d.name] = (None, None)
        if spec.gzip_baseline and out is not None:  # process 0 only, on a bounded sample
            docs = p.documents.get(d.name) or suite.documents(d.data, p.tok)
            joined = d.data.separator if d.protocol.protocol == "sliding" else protocols.JOIN
            gzip[d.name] = metrics.gzip_bits_per_byte_of((x.text for x in docs), joined)
    return Evaluation(
        sums=sums,
        metrics=metrics.derive(sums),
        totals=totals,
        plan=d.plan,
        step=step,
        documents=per_document(d.plan, totals) if spec.per_document else None,
        mesh_shape=dict(p.mesh.shape),
        model_description=model_record(p.model, dict(spec.checkpoint_options).get("architecture")),
        tokenizer_name=p.tok.name,
        checkpoint_format=p.ckpt.format,
        layout=d.layout,
        attention=p.attention,
        gzip_bits_per_byte=gzip[d.name][0],
        gzip_sample_bytes=gzip[d.name][1],
        wall_seconds=time.perf_counter() - t0,
        dataset=d.data,
        protocol_spec=d.protocol,
        fingerprint=parts,
        tokenizer_note=p.tokenizer_note,
        tokenizer_is_checkpoints=d.data.tokenizer == "auto",
        resumed_batches=recorder.resumed_batches,
        recorder=recorder,
        diagnostics=found,
    )


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
    no_journal: bool,
    spec: RunSpec,
) -> Interrupted:
    code = preemption.EXIT_CODE.get(stop.signal, 1)
    if no_journal:
        return Interrupted(
            f"stopped by {signal_name(stop.signal)}; a run with diagnostics (output.tokens, "
            f"output.position_curve, eval.context_lengths, reference.*) keeps no journal, so the "
            f"same command starts it again from the first batch.",
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
    progress_factory: Callable[[int], Any] | None = None,
    out: OutputDir | None = None,
) -> Evaluation:
    """The one job for one step and one dataset, returning its `Evaluation` (library and tests;
    with `out`, the run's files are written there as the command line writes them).

    Raises:
      As `run`.
    """
    found = run(spec, out, progress_factory, printer=lambda line: None)
    return found.evaluations[-1]
