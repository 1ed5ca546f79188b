"""Reporting: the summary table, `results.json`, and the progress bar."""

from __future__ import annotations

import json
from typing import Any

from ml_collections import config_dict

from ppl_jax.data.spec import DatasetSpec
from ppl_jax.evaluation.result import Evaluation
from ppl_jax.metrics import published, uncertainty
from ppl_jax.outputs import results_json, store
from ppl_jax.runtime import fingerprint as fingerprint_lib
from ppl_jax.runtime import paths

METRIC_KEYS = (
    "perplexity",
    "nll_per_token",
    "bits_per_token",
    "bits_per_byte",
    "byte_perplexity",
    "word_perplexity",
    "entropy_per_token",
    "predictive_perplexity",
    "top1_accuracy",
)


def results_dict(ev: Evaluation, config: config_dict.ConfigDict | dict | None = None) -> dict:
    """`results.json` of a run of this one dataset (`ppl_jax.outputs.results_json.assemble`, the
    one assembly: the file a run writes): `dataset_dict` at the top level, plus `step`,
    `datasets` (its record), `averages` (none), `run`, `config` and `notes`.

    The dict is strict JSON (`json.dumps(results, allow_nan=False)` works): a metric that is
    undefined (a zero denominator) or infinite (an overflowing exp) is null, and `notes` maps
    its key to the reason, e.g. `{"word_perplexity": "inf (overflow: ...)"}` (see
    `metrics.Metrics`). `run` says what ran: UTC start and end times (ISO 8601), the command
    line, package versions, platform, device kind and count, process count. `intervals` holds
    the 95% bootstrap intervals of perplexity and bits per byte (`intervals_dict`), or null.
    """
    if isinstance(config, config_dict.ConfigDict):
        config = json.loads(config.to_json_best_effort())
    checkpoint = {"path": ev.checkpoint_path, "format": ev.checkpoint_format}
    record = dataset_record(ev)
    return results_json.assemble(ev.step, [record], checkpoint, None, ev.wall_seconds, config)


def dataset_record(ev: Evaluation, details: bool = True) -> dict[str, Any]:
    """The record of the dataset at its step (`ppl_jax.outputs.store.dataset_record`), with its
    fingerprint's digest and, with `details`, `dataset_dict` (intervals included) as its
    `details`: the one record builder, of the evaluation loop (`Evaluator.__call__`) for a
    training loop and the command line alike (which build the details on process 0 only)."""
    return store.dataset_record(
        step=ev.step,
        dataset=ev.dataset.name,
        sums=ev.sums,
        fingerprint=fingerprint_lib.digest(ev.fingerprint),
        tags=dict(ev.dataset.tags),
        checkpoint=ev.checkpoint_path,
        wall_seconds=ev.totals.scoring_seconds,
        details=dataset_dict(ev) if details else None,
    )


def dataset_dict(ev: Evaluation) -> dict:
    """One dataset's result at one step: metrics, counts, protocol, intervals, gzip baseline,
    diagnostics, timings, checkpoint, model, tokenizer, fingerprint, data, mesh; strict JSON
    (see `results_dict`). The same for a single run and for each dataset of a sweep: it is the
    `details` of the dataset's record in results.jsonl."""
    s = ev.sums
    m = ev.metrics
    notes: dict[str, str] = dict(getattr(m, "notes", {}))
    results = {
        "nll_sum": s.nll_sum,
        "num_tokens": s.num_tokens,
        "num_bytes": s.num_bytes,
        "num_words": s.num_words,
        **{key: m[key] for key in METRIC_KEYS},
        "num_documents": s.num_documents,
        "num_windows": s.num_windows,
        "protocol": protocol_dict(ev),
        "text_tokens": ev.plan.text_tokens,
        "gzip_bits_per_byte": ev.gzip_bits_per_byte,
        "gzip_sample_bytes": ev.gzip_sample_bytes,
        "intervals": intervals_dict(ev),
        "divergence": _divergence_dict(ev),
        "context_curve": ev.diagnostics.get("context_curve"),
        "long_context": ev.diagnostics.get("long_context"),
        "study": ev.diagnostics.get("study"),  # a study's copies (`ppl_jax.metrics.study`)
        # Tokens scored by this process's loop (a resumed run's journal tokens are not timed).
        "tokens_per_second": (s.num_tokens - _resumed_tokens(ev))
        / max(ev.totals.scoring_seconds, 1e-9),
        "scoring_seconds": ev.totals.scoring_seconds,
        # The loop's wait for the feed (`ppl_jax.scoring.feed`): the host's share of scoring.
        "host_seconds": ev.totals.host_seconds,
        "prepare_seconds": ev.totals.prepare_seconds,
        "compile_seconds": ev.totals.compile_seconds,
        # Every pass's seconds (`ppl_jax.evaluation.passes`), null for one that did not run.
        "timing": dict(ev.timing) or None,
        "wall_seconds": ev.wall_seconds,
        "checkpoint": _checkpoint_dict(ev),
        "model": ev.model_description,
        "attention": ev.attention,
        # The kernel each kind of attention layer ran (`model.attention=auto` picks per kind).
        "attention_layers": ev.attention_layers,
        # Which kinds of layer run the flash kernel on a GPU or TPU, and why; else None.
        "attention_note": ev.attention_note,
        "dtype": ev.dtype,
        # The checkpoint's stored quantization (method, bits, group size; weights read
        # dequantized into `dtype`), or None.
        "quantization": ev.quantization,
        "matmul_precision": ev.matmul_precision,
        "tokenizer": ev.tokenizer_name,
        "tokenizer_source": "checkpoint"
        if ev.tokenizer_is_checkpoints
        else f"data.tokenizer={ev.dataset.tokenizer}",
        "fingerprint": fingerprint_lib.digest(ev.fingerprint),
        "resumed_batches": ev.resumed_batches,
        "data": _data_dict(ev.dataset),
        "mesh": ev.mesh_shape,
        "num_processes": _process_count(),
    }
    if ev.tokenizer_note:
        notes["tokenizer"] = ev.tokenizer_note
    results = results_json.strict_json(results, "", notes)
    results["notes"] = notes
    return results


