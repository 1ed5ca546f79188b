"""The main job as a library call: checkpoint + corpus + settings -> metrics.

`evaluate(settings)` wires the stages together (data -> tokenizer -> protocol windows -> scoring
step -> sums -> metrics); `score_plan` is the entry for a training loop that already holds a model
and its params on a mesh.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh

from ppl_jax.checkpoints import orbax as checkpoint
from ppl_jax.config.settings import DataSettings, EvalSettings, Settings
from ppl_jax.data import documents as data
from ppl_jax.errors import ConfigError, Interrupted
from ppl_jax.evaluation import diagnostics
from ppl_jax.metrics import sums as metrics
from ppl_jax.models import attention as attention_lib
from ppl_jax.models import interface as model_lib
from ppl_jax.models.interface import LanguageModel
from ppl_jax.outputs import journal
from ppl_jax.outputs.folder import OutputDir
from ppl_jax.plans import protocols, suite
from ppl_jax.plans.layout import Layout, plan_layout
from ppl_jax.plans.protocols import Plan
from ppl_jax.runtime import distributed, paths, preemption
from ppl_jax.runtime import fingerprint as fingerprint_lib
from ppl_jax.runtime import mesh as mesh_lib
from ppl_jax.scoring.scorer import Scorer, ScoreTotals
from ppl_jax.tokenizer import base as tokenizer

DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}


@dataclasses.dataclass
class Evaluation:
    """The outcome of a run.

    Attributes:
      sums: the merged sufficient statistics.
      metrics: `metrics.derive(sums)`, plus the protocol's own aggregates where it has them.
      totals: per-window sums and timings from the scoring loop.
      plan: what the protocol scored.
      step: the checkpoint step scored (None for a Hugging Face directory).
      documents: per-document records (document protocols), else None.
      mesh_shape: `{"data": ..., "model": ...}`.
      gzip_bits_per_byte: gzip -9 on the same text (process 0; on its first
        `metrics.GZIP_SAMPLE_BYTES` bytes), or None if not asked for; gzip_sample_bytes: the
        bytes it compressed.
      wall_seconds: the whole run, from reading the checkpoint to the last sum.
      fingerprint: what decides the numbers (`ppl_jax.runtime.fingerprint`).
      tokenizer_note: why a tokenizer that does not fit the model was allowed, or None.
      tokenizer_is_checkpoints: whether the tokenizer is the checkpoint's own.
      resumed_batches: batches taken from a journal rather than scored in this process.
      recorder: the run's journal (`discard()` it once the results are written).
      diagnostics: what `ppl_jax.evaluation.diagnostics.collect` found (curves, divergence, token file).
    """

    sums: metrics.Sums
    metrics: metrics.Metrics
    totals: ScoreTotals
    plan: Plan
    step: int | None
    documents: list[dict[str, Any]] | None
    mesh_shape: dict[str, int]
    model_description: dict[str, Any]
    tokenizer_name: str
    checkpoint_format: str
    layout: Layout
    attention: str
    gzip_bits_per_byte: float | None
    wall_seconds: float
    fingerprint: dict[str, Any] = dataclasses.field(default_factory=dict)
    tokenizer_note: str | None = None
    tokenizer_is_checkpoints: bool = True
    resumed_batches: int = 0
    recorder: journal.Recorder | None = None
    diagnostics: dict[str, Any] = dataclasses.field(default_factory=dict)
    gzip_sample_bytes: int | None = None


def check_window(seq_len: int, model: LanguageModel) -> None:
    """Raises ConfigError if `seq_len` exceeds the model's positions."""
    if seq_len > model.max_positions:
        raise ConfigError(
            f"eval.seq_len={seq_len} is beyond the model's {model.max_positions} positions; "
            f"set --config.eval.seq_len={model.max_positions} or less."
        )


