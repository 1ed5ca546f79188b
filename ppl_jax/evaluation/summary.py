"""Reporting: the summary table, `results.json`, and the progress bar."""

from __future__ import annotations

import datetime
import importlib.metadata
import json
import math
import os
import platform
import sys
from typing import Any

import numpy as np
from ml_collections import config_dict

from ppl_jax.evaluation.outcome import Evaluation
from ppl_jax.evaluation.spec import RunSpec
from ppl_jax.metrics import published, uncertainty
from ppl_jax.runtime import fingerprint as fingerprint_lib

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
VERSIONED_PACKAGES = ("ppl_jax", "jax", "jaxlib", "flax", "orbax-checkpoint")


def results_dict(
    ev: Evaluation, settings: RunSpec, config: config_dict.ConfigDict | dict | None = None
) -> dict:
    """Everything `results.json` of one dataset holds: `dataset_dict` plus `run` and `config`.

    The dict is strict JSON (`json.dumps(results, allow_nan=False)` works): a metric that is
    undefined (a zero denominator) or infinite (an overflowing exp) is null, and `notes` maps
    its key to the reason, e.g. `{"word_perplexity": "inf (overflow: ...)"}` (see
    `metrics.Metrics`). `run` says what ran: UTC start and end times (ISO 8601), the command
    line, package versions, platform, device kind and count, process count. `intervals` holds
    the 95% bootstrap intervals of perplexity and bits per byte (`intervals_dict`), or null.
    """
    results = dataset_dict(ev, settings)
    notes = results.pop("notes")
    results["run"] = run_dict(ev.wall_seconds)
    if isinstance(config, config_dict.ConfigDict):
        config = json.loads(config.to_json_best_effort())
    results["config"] = config
    results = _strict_json(results, "", notes)
    results["notes"] = notes
    return results


def dataset_dict(ev: Evaluation, settings: RunSpec) -> dict:
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
        "protocol": protocol_dict(ev, settings),
        "text_tokens": ev.plan.text_tokens,
        "gzip_bits_per_byte": ev.gzip_bits_per_byte,
        "gzip_sample_bytes": ev.gzip_sample_bytes,
        "intervals": intervals_dict(ev, settings),
        "divergence": _divergence_dict(ev, settings),
        "context_curve": ev.diagnostics.get("context_curve"),
        "long_context": ev.diagnostics.get("long_context"),
        # Tokens scored by this process's loop (a resumed run's journal tokens are not timed).
        "tokens_per_second": (s.num_tokens - _resumed_tokens(ev))
        / max(ev.totals.scoring_seconds, 1e-9),
        "scoring_seconds": ev.totals.scoring_seconds,
        # The loop's wait for the feed (`ppl_jax.scoring.feed`): the host's share of scoring.
        "host_seconds": ev.totals.host_seconds,
        "prepare_seconds": ev.totals.prepare_seconds,
        "compile_seconds": ev.totals.compile_seconds,
        "wall_seconds": ev.wall_seconds,
        "checkpoint": {
            "path": os.path.abspath(settings.checkpoint_dir),
            "step": ev.step,
            "format": ev.checkpoint_format,
        },
        "model": ev.model_description,
        "attention": ev.attention,
        "dtype": settings.dtype,
        "tokenizer": ev.tokenizer_name,
        "tokenizer_source": "checkpoint"
        if ev.tokenizer_is_checkpoints
        else f"data.tokenizer={ev.dataset.tokenizer}",
        "fingerprint": fingerprint_lib.digest(ev.fingerprint),
        "resumed_batches": ev.resumed_batches,
        "data": {
            "name": ev.dataset.name,
            "path": ev.dataset.path,
            "format": ev.dataset.format,
            # How a cached corpus is matched to its files (`data.fingerprint`).
            "cache_dir": ev.dataset.cache_dir or None,
            "fingerprint": ev.dataset.fingerprint,
            # What shaped the documents scored: a standard preparation, and a budget.
            "preparation": ev.dataset.preparation or None,
            "budget": {
                "max_documents": ev.dataset.max_documents,
                "max_tokens": ev.dataset.max_tokens,
                "sample_seed": ev.dataset.sample_seed,
            }
            if ev.dataset.has_budget
            else None,
        },
        "mesh": ev.mesh_shape,
        "num_processes": _process_count(),
    }
    if ev.tokenizer_note:
        notes["tokenizer"] = ev.tokenizer_note
    results = _strict_json(results, "", notes)
    results["notes"] = notes
    return results


def results_json(
    settings: RunSpec,
    checkpoint: Any,
    step: int | None,
    stored: list[dict[str, Any]],
    averages: list[dict[str, Any]],
    results_jsonl: str,
    wall_seconds: float,
    config: dict[str, Any] | None,
) -> dict[str, Any]:
    """`results.json` of a run: the last step's records (`datasets`, `averages`), the store's
    path, `run` and `config`; for a run of one dataset, also that dataset's result at the top
    level (`dataset_dict`: the keys a single run has always written)."""
    top: dict[str, Any] = {}
    if len(stored) == 1 and "details" in stored[0]:
        top = dict(stored[0]["details"])
    top.update(
        {
            "step": step,
            "datasets": {r["dataset"]: r for r in stored},
            "averages": {r["dataset"]: r for r in averages},
            "results_jsonl": results_jsonl,
            "wall_seconds": wall_seconds,
            "run": run_dict(wall_seconds),
            "config": config,
        }
    )
    top.setdefault("checkpoint", {"path": checkpoint.path, "format": checkpoint.format})
    notes = dict(top.pop("notes", {}))
    top = _strict_json(top, "", notes)
    top["notes"] = notes
    return top


