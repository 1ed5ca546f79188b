"""Reporting: the summary table, `results.json`, and the progress bar."""

from __future__ import annotations

import datetime
import importlib.metadata
import json
import math
import os
import platform
import sys
import time
from typing import Any

import numpy as np
from ml_collections import config_dict

from ppl_jax.evaluation.outcome import Evaluation
from ppl_jax.evaluation.spec import RunSpec
from ppl_jax.metrics import divergence, uncertainty
from ppl_jax.metrics import sums as metrics
from ppl_jax.plans.spec import PROTOCOL_NOTES, STRIDED_PROTOCOLS
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
        },
        "mesh": ev.mesh_shape,
        "num_processes": _process_count(),
    }
    if ev.tokenizer_note:
        notes["tokenizer"] = ev.tokenizer_note
    results = _strict_json(results, "", notes)
    results["notes"] = notes
    return results


def record_line(record: dict[str, Any]) -> str:
    """One line for a dataset or average record of a training run."""
    m = record["metrics"]

    def f(key: str) -> str:
        v = m.get(key)
        return "n/a" if v is None else f"{v:.4f}"

    what = record["dataset"] if record["kind"] == "dataset" else f"average {record['dataset']}"
    return (
        f"step {record['step']}  {what}: bits per byte {f('bits_per_byte')}, perplexity "
        f"{f('perplexity')}"
    )


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


def _interval_row(results: dict[str, Any]) -> list[tuple[str, str]]:
    """The summary's line of the 95% intervals, if the run has them."""
    iv = results.get("intervals")
    if not iv:
        return []

    def pair(key: str) -> str:
        if iv[key] is None or None in iv[key]:
            return "undefined"
        return f"[{iv[key][0]:.4f}, {iv[key][1]:.4f}]"

    return [
        (
            "95% interval",
            f"perplexity {pair('perplexity')}, bits per byte {pair('bits_per_byte')}   "
            f"({iv['method'].split(' (')[0]}, {plural(iv['units'], iv['unit'])}, "
            f"{iv['samples']:,} samples)",
        )
    ]


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
    plan = ev.plan
    return {
        "name": plan.protocol,
        "reference": PROTOCOL_NOTES[plan.protocol],
        "seq_len": ev.protocol_spec.seq_len,
        "stride": ev.protocol_spec.stride if plan.protocol in STRIDED_PROTOCOLS else None,
        "packing": settings.batch.packing,
        "padding_fraction": ev.layout.padding_fraction,
        "row_widths": sorted(set(ev.layout.widths)),
        "add_bos": plan.add_bos,
        "add_bos_setting": ev.protocol_spec.add_bos,
        "prefix_token_id": plan.prefix_id,
        "separator": ev.dataset.separator if plan.protocol == "sliding" else "\n\n",
        "text_tokens": plan.text_tokens,
        "scored_tokens": ev.sums.num_tokens,
        "unscored_tokens": plan.unscored_tokens,
    }


def _process_count() -> int:
    import jax

    return jax.process_count()


def plural(count: int, noun: str, plural_form: str | None = None) -> str:
    """`1 document`, `2 documents`, `1,024 windows`; `plural_form` for irregular nouns."""
    return f"{count:,} {noun if count == 1 else plural_form or noun + 's'}"


def _metric(results: dict[str, Any], key: str) -> str:
    """A metric to 4 decimals, or its note (`inf (overflow: ...)`, `undefined (no words)`)."""
    value = results.get(key)
    if value is None or not math.isfinite(value):
        return results.get("notes", {}).get(key, "undefined")
    return f"{value:.4f}"


