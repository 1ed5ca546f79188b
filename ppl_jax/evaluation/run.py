"""The one job path: a checkpoint's steps x a suite of datasets -> records -> sinks.

A single run is the one-step, one-dataset case of a training run; the command line, a sweep,
watch mode and `evaluate` all run `run`:

    open checkpoint -> tokenizer -> plan datasets (+ cross-process check) -> Evaluator ->
    for each step: restore -> for each dataset: journaled score -> record -> sinks

Every check that needs no weights (settings, mesh, batch size, data, architecture, tokenizer,
token ids, diagnostics, the reference model, the journal) comes before the weights are read.
Every dataset of every step gets the same outputs: its record in `results.jsonl` (with its 95%
intervals, gzip baseline, protocol and timings), its `units.npz`, and `results.json` for the run.
A training run (a suite, several steps, watch, TensorBoard) skips a (step, dataset) pair stored
with the same fingerprint; each pair keeps its own journal while it is scored, so an
interrupted run resumes the pair it was scoring. On several processes, process 0 decides which
steps and pairs to score and broadcasts the decision; the others write nothing.
"""

from __future__ import annotations

import dataclasses
import signal
import time
from collections.abc import Callable, Iterator
from typing import Any

import jax
import numpy as np

from ppl_jax.checkpoints import Checkpoint, open_checkpoint
from ppl_jax.data import documents as data
from ppl_jax.errors import ConfigError, Interrupted
from ppl_jax.evaluation import diagnostics, summary
from ppl_jax.evaluation.evaluator import Evaluator, check_batch_size, check_window
from ppl_jax.evaluation.outcome import Evaluation, per_document, run_fingerprint
from ppl_jax.evaluation.spec import RunSpec
from ppl_jax.metrics import sums as metrics
from ppl_jax.metrics import uncertainty
from ppl_jax.models.interface import LanguageModel
from ppl_jax.outputs import files, journal, store
from ppl_jax.outputs.folder import OutputDir
from ppl_jax.plans import protocols, suite
from ppl_jax.plans.suite import Dataset
from ppl_jax.runtime import distributed, preemption
from ppl_jax.runtime import fingerprint as fingerprint_lib
from ppl_jax.runtime import mesh as mesh_lib
from ppl_jax.tokenizer import base as tokenizer

MAX_STEPS = 4096  # steps one broadcast carries


@dataclasses.dataclass
class Prepared:
    """What a run builds before any weight is read (`prepare`)."""

    mesh: Any
    ckpt: Checkpoint
    first_step: int | None
    model: LanguageModel
    attention: str
    tok: tokenizer.Tokenizer
    tokenizer_note: str | None
    datasets: list[Dataset]
    documents: dict[str, Any]  # dataset name -> documents read while planning (gzip baseline)
    target: Any
    shardings: Any
    reference: tuple[Checkpoint, int | None, LanguageModel, Any, Any] | None


def check(spec: RunSpec, ckpt_format: str) -> None:
    """Refuses what a training run does not do (before anything is read).

    Raises:
      ConfigError: diagnostics, per-document output or a reference model with a sweep or a
        suite; several steps of a Hugging Face directory; per-document output of a protocol
        whose windows span documents.
    """
    d = spec.diagnostics
    if spec.is_training_run and (
        d.tokens or d.position_curve or d.context_lengths or d.reference or spec.per_document
    ):
        raise ConfigError(
            "output.tokens, output.position_curve, eval.context_lengths, reference.* and "
            "output.per_document score one checkpoint step on one dataset; run them without "
            "suite, a step sweep, checkpoint.watch or output.tensorboard."
        )
    if spec.steps.is_sweep and ckpt_format == "hf":
        raise ConfigError(
            f"checkpoint.step={spec.steps.kind} needs an Orbax directory of steps; "
            f"{spec.checkpoint_dir!r} is a Hugging Face directory (one set of weights)."
        )
    if spec.per_document and spec.eval.protocol != "lm_eval_rolling":
        raise ConfigError(
            f"output.per_document=true needs a document-level protocol (lm_eval_rolling); the "
            f"windows of {spec.eval.protocol} span documents."
        )