def _data_dict(ds: DatasetSpec) -> dict[str, Any]:
    """The dataset scored: its name, files, format, how a cached corpus is matched to its files,
    and what shaped the documents (a standard preparation, a budget)."""
    return {
        "name": ds.name,
        "path": ds.path,
        "format": ds.format,
        # How a cached corpus is matched to its files (`data.fingerprint`).
        "cache_dir": ds.cache_dir or None,
        "fingerprint": ds.fingerprint,
        # What shaped the documents scored: a standard preparation, and a budget.
        "preparation": ds.preparation or None,
        "budget": {
            "max_documents": ds.max_documents,
            "max_tokens": ds.max_tokens,
            "sample_seed": ds.sample_seed,
        }
        if ds.has_budget
        else None,
    }


def _checkpoint_dict(ev: Evaluation) -> dict[str, Any]:
    """The checkpoint scored: its path (absolute; a hub id or a bucket path as given), step and
    format (the reader's), and a hub revision's commit."""
    path = ev.checkpoint_path
    found = {
        "path": None if path is None else paths.absolute(path),
        "step": ev.step,
        "format": ev.checkpoint_format,
    }
    if ev.checkpoint_commit:
        found["commit"] = ev.checkpoint_commit
    return found


def _divergence_dict(ev: Evaluation) -> dict | None:
    """The divergence from the reference model (`ppl_jax.metrics.divergence`), with the
    reference (`Evaluation.reference`: its path, step and dtype; None for a reference model a
    training loop gave the `Evaluator` itself, whose checkpoint it does not know)."""
    found = ev.diagnostics.get("divergence")
    if found is None:
        return None
    return {"reference": None if ev.reference is None else dict(ev.reference), **found}


def intervals_dict(ev: Evaluation) -> dict | None:
    """The run's 95% bootstrap intervals (`uncertainty.intervals`, `ev.bootstrap_samples` drawn
    with `ev.seed`); None for 0 samples; intervals of None, with a `note`, for a run of one
    unit."""
    if ev.bootstrap_samples == 0:
        return None
    units = uncertainty.units_of(ev.plan, ev.totals)
    if units.count < 2:  # said inside the object (`notes` is for the metrics)
        return {
            "method": units.method,
            "samples": ev.bootstrap_samples,
            "seed": ev.seed,
            "unit": units.kind,
            "units": units.count,
            "perplexity": None,
            "bits_per_byte": None,
            "note": f"undefined (one {units.kind}: nothing to resample)",
        }
    return uncertainty.intervals(units, ev.bootstrap_samples, ev.seed)


def _resumed_tokens(ev: Evaluation) -> int:
    return ev.recorder.resumed_tokens if ev.recorder is not None else 0


def protocol_dict(ev: Evaluation) -> dict[str, Any]:
    """The convention, named, with every count a reader needs to match a published number."""
    plan, convention = ev.plan, ev.protocol_spec.convention
    return {
        "name": plan.protocol,
        "reference": convention.note,
        "seq_len": ev.protocol_spec.seq_len,
        "stride": ev.protocol_spec.stride,
        **ev.protocol_spec.options,
        "packing": ev.packing,
        "padding_fraction": ev.layout.padding_fraction,
        "row_widths": sorted(set(ev.layout.widths)),
        "add_bos": plan.add_bos,
        "add_bos_setting": ev.protocol_spec.add_bos,
        "prefix_token_id": plan.prefix_id,
        "separator": convention.joiner(ev.dataset),
        "text_tokens": plan.text_tokens,
        "scored_tokens": ev.sums.num_tokens,
        "unscored_tokens": plan.unscored_tokens,
        # hf_strided: the guide's loop as published (`ppl_jax.metrics.published`), else None.
        "published": published.of_run(plan, ev.totals) if convention.published_loop else None,
    }


def _process_count() -> int:
    import jax

    return jax.process_count()
