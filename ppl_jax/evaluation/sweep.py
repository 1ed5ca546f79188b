"""A training run from the command line: a suite of datasets, every chosen checkpoint step.

`run` reads the architecture, the tokenizer and every dataset once, compiles the scoring step
once (`ppl_jax.Evaluator`), then for each step of `checkpoint.step` (`all`, a list, a range, the
latest; and with `checkpoint.watch` each step finalized later) restores the params into the same
shardings and scores every dataset whose result is not already stored with the same fingerprint.
Each (step, dataset) result is appended to `output.dir/results.jsonl` (`ppl_jax.outputs.store`) as soon
as it is scored, each step's averages after its last dataset, and, with `output.tensorboard`,
written as TensorBoard scalars. A (step, dataset) pair keeps its own journal
(`journal-<step>-<dataset>.npz`) while it is scored, so an interrupted sweep skips what is stored
and resumes the pair it was scoring. `results.json` summarises the last step scored.

On several processes, process 0 decides which steps and pairs to score (it reads the store and
polls the directory) and broadcasts the decision, so every process runs the same steps.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Iterator
from typing import Any

import jax
import numpy as np

from ppl_jax.checkpoints import orbax as checkpoint
from ppl_jax.config.settings import Settings
from ppl_jax.data import documents as data
from ppl_jax.errors import CheckpointError, ConfigError, Interrupted
from ppl_jax.evaluation import summary
from ppl_jax.evaluation.evaluator import Evaluator
from ppl_jax.evaluation.job import (
    DTYPES,
    _checkpoint_format,
    check_batch_size,
    read_model,
    run_fingerprint,
    signal_name,
)
from ppl_jax.outputs import journal, store
from ppl_jax.outputs.folder import OutputDir
from ppl_jax.plans import protocols, suite
from ppl_jax.runtime import distributed, paths, preemption
from ppl_jax.runtime import fingerprint as fingerprint_lib
from ppl_jax.runtime import mesh as mesh_lib
from ppl_jax.tokenizer import base as tokenizer

MAX_STEPS = 4096  # steps one broadcast carries


def check(settings: Settings) -> None:
    """Refuses what a training run does not do (before anything is read).

    Raises:
      ConfigError: diagnostics, per-document output or a reference model with a sweep or a
        suite, or several steps of a Hugging Face directory.
    """
    d = settings.diagnostics
    if d.tokens or d.position_curve or d.context_lengths or d.reference or settings.per_document:
        raise ConfigError(
            "output.tokens, output.position_curve, eval.context_lengths, reference.* and "
            "output.per_document score one checkpoint step on one dataset; run them without "
            "suite, a step sweep, checkpoint.watch or output.tensorboard."
        )
    if settings.steps.is_sweep and _checkpoint_format(settings) == "hf":
        raise ConfigError(
            f"checkpoint.step={settings.steps.kind} needs an Orbax directory of steps; "
            f"{settings.checkpoint_dir!r} is a Hugging Face directory (one set of weights)."
        )


def journal_name(step: int | None, dataset: str) -> str:
    """The journal file of one (step, dataset) pair."""
    safe = re.sub(r"[^A-Za-z0-9._-]+", "_", dataset)
    return f"journal-{step if step is not None else 'hf'}-{safe}.npz"


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


def steps_to_score(settings: Settings) -> Iterator[int | None]:
    """The checkpoint steps to score, in order; with `checkpoint.watch`, each newly finalized
    step as it appears, until `checkpoint.watch_until` is scored or no new step came for
    `checkpoint.watch_timeout` seconds. Process 0 looks; every process gets the same steps."""
    spec = settings.steps
    if _checkpoint_format(settings) == "hf":
        yield None
        return
    is_main = jax.process_index() == 0
    # Every process opens the directory (Orbax's manager syncs processes); process 0's view wins.
    listed = checkpoint.finalized_steps(settings.checkpoint_dir)
    if spec.kind == "one":
        chosen = list(spec.steps)
        if is_main:
            spec.select(listed)  # raises for a step that is not there (unless watch)
            chosen = [s for s in chosen if s in listed]
    else:
        chosen = spec.select(listed) if is_main else []
    seen: set[int] = set()
    for step in _agree(chosen):
        seen.add(step)
        yield step
    if not spec.watch:
        return
    idle_since = time.monotonic()
    while True:
        if spec.watch_until is not None and any(s >= spec.watch_until for s in seen):
            return
        new: list[int] = []
        timed_out = 0
        available = checkpoint.finalized_steps(settings.checkpoint_dir)
        if is_main:
            latest = max(seen, default=-1)
            wanted = spec.select(available) if spec.kind not in ("latest", "one") else available
            new = [s for s in wanted if s not in seen and s > latest]
            if spec.kind == "latest":
                new = new[-1:]
            timed_out = int(not new and time.monotonic() - idle_since > spec.watch_timeout)
        decision = _agree([timed_out, *new])
        if decision[0]:
            return
        if len(decision) > 1:
            for step in decision[1:]:
                seen.add(step)
                yield step
            idle_since = time.monotonic()
        else:
            time.sleep(spec.watch_interval)


def run(
    settings: Settings,
    config: Any,
    out: OutputDir | None,
    progress_factory: Callable[[int], Any] | None = None,
    printer: Callable[[str], None] = print,
) -> dict[str, Any] | None:
    """Scores the suite at every chosen step (see the module docstring).

    Args:
      settings: the checked config; config: the ConfigDict (recorded in results.json).
      out: the locked output folder (process 0), or None (the other processes).
      progress_factory: as `evaluate.evaluate`'s; printer: where the per-step lines go.

    Returns:
      The results.json summary of the last step scored (process 0), else None.

    Raises:
      PplJaxError subclasses for user mistakes; `Interrupted` when a signal stopped the run
      (the pair being scored keeps its journal; the same command resumes).
    """
    t0 = time.perf_counter()
    check(settings)
    if settings.tensorboard and out is not None:
        from ppl_jax.outputs import tensorboard

        tensorboard.check_available()
    mesh = mesh_lib.make_mesh(settings.mesh.data, settings.mesh.model)
    check_batch_size(settings.eval.batch_size, mesh)
    # The files before the checkpoint (with a cache, only their list: a hit reads none).
    raw = [
        (data.resolve_paths(ds.path), None) if ds.cache_dir else suite.read(ds)
        for ds, _ in settings.datasets
    ]
    model, own_tok, first_step, fmt, attention = read_model(settings)
    if isinstance(own_tok, tokenizer.Tokenizer):
        tok = own_tok
    else:
        tok = tokenizer.load(settings.data.tokenizer, own_tok)
    tokenizer.check_vocabulary(
        tok, model.vocab_size, allow_mismatch=settings.data.allow_tokenizer_mismatch
    )
    datasets = []
    for (ds, ev), (docs, counts) in zip(settings.datasets, raw, strict=True):
        if ev.seq_len > model.max_positions:
            raise ConfigError(
                f"dataset {ds.name!r}: seq_len={ev.seq_len} is beyond the model's "
                f"{model.max_positions} positions."
            )
        plan, _, _ = suite.planned(
            ds, ev, tok, model.vocab_size, None if ds.cache_dir else (docs, counts)
        )
        datasets.append(suite.Dataset(ds, ev, plan, suite.batches(plan, ev, attention)))
    for d in datasets:
        distributed.check_same_plan(
            protocols.plan_digest(d.plan, d.eval.batch_size), f"dataset {d.name!r}"
        )
    target, shardings = mesh_lib.param_targets(
        model.abstract_params, model.logical_axes, mesh, settings.mesh.rules, DTYPES[settings.dtype]
    )
    evaluator = Evaluator(model, mesh, shardings, datasets)
    results = store.ResultsStore.in_dir(out.path) if out is not None else None
    sink = None
    if settings.tensorboard and out is not None:
        from ppl_jax.outputs import tensorboard

        sink = tensorboard.TensorBoardSink(paths.join(out.path, "tensorboard"))
    names = [d.name for d in datasets]
    last = None
    try:
        for step in steps_to_score(settings):
            parts = {
                d.name: run_fingerprint(
                    settings,
                    model,
                    tok,
                    d.plan,
                    d.layout,
                    mesh,
                    fmt,
                    step,
                    attention,
                    (d.data, d.eval),
                )
                for d in datasets
            }
            digests = {name: fingerprint_lib.digest(p) for name, p in parts.items()}
            todo = (
                [
                    int(results is None or not results.done(step, d.name, digests[d.name]))
                    for d in datasets
                ]
                if out is not None
                else [0] * len(datasets)
            )
            todo = _agree(todo)
            if any(todo):
                params = _restore(settings, model, step, target, fmt, first_step)
            for d, needed in zip(datasets, todo, strict=True):
                if not needed:
                    continue
                record, recorder = _score_pair(
                    settings,
                    evaluator,
                    params,
                    d,
                    step,
                    parts[d.name],
                    digests[d.name],
                    out,
                    progress_factory,
                )
                if results is not None:
                    results.append([record])
                recorder.discard()  # once the record is stored
                printer(_line(record))
            if results is not None:
                stored = results.dataset_records(step, names)
                averages = store.average_records(stored) if len(stored) > 1 else []
                if any(todo) or not _has_averages(results, step):  # else stored by a past run
                    results.append(averages)
                    if sink is not None:
                        sink.write(stored + averages)
                    for a in averages:
                        printer(_line(a))
                last = (step, stored, averages)
    finally:
        if sink is not None:
            sink.close()
    if out is None or last is None:
        return None
    step, stored, averages = last
    return {
        "step": step,
        "checkpoint": {"path": paths.absolute(settings.checkpoint_dir), "format": fmt},
        "datasets": {r["dataset"]: r for r in stored},
        "averages": {r["dataset"]: r for r in averages},
        "results_jsonl": results.path,
        "wall_seconds": time.perf_counter() - t0,
        "run": summary.run_dict(time.perf_counter() - t0),
        "config": json.loads(config.to_json_best_effort()),
    }


def _has_averages(results: store.ResultsStore, step: int | None) -> bool:
    return any(r["kind"] == "average" and r["step"] == step for r in results.records())


def _restore(
    settings: Settings, model: Any, step: int | None, target: Any, fmt: str, first: int | None
) -> Any:
    """The params of `step`, restored into the shardings of `target`."""
    if fmt == "hf":
        from ppl_jax.checkpoints import hf

        return hf.load_params(settings.checkpoint_dir, target)
    if step != first:
        _, meta = checkpoint.read_metadata(settings.checkpoint_dir, step)
        if meta["model"] != model.description:
            raise CheckpointError(
                f"step {step} of {settings.checkpoint_dir!r} holds another architecture than "
                f"step {first}; a sweep scores the steps of one model."
            )
    return checkpoint.restore_params(settings.checkpoint_dir, step, target)


def _score_pair(
    settings: Settings,
    evaluator: Evaluator,
    params: Any,
    d: suite.Dataset,
    step: int | None,
    parts: dict[str, Any],
    digest: str,
    out: OutputDir | None,
    progress_factory: Callable[[int], Any] | None,
) -> tuple[dict[str, Any], journal.Recorder]:
    """Scores one (step, dataset) pair under its own journal; returns its record and the
    journal (to discard once the record is stored)."""
    name = journal_name(step, d.name)
    w, b = d.plan.windows.num_windows, d.layout.num_batches
    state = journal.load_everywhere(out if settings.resume else None, parts, w, b, name)
    recorder = journal.Recorder(
        out, parts, state or journal.State.empty(w, b), settings.journal_every, name
    )
    progress = progress_factory(w) if progress_factory else None
    t0 = time.perf_counter()
    with preemption.StopRequest() as stop:
        sums, totals = evaluator.score(params, d, recorder, stop, progress)
    if totals.stopped_at is not None:
        path = recorder.save()
        raise Interrupted(
            f"stopped by {signal_name(stop.signal)} at step {step}, dataset {d.name!r}; its "
            f"journal is saved in {path or 'process 0 output.dir'} and every finished (step, "
            f"dataset) is in results.jsonl. Run the same command again to resume.",
            preemption.EXIT_CODE.get(stop.signal, 1),
        )
    record = store.dataset_record(
        step=step,
        dataset=d.name,
        sums=sums,
        fingerprint=digest,
        tags=d.tags,
        checkpoint=paths.absolute(settings.checkpoint_dir),
        wall_seconds=time.perf_counter() - t0,
    )
    return record, recorder


def _line(record: dict[str, Any]) -> str:
    m = record["metrics"]

    def f(key: str) -> str:
        v = m.get(key)
        return "n/a" if v is None else f"{v:.4f}"

    what = record["dataset"] if record["kind"] == "dataset" else f"average {record['dataset']}"
    return (
        f"step {record['step']}  {what}: bits per byte {f('bits_per_byte')}, perplexity "
        f"{f('perplexity')}"
    )