def prepare(spec: RunSpec, out: OutputDir | None) -> Prepared:
    """Every step of a run that needs no weights, in the order that reports a user's mistake
    soonest: settings, mesh, the corpora's files, the architecture, the tokenizer, the plans,
    the diagnostics, the reference model, the processes' agreement on the plans."""
    if spec.compilation_cache_dir:
        jax.config.update("jax_compilation_cache_dir", spec.compilation_cache_dir)
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    ckpt = open_checkpoint(spec.checkpoint_dir, spec.checkpoint_format)
    check(spec, ckpt.format)
    if spec.tensorboard and out is not None:
        from ppl_jax.outputs import tensorboard

        tensorboard.check_available(files.tensorboard_dir(out.path))
    mesh = mesh_lib.make_mesh(spec.mesh.data, spec.mesh.model)
    check_batch_size(spec.batch.batch_size, mesh)
    # The corpora before the checkpoint (with a cache, only their file list: a hit reads none).
    raw = []
    for ds, _ in spec.datasets:
        raw.append(None if ds.cache_dir else suite.read(ds))
        if ds.cache_dir:
            data.resolve_paths(ds.path)
    first_step = ckpt.resolve_step(spec.checkpoint_step)
    attention = ckpt.attention(spec.attention, spec.dtype, first_step)
    model = ckpt.model(spec.dtype, attention, first_step)
    check_window(spec.eval.seq_len, model)
    own = ckpt.tokenizer(first_step) if ckpt.format == "hf" else None
    if spec.data.tokenizer == "auto" and ckpt.format == "hf" and own is None:
        raise ConfigError(
            f"data.tokenizer=auto, but {spec.checkpoint_dir!r} holds no tokenizer "
            f"(tokenizer.json or tokenizer.model); set --config.data.tokenizer to one."
        )
    if own is not None and spec.data.tokenizer == "auto":
        tok = own
    else:
        tok = tokenizer.load(spec.data.tokenizer, ckpt.tokenizer_description(first_step))
    note = tokenizer.check_vocabulary(
        tok, model.vocab_size, allow_mismatch=spec.data.allow_tokenizer_mismatch
    )
    datasets, documents = [], {}
    for (ds, ev), read_first in zip(spec.datasets, raw, strict=True):
        check_window(
            ev.seq_len, model, f"dataset {ds.name!r}: seq_len" if spec.suite else "eval.seq_len"
        )
        plan, docs, _ = suite.planned(ds, ev, tok, model.vocab_size, read_first)
        datasets.append(Dataset(ds, ev, plan, suite.batches(plan, spec.batch, attention)))
        documents[ds.name] = docs
    if not spec.is_training_run:
        diagnostics.check(spec, datasets[0].plan, model)
    reference = None
    if spec.diagnostics.reference is not None:
        reference = _reference(spec, model, mesh)
    for d in datasets:
        distributed.check_same_plan(
            protocols.plan_digest(d.plan, spec.batch.batch_size),
            f"dataset {d.name!r}" if spec.suite else f"data {d.name!r}",
        )
    target, shardings = mesh_lib.param_targets(
        model.abstract_params, model.logical_axes, mesh, spec.mesh.rules, _dtype(spec.dtype)
    )
    return Prepared(
        mesh,
        ckpt,
        first_step,
        model,
        attention,
        tok,
        note,
        datasets,
        documents,
        target,
        shardings,
        reference,
    )


def _dtype(name: str) -> Any:
    import jax.numpy as jnp

    return {"float32": jnp.float32, "bfloat16": jnp.bfloat16}[name]


def _reference(spec: RunSpec, model: LanguageModel, mesh: Any):
    """The reference model (`reference.*`): opened and checked against the model, no weights."""
    ref = spec.diagnostics.reference
    ckpt = open_checkpoint(ref.checkpoint_dir, ref.checkpoint_format)
    step = ckpt.resolve_step(ref.checkpoint_step)
    ref_model = ckpt.model(ref.dtype, "auto", step)
    if ref_model.vocab_size != model.vocab_size:
        raise ConfigError(
            f"the reference model in {ref.checkpoint_dir!r} scores {ref_model.vocab_size} token "
            f"ids and the model {model.vocab_size}; KL needs the same tokenizer and vocabulary."
        )
    target, shardings = mesh_lib.param_targets(
        ref_model.abstract_params,
        ref_model.logical_axes,
        mesh,
        spec.mesh.rules,
        _dtype(ref.dtype),
    )
    return ckpt, step, ref_model, target, shardings


def _agree(values: list[int]) -> list[int]:
    """Process 0's `values` on every process (a no-op on one process)."""
    if jax.process_count() == 1:
        return values
    from jax.experimental import multihost_utils

    padded = np.full(MAX_STEPS + 1, -1, np.int64)
    padded[0] = len(values)
    padded[1 : 1 + len(values)] = values[:MAX_STEPS]
    got = np.asarray(multihost_utils.broadcast_one_to_all(padded))
    return [int(x) for x in got[1 : 1 + int(got[0])]]