def score_plan(
    model: LanguageModel,
    params: Any,
    mesh: Mesh,
    param_shardings: Any,
    plan: Plan,
    batch_size: int,
    progress: Callable[[int, int], None] | None = None,
    scorer: Scorer | None = None,
    pack: bool = True,
    num_buckets: int = 1,
    layout: Layout | None = None,
    recorder: journal.Recorder | None = None,
    stop: preemption.StopRequest | None = None,
    on_tokens: Callable[[list[tuple[int, ...]], dict[str, np.ndarray]], None] | None = None,
) -> tuple[metrics.Sums, ScoreTotals, Layout]:
    """Scores a protocol's windows.

    Args:
      model: the model interface; params must already be placed with `param_shardings`.
      plan: from `protocols.plan`.
      batch_size: global windows per step, divisible by the mesh's `data` size.
      scorer: a `Scorer` to reuse (its compiled steps are cached), or None for a new one.
      pack, num_buckets: see `ppl_jax.plans.layout.plan_layout`.
      layout: the layout already planned with these settings, or None to plan it here.
      recorder: a journal to fill (its finished batches are skipped), or None.
      stop: asked before each batch whether to stop (signals), or None.
      on_tokens: the per-token sink of a scorer built with per-token arrays (`Scorer.score`).

    Returns:
      (the sufficient statistics, the per-window sums and timings, the batch layout). If `stop`
      ended the loop, `totals.stopped_at` is set and the sums cover the batches done so far.

    Raises:
      ConfigError: bad seq_len or batch size. NumericsError: NaN or infinity scored.
    """
    check_window(plan.windows.seq_len, model)
    check_batch_size(batch_size, mesh)
    scorer = scorer or Scorer(model, mesh, param_shardings)
    if layout is None:
        layout = plan_layout(plan.windows, batch_size, pack=pack, num_buckets=num_buckets)
    state = recorder.state if recorder is not None else None
    totals = scorer.score(
        params,
        plan.windows,
        layout,
        progress=progress,
        describe_window=plan.describe_window,
        totals=None
        if state is None
        else ScoreTotals(
            state.window_nll,
            state.window_tokens,
            state.window_entropy,
            state.window_correct,
            **_position_sums(scorer.options.positions),
        ),
        skip=None if state is None else state.batch_done.copy(),
        on_fetched=None if recorder is None else recorder.on_fetched,
        should_stop=None if stop is None else stop.requested,
        on_tokens=on_tokens,
    )
    if totals.stopped_at is None and not np.array_equal(
        totals.window_tokens, plan.windows.num_scored()
    ):
        raise AssertionError("the device scored other tokens than the windows' masks hold")
    sums = metrics.Sums(
        nll_sum=totals.nll_sum,
        num_tokens=totals.num_tokens,
        num_bytes=plan.num_bytes,
        num_words=plan.num_words,
        num_documents=plan.num_documents,
        num_windows=totals.num_windows,
        entropy_sum=float(np.sum(totals.window_entropy)),
        num_correct=int(np.sum(totals.window_correct)),
    )
    return sums, totals, layout


def _position_sums(positions: int) -> dict[str, np.ndarray | None]:
    empty = ScoreTotals.zeros(0, positions)
    return {
        "nll_by_position": empty.nll_by_position,
        "tokens_by_position": empty.tokens_by_position,
    }


def check_batch_size(batch_size: int, mesh: Mesh) -> None:
    """Raises ConfigError if `batch_size` is not a multiple of the mesh's `data` axis."""
    data_size = mesh.shape["data"]
    if batch_size % data_size:
        raise ConfigError(
            f"eval.batch_size={batch_size} is not divisible by the mesh's data axis "
            f"({data_size}); use a multiple of {data_size}."
        )


def per_document(plan: Plan, totals: ScoreTotals) -> list[dict[str, Any]]:
    """One record per document: `index`, `loglikelihood` (nats, summed over its scored tokens),
    `num_tokens`, `num_bytes`, `num_words`. Needs a document-level protocol."""
    doc = plan.windows.document
    n = plan.num_documents
    ll = -np.bincount(doc, weights=totals.window_nll, minlength=n)
    tokens = np.bincount(doc, weights=totals.window_tokens, minlength=n).astype(np.int64)
    return [
        {
            "index": i,
            "source": plan.sources[i],
            "loglikelihood": float(ll[i]),
            "num_tokens": int(tokens[i]),
            "num_bytes": int(plan.doc_bytes[i]),
            "num_words": int(plan.doc_words[i]),
        }
        for i in range(n)
    ]


