"""The command line's hooks of the one evaluation loop (`Evaluator.__call__`,
`ppl_jax.evaluation.hooks`): what `ppl_jax.evaluation.run` adds to a training loop's call.

- `todo`: a training run (a suite, a sweep, watch) skips a (step, dataset) pair stored in
  `results.jsonl` with the same fingerprint; process 0 decides and every process agrees.
- `pair`: each pair's journal, opened before any weight is read (one of another run is refused
  then) and resumed from (a run of one step and one dataset keeps `journal.npz`).
- `restore`: the step's params (and, once, the reference model's or a study's copies'), then
  the stop request.
- each pair (`RunPair`): the stop request, its progress bar, the diagnostics (the short-context
  and LongPPL passes before its own, the context sweep after), the gzip baseline, the seconds of
  every pass; on process 0 its files (`units.npz`, documents, curves, tokens); a stopped pair
  saves its journal and ends the run in one sentence (`Interrupted`).
- `step_records`: the step's records as stored (this run's and an earlier run's), averaged.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import numpy as np

from ppl_jax.checkpoints import architecture
from ppl_jax.errors import Interrupted
from ppl_jax.evaluation.evaluator import Evaluator
from ppl_jax.evaluation.hooks import Hooks, PairHooks, Record
from ppl_jax.evaluation.passes import context_sweep, diagnostics
from ppl_jax.evaluation.passes.shared import Passes
from ppl_jax.evaluation.result import Evaluation, per_document
from ppl_jax.evaluation.run.setup import RunSetup
from ppl_jax.evaluation.run.steps import agree
from ppl_jax.evaluation.spec import RunSpec
from ppl_jax.metrics import sums as metrics
from ppl_jax.metrics import uncertainty
from ppl_jax.outputs import cost, files, journal, store
from ppl_jax.outputs.folder import OutputDir
from ppl_jax.outputs.model_record import num_params
from ppl_jax.plans import planner, protocols
from ppl_jax.plans.planner import Dataset
from ppl_jax.runtime import preemption


@dataclasses.dataclass
class RunHooks(Hooks):
    """One run's hooks (see the module docstring): what `set_up` built, where the run writes,
    the params of the step being scored, and what every pair adds to (its evaluations, the
    lines naming the files written).

    Attributes:
      kept: the sentence a stop between phases ends with (what is kept, how to resume).
    """

    spec: RunSpec
    setup: RunSetup
    out: OutputDir | None
    results: store.ResultsStore | None
    progress_factory: Callable[..., Any] | None
    started: float
    stop: preemption.StopRequest
    setup_seconds: float = 0.0
    kept: str = ""
    params: Any = None
    reference_params: Any = None
    restore_seconds: dict[str, float | None] = dataclasses.field(default_factory=dict)
    copy_seconds: dict[str, float] = dataclasses.field(default_factory=dict)  # restore, by copy
    evaluations: list[Evaluation] = dataclasses.field(default_factory=list)
    written: list[str] = dataclasses.field(default_factory=list)
    gzip: dict[str, tuple[float | None, int | None]] = dataclasses.field(default_factory=dict)

    def protocol_part(self) -> dict[str, Any]:
        return self.setup.long_context_part()

    def todo(self, step: int | None, digests: Mapping[str, str]) -> set[str]:
        """Every dataset for a run of one step and one dataset; for a training run, those not
        stored with the same fingerprint (process 0's decision, on every process)."""
        if not self.spec.is_training_run:
            return set(digests)
        names = list(digests)
        results = self.results
        needed = [0] * len(names)
        if results is not None:
            needed = [int(not results.done(step, n, digests[n])) for n in names]
        return {n for n, x in zip(names, agree(needed), strict=True) if x}

    def pair(
        self, evaluator: Evaluator, d: Dataset, step: int | None, parts: dict[str, Any]
    ) -> RunPair:
        return RunPair(self, d, step, self.recorder(d, step, parts))

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

    def restore(self, step: int | None) -> tuple[Any, Any]:
        """The step's params (and, once, the reference's) onto the mesh; then the stop request
        is asked (a signal during the restore stops the run before scoring)."""
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
        if p.copies and self.reference_params is None:  # a study: its copies' params, in order
            restored_copies = []
            for name, copy in p.copies.items():
                t = time.perf_counter()
                restored_copies.append(copy.restore())
                self.copy_seconds[name] = time.perf_counter() - t
            self.reference_params = tuple(restored_copies)
            self.restore_seconds["copies_restore_seconds"] = time.perf_counter() - t1
        restored = (
            f"after restoring step {step}, before scoring it"
            if self.spec.is_training_run
            else "after reading the weights, before scoring them"
        )
        self.stop.check(restored, self.kept)
        return self.params, self.reference_params

    def step_records(
        self, step: int | None, records: list[dict[str, Any]]
    ) -> tuple[list[Record], bool]:
        """The step's dataset records in `results.jsonl` (this run's and an earlier run's with
        the same fingerprint); the averages are written when a pair was scored or none are
        stored for the step."""
        results = self.results
        if results is None:
            return records, True
        stored = results.dataset_records(step, [d.name for d in self.setup.datasets])
        has_averages = any(r["kind"] == "average" and r["step"] == step for r in results.records())
        return stored, bool(records) or not has_averages

    def gzip_baseline(self, d: Dataset, passes: Passes) -> tuple[float | None, int | None]:
        """gzip -9's bits per byte on the dataset's text and the bytes it compressed (process 0
        only, on a bounded sample; once per dataset: its seconds in `passes`), or (None, None)."""
        if d.name not in self.gzip:
            self.gzip[d.name] = (None, None)
            if self.spec.gzip_baseline and self.out is not None:
                p = self.setup
                with passes.timed("gzip_seconds"):
                    docs = p.documents.get(d.name) or planner.documents(d.data, p.tok)
                    joined = d.protocol.convention.joiner(d.data)
                    texts = (x.text for x in docs)
                    self.gzip[d.name] = metrics.gzip_bits_per_byte_of(texts, joined)
        return self.gzip[d.name]


def _size(ckpt: Any, step: int | None, model: Any) -> dict[str, Any]:
    """A study's model's stored size: `size_bytes` (its stored weights' bytes: codes and
    scales as stored) and `bits_per_weight` (8 x those bytes over the model's parameters, as
    llama.cpp reports a file's BPW), None where the format does not say."""
    size = ckpt.stored_bytes(step)
    params = num_params(model.abstract_params)
    bits = None if size is None or not params else 8 * size / params
    return {"size_bytes": size, "bits_per_weight": bits}


@dataclasses.dataclass
class RunPair(PairHooks):
    """One (step, dataset) pair of the run, under its journal `recorder` (see the module
    docstring)."""

    run: RunHooks
    d: Dataset
    step: int | None
    recorder: journal.Recorder
    watch: diagnostics.StepObservers | None = None
    passes: Passes = dataclasses.field(default_factory=Passes)
    progress: Any = None

    @property
    def resume(self) -> journal.State:
        return self.recorder.state

    def observers(self, params: Any) -> Sequence[Any]:
        """The pair's observers: the stop request, the diagnostics' watchers, the journal and its
        progress bar (from where the journal stopped); the long-context passes run first.

        Raises:
          Interrupted: a signal stopped a pass before the pair's.
        """
        run, d, spec = self.run, self.d, self.run.spec
        own = params if self.run.reference_params is None else params[0]
        self.watch = diagnostics.step_observers(spec, d.plan, run.setup.tok, run.out)
        self.passes = Passes(run.progress_factory)
        self.passes.seconds.update(setup_seconds=run.setup_seconds, **run.restore_seconds)
        if not diagnostics.before(run.setup, own, d, spec, self.watch, run.stop, self.passes):
            raise self.interrupted()
        if run.progress_factory is not None:  # starts where the journal stopped
            done = np.flatnonzero(self.recorder.state.batch_done)
            windows_done = sum(len(r) for i in done for r in d.layout.batch_rows(int(i)))
            others = spec.diagnostics.long_context or spec.diagnostics.context_lengths
            named = {"desc": "scoring"} if others else {}
            if run.setup.copies:  # one pass scores the original and every copy
                named = {"desc": f"original + {len(run.setup.copies)} copies"}
            note = cost_note(d, self.recorder.state.batch_done, run.setup.mesh)
            note.start()
            self.progress = run.progress_factory(d.plan.windows.num_windows, windows_done, **named)
        progress = [note, self.progress] if self.progress is not None else []
        return [run.stop, *self.watch.observers, self.recorder, *progress]

    def finish(self, ev: Evaluation, params: Any) -> Evaluation:
        """The pair's evaluation with the context sweep, the diagnostics, the gzip baseline and
        the seconds of every pass; its files written on process 0.

        Raises:
          Interrupted: a signal stopped the pair (its journal saved).
        """
        run, d, spec, p = self.run, self.d, self.run.spec, self.run.setup
        self._close_progress()
        totals = ev.totals
        sweep = None
        if totals.stopped_at is None and spec.diagnostics.context_lengths:
            own = params if run.reference_params is None else params[0]
            with self.passes.timed("context_sweep_seconds"):
                sweep = context_sweep.context_sweep(
                    p.model, own, p.mesh, p.shardings, d.plan, spec, run.stop,
                    self.passes.bar("context sweep"),
                )  # fmt: skip
            if sweep is None:
                totals.stopped_at = d.layout.num_batches
        if totals.stopped_at is not None:
            raise self.interrupted()
        main = jax.process_index() == 0  # only it writes: the others build no curve or interval
        found = diagnostics.collect(spec, totals, self.watch, sweep) if main else {}
        studied = found.get("study") or {}
        for name, part in studied.get("copies", {}).items():
            copy = p.copies[name]  # where it was read from, how it is stored, its restore time
            part["checkpoint"] = {"path": os.path.abspath(copy.checkpoint.path), "step": copy.step}
            part["quantization"] = copy.checkpoint.quantization(copy.step)
            part["restore_seconds"] = run.copy_seconds.get(name)
            part.update(_size(copy.checkpoint, copy.step, copy.model))
        if studied:
            studied["original"].update(_size(p.ckpt, self.step, p.model))
        gzip_bpb, gzip_bytes = run.gzip_baseline(d, self.passes)
        self.passes.seconds.update(
            compile_seconds=totals.compile_seconds, scoring_seconds=totals.scoring_seconds
        )
        ref = spec.diagnostics.reference
        ev = dataclasses.replace(
            ev,
            documents=per_document(d.plan, totals) if spec.per_document and main else None,
            gzip_bits_per_byte=gzip_bpb,
            gzip_sample_bytes=gzip_bytes,
            wall_seconds=time.perf_counter() - run.started,
            tokenizer_note=p.tokenizer_note,
            resumed_batches=self.recorder.resumed_batches,
            recorder=self.recorder,
            diagnostics=found,
            timing=self.passes.seconds,
            reference=None if ref is None else reference_dict(ref),
        )
        run.evaluations.append(ev)
        if run.out is not None:
            only = len(p.datasets) == 1
            run.written += write_pair_files(run.out, ev, only, spec)
        return ev

    def written(self) -> None:
        self.recorder.discard()  # once the record is stored

    def abort(self) -> None:
        if self.watch is not None:
            self.watch.abort()
        self._close_progress()

    def _close_progress(self) -> None:
        if self.progress is not None:
            self.progress.close()
            self.progress = None

    def interrupted(self) -> Interrupted:
        """The sentence of a stop while the pair was scored (its journal saved, if it keeps
        one), with the exit code of the signal."""
        stop, spec, recorder = self.run.stop, self.run.spec, self.recorder
        code = preemption.EXIT_CODE.get(stop.signal, 1)
        by = preemption.signal_name(stop.signal)
        if spec.diagnostics.any_beyond_sums:  # no journal
            return Interrupted(
                f"stopped by {by}; a run with diagnostics (output.tokens, "
                f"output.position_curve, eval.context_lengths, eval.short_context, reference.*, "
                f"study.copies) keeps no journal, so the same command starts it again from the "
                f"first batch.",
                code,
            )
        where = recorder.save() or "process 0 output.dir"
        if spec.is_training_run:
            return Interrupted(
                f"stopped by {by} at step {self.step}, dataset {self.d.name!r}; its journal is "
                f"saved in {where} and every finished (step, dataset) is in results.jsonl. Run "
                f"the same command again to resume.",
                code,
            )
        done = int(recorder.state.batch_done.sum())
        return Interrupted(
            f"stopped by {by} with {done} of {self.d.layout.num_batches} batches scored; the "
            f"journal is saved in {where}. Run the same command again to resume.",
            code,
        )


def cost_note(d: Dataset, batch_done: np.ndarray, mesh: Any) -> cost.CostNote:
    """What the pair's scoring will cost (`ppl_jax.outputs.cost`): the windows, tokens and
    batches its journal does not hold yet, on the mesh's devices."""
    left = np.flatnonzero(~np.asarray(batch_done, bool))
    windows = [w for i in left for row in d.layout.batch_rows(int(i)) for w in row]
    devices = list(mesh.devices.flat)
    return cost.CostNote(
        windows=len(windows),
        tokens=int(d.plan.windows.num_scored()[np.asarray(windows, np.int64)].sum()),
        batches=int(left.size),
        batch_size=d.layout.batch_size,
        platform=devices[0].platform,
        num_devices=len(devices),
        strided=protocols.get(d.protocol.name).strided,
    )


def reference_dict(ref: Any) -> dict[str, Any]:
    """The reference model of the divergence, as results.json names it (`reference.*`)."""
    return {
        "path": os.path.abspath(ref.checkpoint_dir),
        "step": ref.checkpoint_step,
        "dtype": ref.dtype,
    }


def write_pair_files(out: OutputDir, ev: Evaluation, only: bool, spec: RunSpec) -> list[str]:
    """A pair's files beside its record: units.npz (for `ppl-jax compare`), documents.jsonl,
    the diagnostics' curves and token file; returns the lines that name them."""
    name = files.units_name(None if only else ev.dataset.name, ev.step, spec.steps.is_sweep)
    out.write_bytes(name, uncertainty.units_npz(ev))
    lines = []
    if ev.documents is not None:
        lines.append(f"documents: {out.write_jsonl(files.DOCUMENTS, ev.documents)}")
    return lines + diagnostics.write(out, ev.diagnostics, ev.dataset.name, spec.diagnostics.figures)
