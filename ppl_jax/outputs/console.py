"""The console: the summary table of one dataset's result, a line per record of a training run,
and the progress bar (tqdm)."""

from __future__ import annotations

import math
import sys
import time
from typing import Any

from ppl_jax.metrics import divergence, study
from ppl_jax.metrics import sums as metrics
from ppl_jax.outputs import model_record

# results.json's `timing` keys (`ppl_jax.evaluation.passes`), in the order a run spends them,
# and their names in the summary.
PASSES = {
    "setup_seconds": "setup",
    "restore_seconds": "restore",
    "reference_restore_seconds": "reference restore",
    "copies_restore_seconds": "copies restore",
    "short_context_seconds": "short context",
    "longppl_evaluator_seconds": "LongPPL evaluator",
    "compile_seconds": "compile",
    "scoring_seconds": "scoring",
    "context_sweep_seconds": "context sweep",
    "gzip_seconds": "gzip baseline",
}


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
        ),
        *([("  warning", iv["warning"])] if iv.get("warning") else []),
    ]


def _cache_row(data: dict[str, Any]) -> list[tuple[str, str]]:
    """Where a cached corpus is reused: how it is matched to its files (`data.fingerprint`)."""
    if not data.get("cache_dir"):
        return []
    if data.get("fingerprint") == "content":
        how = "by the SHA-256 of every byte (data.fingerprint=content)"
    else:
        how = (
            "by path, size, modification time and 16 sampled 4 KiB blocks (data.fingerprint="
            "stat): an edit between the blocks of a file over 64 KiB that keeps its size and "
            "time is not seen; data.fingerprint=content hashes every byte"
        )
    return [("cache", f"{data['cache_dir']}: a cached corpus is matched to its files {how}")]


def _published_row(proto: dict[str, Any]) -> list[tuple[str, str]]:
    """hf_strided: the guide's loop as published, beside the exact perplexity above it."""
    found = proto.get("published")
    if not found:
        return []
    value = f"{found['perplexity']:.4f}" if found.get("perplexity") is not None else "null"
    why = f"; {found['note']}" if found.get("note") else ""
    return [
        (
            "  as published",
            f"{value}   (the guide's loop: each window's mean loss weighted by num_valid - 1; "
            f"protocol.published in results.json{why})",
        )
    ]


def timing_text(timing: dict[str, Any] | None) -> str:
    """The seconds of each pass that ran (`PASSES` order): `setup 2.1 s, restore 0.3 s, short
    context 230.5 s, ...`; empty without a `timing` (a run before it was written)."""
    timing = timing or {}
    return ", ".join(
        f"{name} {timing[key]:,.1f} s"
        for key, name in PASSES.items()
        if timing.get(key) is not None
    )


def plural(count: int, noun: str, plural_form: str | None = None) -> str:
    """`1 document`, `2 documents`, `1,024 windows`; `plural_form` for irregular nouns."""
    return f"{count:,} {noun if count == 1 else plural_form or noun + 's'}"


def _metric(results: dict[str, Any], key: str) -> str:
    """A metric to 4 decimals, or its note (`inf (overflow: ...)`, `undefined (no words)`)."""
    value = results.get(key)
    if value is None or not math.isfinite(value):
        return results.get("notes", {}).get(key, "undefined")
    return f"{value:.4f}"


def _shaped(results: dict[str, Any], key: str) -> bool:
    return bool((results.get("data") or {}).get(key))


def budget_text(budget: dict[str, Any]) -> str:
    """A document budget in words: `{"max_documents": 100, "max_tokens": 0, "sample_seed": 3}` ->
    "at most 100 documents, a sample drawn with seed 3" (the first ones in file order for -1)."""
    parts = []
    if budget.get("max_documents"):
        parts.append(f"at most {plural(budget['max_documents'], 'document')}")
    if budget.get("max_tokens"):
        parts.append(f"{budget['max_tokens']:,} tokens, the last document cut to fit")
    seed = budget.get("sample_seed", -1)
    parts.append(
        "the first in file order"
        if seed is None or seed < 0
        else f"a sample drawn with seed {seed}"
    )
    return ", ".join(parts)


def summary_table(results: dict[str, Any]) -> str:
    """A two-column text table of the run, for the terminal: what ran, its numbers, its cost."""
    rows = [*_run_rows(results), *_number_rows(results), *_cost_rows(results)]
    width = max(len(k) for k, _ in rows)
    lines = [f"{k:<{width}}  {v}" for k, v in rows]
    if results.get("divergence"):
        lines += divergence.summary_lines(
            results["divergence"], results["divergence"]["reference"]["path"]
        )
    if results.get("study"):
        warning = (results.get("intervals") or {}).get("warning")
        lines += ["", *study.table_lines(results["study"], results["data"]["name"], warning)]
    return "\n".join(lines)


def _dequantized_rows(results: dict[str, Any]) -> list[tuple[str, str]]:
    """Where a quantized checkpoint's weights were dequantized (`quantization.dequantized`):
    how many stay packed on the device and, for those dequantized on the host, the first's
    reason."""
    found = (results.get("quantization") or {}).get("dequantized")
    if not found:
        return []
    text = f"{found['on_device']} weights packed on the device"
    if found["on_host"]:
        name, why = next(iter(found["host_reasons"].items()))
        text += f", {found['on_host']} dequantized on the host ({name}: {why})"
    return [("quantized", text)]