def steps_to_score(spec: RunSpec, ckpt: Checkpoint, first: int | None) -> Iterator[int | None]:
    """The checkpoint steps to score, in order; with `checkpoint.watch`, each newly finalized
    step as it appears, until `checkpoint.watch_until` is scored or no new step came for
    `checkpoint.watch_timeout` seconds. Process 0 looks; every process gets the same steps."""
    s = spec.steps
    if ckpt.format == "hf" or not (s.is_sweep or spec.is_training_run):
        yield first
        return
    is_main = jax.process_index() == 0
    listed = ckpt.steps()  # every process opens the directory; process 0's view wins
    if s.kind in ("one", "latest") and not s.watch:
        chosen = [first]
    elif s.kind == "one":
        chosen = [x for x in s.steps if x in listed] if is_main else []
    else:
        chosen = s.select(listed) if is_main else []
    seen: set[int] = set()
    for step in _agree(chosen):
        seen.add(step)
        yield step
    if not s.watch:
        return
    idle_since = time.monotonic()
    while True:
        if s.watch_until is not None and any(x >= s.watch_until for x in seen):
            return
        new: list[int] = []
        timed_out = 0
        available = ckpt.steps()
        if is_main:
            latest = max(seen, default=-1)
            wanted = s.select(available) if s.kind not in ("latest", "one") else available
            new = [x for x in wanted if x not in seen and x > latest]
            if s.kind == "latest":
                new = new[-1:]
            timed_out = int(not new and time.monotonic() - idle_since > s.watch_timeout)
        decision = _agree([timed_out, *new])
        if decision[0]:
            return
        if len(decision) > 1:
            for step in decision[1:]:
                seen.add(step)
                yield step
            idle_since = time.monotonic()
        else:
            time.sleep(s.watch_interval)


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
      printer: where the per-step lines and the summary go.
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
        p.shardings,
        p.datasets,
        options=diagnostics.step_options(spec),
        reference=None if ref is None else (ref[2], ref[4]),
        compile=False,
    )
    results = store.ResultsStore.in_dir(out.path) if out is not None else None
    board = None
    if spec.tensorboard and out is not None:
        from ppl_jax.outputs import tensorboard

        board = tensorboard.TensorBoardSink(files.tensorboard_dir(out.path))
    names = [d.name for d in p.datasets]
    evaluations: list[Evaluation] = []
    written: list[str] = []
    gzip: dict[str, tuple[float | None, int | None]] = {}
    last = None
    ref_params = None
    try:
        for step in steps_to_score(spec, p.ckpt, p.first_step):
            parts = {
                d.name: run_fingerprint(
                    spec,
                    p.model,
                    p.tok,
                    d.plan,
                    d.layout,
                    p.mesh,
                    p.ckpt.format,
                    step,
                    p.attention,
                    (d.data, d.protocol),
                    spec.batch,
                )
                for d in p.datasets
            }
            digests = {n: fingerprint_lib.digest(x) for n, x in parts.items()}
            todo = [1] * len(p.datasets)
            if spec.is_training_run:
                todo = (
                    [
                        int(results is None or not results.done(step, d.name, digests[d.name]))
                        for d in p.datasets
                    ]
                    if out is not None
                    else [0] * len(p.datasets)
                )
                todo = _agree(todo)
            if any(todo):
                if step != p.first_step:
                    p.ckpt.check_same_architecture(step, p.model)
                params = p.ckpt.restore(step, p.target)
                if ref is not None and ref_params is None:
                    ref_params = ref[0].restore(ref[1], ref[3])
            records = []
            for d, needed in zip(p.datasets, todo, strict=True):
                if not needed:
                    continue
                ev = _score(
                    spec,
                    p,
                    evaluator,
                    d,
                    step,
                    params,
                    ref_params,
                    parts[d.name],
                    out,
                    progress_factory,
                    gzip,
                    t0,
                )
                evaluations.append(ev)
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
                if out is not None:
                    written += _write_pair_files(out, ev, len(p.datasets) == 1)
                    results.append([record])
                    ev.recorder.discard()  # once the record is stored
                records.append(record)
                if spec.is_training_run:
                    printer(summary.record_line(record))
            if results is not None:
                stored = results.dataset_records(step, names)
                averages = store.average_records(stored) if len(stored) > 1 else []
                if any(todo) or not _has_averages(results, step):  # else stored by a past run
                    results.append(averages)
                    if board is not None:
                        board.write(stored + averages)
                    for a in averages:
                        printer(summary.record_line(a))
                last = (step, stored, averages)
            elif spec.is_training_run and not any(todo) and out is not None:
                pass
    finally:
        if board is not None:
            board.close()
    if out is None or last is None:
        return RunResult(None, evaluations, written)
    step, stored, averages = last
    wall = time.perf_counter() - t0
    found = summary.results_json(spec, p.ckpt, step, stored, averages, results.path, wall, config)
    if not evaluations and spec.is_training_run:
        printer(
            f"every (step, dataset) pair is already in {results.path} with the same "
            f"fingerprint; nothing was scored."
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
                    p.model, params, p.mesh, p.shardings, d.plan, spec, stop.requested
                )
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
        model_description=p.model.description,
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


def _write_pair_files(out: OutputDir, ev: Evaluation, only: bool) -> list[str]:
    """A pair's files beside its record: units.npz (for `ppl-jax compare`), documents.jsonl,
    the diagnostics' curves and token file; returns the lines that name them."""
    out.write_bytes(files.units_name(None if only else ev.dataset.name), uncertainty.units_npz(ev))
    lines = []
    if ev.documents is not None:
        lines.append(f"documents: {out.write_jsonl(files.DOCUMENTS, ev.documents)}")
    return lines + diagnostics.write(out, ev.diagnostics, ev.dataset.name)


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