def _checkpoint_format(settings: Settings) -> str:
    fmt = settings.checkpoint_format
    if fmt != "auto":
        return fmt
    path = settings.checkpoint_dir
    if paths.isfile(paths.join(path, "config.json")):
        return "hf"
    return "orbax"


def read_model(settings: Settings) -> tuple[LanguageModel, Any, int | None, str, str]:
    """Reads the architecture (no weights) of `checkpoint.dir`.

    Returns:
      (model, the checkpoint's tokenizer: a `Tokenizer` for a Hugging Face directory, a stored
      description for Orbax, the step (None for Hugging Face), the checkpoint format, the
      attention implementation that will run).
    """
    fmt = _checkpoint_format(settings)
    if fmt == "hf":
        from ppl_jax.checkpoints import hf

        description = hf.read_description(settings.checkpoint_dir)
        step, tok = None, None
        if settings.data.tokenizer == "auto":
            if not hf.has_tokenizer(settings.checkpoint_dir):
                raise ConfigError(
                    f"data.tokenizer=auto, but {settings.checkpoint_dir!r} holds no tokenizer "
                    f"(tokenizer.json or tokenizer.model); set --config.data.tokenizer to one."
                )
            tok = hf.load_tokenizer(settings.checkpoint_dir)
    else:
        step, meta = checkpoint.read_metadata(settings.checkpoint_dir, settings.checkpoint_step)
        description, tok = meta["model"], meta.get("tokenizer")
    attention = attention_lib.resolve_for(settings.attention, DTYPES[settings.dtype], description)
    model = model_lib.build(description, DTYPES[settings.dtype], attention)
    check_window(settings.eval.seq_len, model)
    return model, tok, step, fmt, attention


def reference_settings(settings: Settings) -> Settings:
    """The settings that read `reference.*` as the checkpoint (its tokenizer is the model's)."""
    ref = settings.diagnostics.reference
    return dataclasses.replace(
        settings,
        checkpoint_dir=ref.checkpoint_dir,
        checkpoint_step=ref.checkpoint_step,
        checkpoint_format=ref.checkpoint_format,
        dtype=ref.dtype,
        data=dataclasses.replace(settings.data, tokenizer="the model's"),
    )


def read_reference(settings: Settings, model: LanguageModel) -> tuple[LanguageModel, str, Any]:
    """Reads the reference model's architecture (no weights) and checks it against the model.

    Returns:
      (the reference model, its format, its step).

    Raises:
      ConfigError: the reference scores another vocabulary, or reads shorter windows.
      CheckpointError: as for `checkpoint.dir`.
    """
    ref = reference_settings(settings)
    ref_model, _, step, fmt, _ = read_model(ref)
    if ref_model.vocab_size != model.vocab_size:
        raise ConfigError(
            f"the reference model in {ref.checkpoint_dir!r} scores {ref_model.vocab_size} token "
            f"ids and the model {model.vocab_size}; KL needs the same tokenizer and vocabulary."
        )
    return ref_model, fmt, step


def restore(
    settings: Settings, model: LanguageModel, mesh: Mesh, fmt: str, step: int | None
) -> tuple[Any, Any]:
    """Restores the params of `checkpoint.dir` straight into their shardings on `mesh`.

    Returns:
      (params, their shardings).
    """
    target, shardings = mesh_lib.param_targets(
        model.abstract_params,
        model.logical_axes,
        mesh,
        settings.mesh.rules,
        DTYPES[settings.dtype],
    )
    if fmt == "hf":
        from ppl_jax.checkpoints import hf

        return hf.load_params(settings.checkpoint_dir, target), shardings
    return checkpoint.restore_params(settings.checkpoint_dir, step, target), shardings