def _run_rows(results: dict[str, Any]) -> list[tuple[str, str]]:
    """What ran: model, tokenizer, checkpoint, data (cache, preparation, budget), protocol,
    mesh."""
    arch = model_record.describe(results["model"])
    proto = results["protocol"]
    stride = f" stride={proto['stride']}" if proto["stride"] is not None else ""
    bos = (
        f", prefix token {proto['prefix_token_id']}"
        if proto["prefix_token_id"] is not None
        else f", BOS {'on' if proto['add_bos'] else 'off'}"
    )
    ckpt = results["checkpoint"]
    where = "one set of weights" if ckpt["step"] is None else f"step {ckpt['step']}"
    return [
        (
            "model",
            f"{arch} ({results['tokenizer']}), {results['dtype']}, {_attention(results)} attention",
        ),
        *([("attention note", results["attention_note"])] if results.get("attention_note") else []),
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
        *_dequantized_rows(results),
        (
            "data",
            f"{results['data']['name']} ({plural(results['num_documents'], 'document')}, "
            f"{plural(results['num_bytes'], 'byte')})",
        ),
        *_cache_row(results.get("data") or {}),
        *(
            [("preparation", results["data"]["preparation"])]
            if _shaped(results, "preparation")
            else []
        ),
        *(
            [("budget", budget_text(results["data"]["budget"]))]
            if _shaped(results, "budget")
            else []
        ),
        ("protocol", f"{proto['name']} seq_len={proto['seq_len']}{stride}{bos}"),
        (
            "mesh",
            f"data={results['mesh']['data']} x "
            + (f"context={results['mesh']['context']} x " if "context" in results["mesh"] else "")
            + f"model={results['mesh']['model']}, "
            f"{plural(results['num_processes'], 'process', 'processes')}",
        ),
    ]


def _number_rows(results: dict[str, Any]) -> list[tuple[str, str]]:
    """Its numbers: tokens scored, perplexity (as published), bits per token and byte (gzip's),
    intervals, byte and word perplexity, top-1 accuracy."""
    proto = results["protocol"]
    gzip_bpb = results["gzip_bits_per_byte"]
    return [
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
        *_published_row(proto),
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
    ]


def _cost_rows(results: dict[str, Any]) -> list[tuple[str, str]]:
    """Its cost: compiled shapes and padding, throughput, the time of each pass, wall time,
    batches resumed."""
    proto = results["protocol"]
    return [
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
        *([("time by pass", timing_text(results["timing"]))] if results.get("timing") else []),
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


def _gzip_sample(results: dict[str, Any]) -> str:
    """ ", on the first N MB" when the gzip baseline compressed a sample of the text."""
    sample = results.get("gzip_sample_bytes")
    if sample is not None and sample >= metrics.GZIP_SAMPLE_BYTES:
        return f" on the first {sample / 2**20:,.0f} MiB"
    return ""


class ProgressBar:
    """A tqdm bar of windows with tokens/s on stderr: an observer of the scoring loop
    (`ppl_jax.scoring.observers.ScoreObserver`).

    Args:
      num_windows: the windows to score; done: those a journal already holds (the bar starts
        there).
      leave: keep the finished bar on the terminal; desc: its text (a pass's name, `short
        context`, `context sweep`, ...: `ppl_jax.evaluation.passes`; the harness's requests).
    """

    def __init__(self, num_windows: int, done: int = 0, *, leave: bool = False, desc: str = ""):
        from tqdm import tqdm

        self.bar = tqdm(
            total=num_windows,
            initial=done,
            unit="window",
            file=sys.stderr,
            dynamic_ncols=True,
            mininterval=0.5,
            leave=leave,
            desc=desc or None,
        )
        self.tokens = 0
        self.start = time.perf_counter()

    def should_stop(self, i: int) -> bool:
        return False

    def on_batch(self, i: int, rows: Any, host: Any) -> None:
        """Advances by the batch's windows; the rate is of the tokens scored since the start."""
        self.tokens += int(host.num_tokens.sum())
        self.bar.update(sum(len(row) for row in rows))
        elapsed = max(time.perf_counter() - self.start, 1e-9)
        self.bar.set_postfix_str(f"{self.tokens / elapsed:,.0f} tok/s", refresh=False)

    def close(self) -> None:
        self.bar.close()


def progress_bar(enabled: bool):
    """The run's progress factory: `(windows, windows done, desc=...) -> ProgressBar`, or None
    when not `enabled` (`ppl_jax.evaluation.run.run`'s `progress_factory`)."""
    return ProgressBar if enabled else None


def _attention(results: dict[str, Any]) -> str:
    """The kernel that ran; where layers ran different ones (`auto`), each kind's
    (`auto (chunked: xla, global: splash)`)."""
    layers = results.get("attention_layers") or {}
    if len(set(layers.values())) < 2:
        return results["attention"]
    return f"{results['attention']} ({', '.join(f'{k}: {v}' for k, v in layers.items())})"