def _divergence_dict(ev: Evaluation, settings: RunSpec) -> dict | None:
    """The divergence from the reference model (`ppl_jax.metrics.divergence`), with the reference."""
    found = ev.diagnostics.get("divergence")
    ref = settings.diagnostics.reference
    if found is None or ref is None:
        return None
    return {
        "reference": {
            "path": os.path.abspath(ref.checkpoint_dir),
            "step": ref.checkpoint_step,
            "dtype": ref.dtype,
        },
        **found,
    }


def intervals_dict(ev: Evaluation, settings: RunSpec) -> dict | None:
    """The run's 95% bootstrap intervals (`uncertainty.intervals`); None when
    `metrics.bootstrap_samples` is 0; intervals of None, with a `note`, for a run of one unit."""
    if settings.bootstrap_samples == 0:
        return None
    units = uncertainty.units_of(ev.plan, ev.totals)
    if units.count < 2:  # said inside the object (`notes` is for the metrics)
        return {
            "method": units.method,
            "samples": settings.bootstrap_samples,
            "seed": settings.seed,
            "unit": units.kind,
            "units": units.count,
            "perplexity": None,
            "bits_per_byte": None,
            "note": f"undefined (one {units.kind}: nothing to resample)",
        }
    return uncertainty.intervals(units, settings.bootstrap_samples, settings.seed)


def _resumed_tokens(ev: Evaluation) -> int:
    return ev.recorder.resumed_tokens if ev.recorder is not None else 0


def run_dict(wall_seconds: float) -> dict[str, Any]:
    """What ran, where and when: for a reader of `results.json` months later.

    Returns:
      `started_utc`/`finished_utc` (ISO 8601, seconds; the end is now, the start `wall_seconds`
      before), `command` (sys.argv), `versions` (package -> version from
      `importlib.metadata`, None where not installed), `python`, `platform` (JAX's backend:
      cpu, gpu, tpu), `device_kind` (e.g. `NVIDIA H100 80GB HBM3`; kinds joined by `, ` on a
      mixed cluster), `device_count` (global), `process_count`, `host` (`platform.platform()`).
    """
    import jax

    finished = datetime.datetime.now(datetime.timezone.utc)
    started = finished - datetime.timedelta(seconds=wall_seconds)
    versions = {}
    for package in VERSIONED_PACKAGES:
        try:
            versions[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            versions[package] = None
    devices = jax.devices()
    return {
        "started_utc": started.isoformat(timespec="seconds"),
        "finished_utc": finished.isoformat(timespec="seconds"),
        "command": list(sys.argv),
        "versions": versions,
        "python": platform.python_version(),
        "platform": jax.default_backend(),
        "device_kind": ", ".join(sorted({d.device_kind for d in devices})),
        "device_count": len(devices),
        "process_count": jax.process_count(),
        "host": platform.platform(),
    }


def _strict_json(value: Any, path: str, notes: dict[str, str]) -> Any:
    """`value` with NumPy scalars made Python and non-finite floats made None (noted by path)."""
    if isinstance(value, dict):
        return {
            k: _strict_json(v, f"{path}.{k}" if path else str(k), notes) for k, v in value.items()
        }
    if isinstance(value, (list, tuple)):
        return [_strict_json(v, f"{path}[{i}]", notes) for i, v in enumerate(value)]
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        notes.setdefault(path, "undefined (not a number)" if math.isnan(value) else f"{value}")
        return None
    return value


def protocol_dict(ev: Evaluation, settings: RunSpec) -> dict[str, Any]:
    """The convention, named, with every count a reader needs to match a published number."""
    plan, rules = ev.plan, ev.protocol_spec.rules
    return {
        "name": plan.protocol,
        "reference": rules.note,
        "seq_len": ev.protocol_spec.seq_len,
        "stride": ev.protocol_spec.stride,
        **ev.protocol_spec.options,
        "packing": settings.batch.packing,
        "padding_fraction": ev.layout.padding_fraction,
        "row_widths": sorted(set(ev.layout.widths)),
        "add_bos": plan.add_bos,
        "add_bos_setting": ev.protocol_spec.add_bos,
        "prefix_token_id": plan.prefix_id,
        "separator": rules.joiner(ev.dataset),
        "text_tokens": plan.text_tokens,
        "scored_tokens": ev.sums.num_tokens,
        "unscored_tokens": plan.unscored_tokens,
        # hf_strided: the guide's loop as published (`ppl_jax.metrics.published`), else None.
        "published": published.of_run(plan, ev.totals),
    }


def _process_count() -> int:
    import jax

    return jax.process_count()