def evaluate(
    settings: Settings,
    progress_factory: Callable[[int], Any] | None = None,
    out: OutputDir | None = None,
) -> Evaluation:
    """Runs the main job: read, tokenize, plan the windows, restore, score, reduce.

    Every check that needs no weights (settings, mesh, batch size, data, architecture,
    tokenizer, token ids, the journal) comes before the weights are read. With `out` (process 0
    of a command-line run), the run keeps a journal there (`ppl_jax.outputs.journal`): a journal of the
    same fingerprint is resumed, and SIGTERM or SIGINT stop the run at a batch every process
    agrees on, with the journal saved. The other processes pass None and write nothing.

    Args:
      settings: the checked config.
      progress_factory: given the number of windows, returns a `(tokens, windows)` callback.
      out: the locked output folder, or None.

    Raises:
      PplJaxError subclasses for every user mistake (see `ppl_jax.errors`); `Interrupted` when
      a signal stopped the run (the journal is saved; the same command resumes it).
    """
    t0 = time.perf_counter()
    if settings.compilation_cache_dir:
        jax.config.update("jax_compilation_cache_dir", settings.compilation_cache_dir)
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    mesh = mesh_lib.make_mesh(settings.mesh.data, settings.mesh.model)
    check_batch_size(settings.eval.batch_size, mesh)
    if settings.per_document and settings.eval.protocol != "lm_eval_rolling":
        raise ConfigError(
            f"output.per_document=true needs a document-level protocol (lm_eval_rolling); the "
            f"windows of {settings.eval.protocol} span documents."
        )
    # The corpus first (its errors before the checkpoint's); with a cache, only its file list.
    read_first = None if settings.data.cache_dir else suite.read(settings.data)
    if read_first is None:
        data.resolve_paths(settings.data.path)
    model, own_tok, step, fmt, attention = read_model(settings)
    if isinstance(own_tok, tokenizer.Tokenizer):  # a Hugging Face directory's own tokenizer
        tok = own_tok
    else:
        tok = tokenizer.load(settings.data.tokenizer, own_tok)
    tokenizer_note = tokenizer.check_vocabulary(
        tok, model.vocab_size, allow_mismatch=settings.data.allow_tokenizer_mismatch
    )
    plan, docs, _ = suite.planned(settings.data, settings.eval, tok, model.vocab_size, read_first)
    layout = suite.batches(plan, settings.eval, attention)
    diagnostics.check(settings, plan, model)
    reference = read_reference(settings, model) if settings.diagnostics.reference else None
    distributed.check_same_plan(
        protocols.plan_digest(plan, settings.eval.batch_size), f"data {settings.data.name!r}"
    )
    parts = run_fingerprint(settings, model, tok, plan, layout, mesh, fmt, step, attention)
    num_windows, num_batches = plan.windows.num_windows, layout.num_batches
    # A run with diagnostics keeps no journal: its per-token rows and curves are not in one.
    journal_out = None if settings.diagnostics.any_beyond_sums else out
    state = journal.load_everywhere(
        journal_out if settings.resume else None, parts, num_windows, num_batches
    )
    recorder = journal.Recorder(
        journal_out,
        parts,
        state or journal.State.empty(num_windows, num_batches),
        settings.journal_every,
    )
    params, shardings = restore(settings, model, mesh, fmt, step)
    sinks = diagnostics.sinks(settings, plan, tok, out)
    if reference is not None:
        ref_model, ref_fmt, ref_step = reference
        ref_params, ref_shardings = restore(
            reference_settings(settings), ref_model, mesh, ref_fmt, ref_step
        )
        scorer = Scorer(model, mesh, shardings, sinks.options, (ref_model, ref_shardings))
        params_in = (params, ref_params)
    else:
        scorer = Scorer(model, mesh, shardings, sinks.options)
        params_in = params
    progress = progress_factory(plan.windows.num_windows) if progress_factory else None
    if progress is not None and recorder.resumed_batches:  # the bar starts where the run stopped
        done = np.flatnonzero(recorder.state.batch_done)
        progress(0, sum(len(row) for i in done for row in layout.batch_rows(int(i))))
    try:
        with preemption.StopRequest() as stop:
            sums, totals, layout = score_plan(
                model,
                params_in,
                mesh,
                shardings,
                plan,
                settings.eval.batch_size,
                progress=progress,
                scorer=scorer,
                layout=layout,
                recorder=recorder,
                stop=stop,
                on_tokens=sinks.on_tokens,
            )
            sweep = None
            if totals.stopped_at is None and settings.diagnostics.context_lengths:
                sweep = diagnostics.context_sweep(
                    model, params, mesh, shardings, plan, settings, stop.requested
                )
                if sweep is None:
                    totals.stopped_at = num_batches
        if totals.stopped_at is not None:
            raise _interrupted(recorder, stop, num_batches, journal_out is None)
        found = diagnostics.collect(settings, totals, sinks, sweep)
    except BaseException:
        sinks.abort()
        raise
    documents = per_document(plan, totals) if plan.per_document else None
    gzip_bpb, gzip_bytes = None, None
    if settings.gzip_baseline and out is not None:  # process 0 only, on a bounded sample
        if docs is None:  # the plan came from a cache
            docs = suite.documents(settings.data, tok)
        joined = settings.data.separator if settings.eval.protocol == "sliding" else protocols.JOIN
        gzip_bpb, gzip_bytes = metrics.gzip_bits_per_byte_of((d.text for d in docs), joined)
    return Evaluation(
        sums=sums,
        metrics=metrics.derive(sums),
        totals=totals,
        plan=plan,
        step=step,
        documents=documents,
        mesh_shape=dict(mesh.shape),
        model_description=model.description,
        tokenizer_name=tok.name,
        checkpoint_format=fmt,
        layout=layout,
        attention=attention,
        gzip_bits_per_byte=gzip_bpb,
        gzip_sample_bytes=gzip_bytes,
        wall_seconds=time.perf_counter() - t0,
        fingerprint=parts,
        tokenizer_note=tokenizer_note,
        tokenizer_is_checkpoints=settings.data.tokenizer == "auto",
        resumed_batches=recorder.resumed_batches,
        recorder=recorder,
        diagnostics=found,
    )