def summary_table(results: dict[str, Any]) -> str:
    """A two-column text table of the run, for the terminal."""
    model = results["model"]
    arch = (
        f"{model.get('family', '?')} {model.get('num_layers', '?')}L "
        f"d{model.get('embed_dim', '?')} vocab {model.get('vocab_size', '?')}"
    )
    proto = results["protocol"]
    stride = f" stride={proto['stride']}" if proto["stride"] is not None else ""
    bos = (
        f", prefix token {proto['prefix_token_id']}"
        if proto["prefix_token_id"] is not None
        else f", BOS {'on' if proto['add_bos'] else 'off'}"
    )
    ckpt = results["checkpoint"]
    where = (
        "HF directory"
        if ckpt.get("format") == "hf" or ckpt["step"] is None
        else f"step {ckpt['step']}"
    )
    gzip_bpb = results["gzip_bits_per_byte"]
    rows = [
        (
            "model",
            f"{arch} ({results['tokenizer']}), {results['dtype']}, "
            f"{results['attention']} attention",
        ),
        *(
            [("tokenizer", f"{results['tokenizer_source']}, not the checkpoint's own")]
            if results.get("tokenizer_source", "checkpoint") != "checkpoint"
            else []
        ),
        *(
            [("tokenizer note", results["notes"]["tokenizer"])]
            if "tokenizer" in results.get("notes", {})
            else []
        ),
        ("checkpoint", f"{ckpt['path']} @ {where}"),
        (
            "data",
            f"{results['data']['name']} ({plural(results['num_documents'], 'document')}, "
            f"{plural(results['num_bytes'], 'byte')})",
        ),
        ("protocol", f"{proto['name']} seq_len={proto['seq_len']}{stride}{bos}"),
        (
            "mesh",
            f"data={results['mesh']['data']} x model={results['mesh']['model']}, "
            f"{plural(results['num_processes'], 'process', 'processes')}",
        ),
        (
            "tokens",
            f"{results['num_tokens']:,} scored in {plural(results['num_windows'], 'window')}"
            + (
                f"; {proto['unscored_tokens']:,} of the text's {proto['text_tokens']:,} "
                f"left unscored by the convention"
                if proto["unscored_tokens"]
                else ""
            ),
        ),
        ("perplexity", _metric(results, "perplexity")),
        ("bits per token", _metric(results, "bits_per_token")),
        (
            "bits per byte",
            _metric(results, "bits_per_byte")
            + (
                f"   (gzip -9: {gzip_bpb:.4f}{_gzip_sample(results)})"
                if gzip_bpb is not None
                else ""
            ),
        ),
        *_interval_row(results),
        ("byte perplexity", _metric(results, "byte_perplexity")),
        ("word perplexity", _metric(results, "word_perplexity")),
        (
            "top-1 accuracy",
            f"{_metric(results, 'top1_accuracy')}   (predictive perplexity exp(H) "
            f"{_metric(results, 'predictive_perplexity')})",
        ),
        (
            "batches",
            f"{plural(len(proto['row_widths']), 'compiled shape')}, "
            f"padding {100 * proto['padding_fraction']:.1f}%",
        ),
        (
            "tokens/s",
            f"{results['tokens_per_second']:,.0f}"
            f" (compile {results['compile_seconds']:.1f} s apart; the loop waited "
            f"{100 * results.get('host_seconds', 0.0) / max(results['scoring_seconds'], 1e-9):.1f}%"
            f" of its time for the host)",
        ),
        ("wall time", f"{results['wall_seconds']:.1f} s"),
        *(
            [
                (
                    "resumed",
                    f"{plural(results['resumed_batches'], 'batch', 'batches')} from the journal",
                )
            ]
            if results.get("resumed_batches")
            else []
        ),
    ]
    width = max(len(k) for k, _ in rows)
    lines = [f"{k:<{width}}  {v}" for k, v in rows]
    if results.get("divergence"):
        lines += divergence.summary_lines(
            results["divergence"], results["divergence"]["reference"]["path"]
        )
    return "\n".join(lines)


def _gzip_sample(results: dict[str, Any]) -> str:
    """ ", on the first N MB" when the gzip baseline compressed a sample of the text."""
    sample = results.get("gzip_sample_bytes")
    if sample is not None and sample >= metrics.GZIP_SAMPLE_BYTES:
        return f" on the first {sample / 2**20:,.0f} MiB"
    return ""


def progress_bar(enabled: bool):
    """A factory for `evaluate`'s progress callback: a tqdm bar of windows with tokens/s."""

    def factory(num_windows: int):
        if not enabled:
            return None
        from tqdm import tqdm

        bar = tqdm(
            total=num_windows,
            unit="window",
            file=sys.stderr,
            dynamic_ncols=True,
            mininterval=0.5,
            leave=False,
        )
        start = time.perf_counter()
        seen = [0]

        def update(tokens: int, windows: int) -> None:
            seen[0] += tokens
            bar.update(windows)
            elapsed = max(time.perf_counter() - start, 1e-9)
            bar.set_postfix_str(f"{seen[0] / elapsed:,.0f} tok/s", refresh=False)
            if bar.n >= num_windows:
                bar.close()

        return update

    return factory