def _interrupted(
    recorder: journal.Recorder, stop: preemption.StopRequest, num_batches: int, no_journal: bool
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
    done = int(recorder.state.batch_done.sum())
    return Interrupted(
        f"stopped by {signal_name(stop.signal)} with {done} of {num_batches} batches scored; "
        f"the journal is saved in {path or 'process 0 output.dir'}. Run the same command "
        f"again to resume.",
        code,
    )


def signal_name(sig: int | None) -> str:
    import signal

    return signal.Signals(sig).name if sig is not None else "a signal"


def run_fingerprint(
    settings: Settings,
    model: LanguageModel,
    tok: tokenizer.Tokenizer,
    plan: Plan,
    layout: Layout,
    mesh: Mesh,
    fmt: str,
    step: int | None,
    attention: str,
    dataset: tuple[DataSettings, EvalSettings] | None = None,
) -> dict[str, Any]:
    """The fingerprint (`ppl_jax.runtime.fingerprint`) of everything that decides this run's numbers
    (for `dataset`, by default `settings.data` and `settings.eval`)."""
    ds, ev = dataset or (settings.data, settings.eval)
    ckpt_dir = paths.absolute(settings.checkpoint_dir)
    return fingerprint_lib.of_run(
        checkpoint={"path": ckpt_dir, "format": fmt, "step": step},
        checkpoint_files=ckpt_dir if step is None else paths.join(ckpt_dir, str(step)),
        model={"description": model.description, "dtype": settings.dtype, "attention": attention},
        data={
            "format": ds.format,
            "jsonl_field": ds.jsonl_field,
            "errors": ds.errors,
            "separator": ds.separator,
            **({"preparation": ds.preparation} if ds.preparation else {}),
            **(
                {
                    "max_documents": ds.max_documents,
                    "max_tokens": ds.max_tokens,
                    "sample_seed": ds.sample_seed,
                }
                if ds.has_budget
                else {}
            ),
        },
        data_paths=data.resolve_paths(ds.path),
        tokenizer=tok.describe(),
        protocol={
            "name": plan.protocol,
            "seq_len": ev.seq_len,
            "stride": ev.stride,
            "add_bos": plan.add_bos,
            "prefix_id": plan.prefix_id,
            "num_windows": plan.windows.num_windows,
        },
        layout={
            "batch_size": ev.batch_size,
            "packing": ev.packing,
            "length_buckets": ev.length_buckets,
            "num_batches": layout.num_batches,
        },
        mesh={**{k: int(v) for k, v in mesh.shape.items()}, "processes": jax.process_count()},
    )
