"""Reporting: the summary table, `results.json`, and the progress bar."""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

from ml_collections import config_dict

from ppl_jax.config import Settings
from ppl_jax.evaluate import Evaluation


def results_dict(ev: Evaluation, settings: Settings, config: config_dict.ConfigDict) -> dict:
    """Everything `results.json` holds: metrics, counts, timings, checkpoint and config."""
    s = ev.sums
    m = ev.metrics
    return {
        "nll_sum": s.nll_sum,
        "num_tokens": s.num_tokens,
        "perplexity": m["perplexity"],
        "nll_per_token": m["nll_per_token"],
        "bits_per_token": m["bits_per_token"],
        "num_bytes": s.num_bytes,
        "bits_per_byte": m["bits_per_byte"],
        "byte_perplexity": m["byte_perplexity"],
        "num_words": s.num_words,
        "word_perplexity": m["word_perplexity"],
        "entropy_per_token": m["entropy_per_token"],
        "predictive_perplexity": m["predictive_perplexity"],
        "top1_accuracy": m["top1_accuracy"],
        "num_documents": s.num_documents,
        "num_windows": s.num_windows,
        "protocol": protocol_dict(ev, settings),
        "text_tokens": ev.plan.text_tokens,
        "gzip_bits_per_byte": ev.gzip_bits_per_byte,
        "tokens_per_second": s.num_tokens / max(ev.totals.scoring_seconds, 1e-9),
        "scoring_seconds": ev.totals.scoring_seconds,
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
        "data": {
            "name": settings.data.name,
            "path": settings.data.path,
            "format": settings.data.format,
        },
        "mesh": ev.mesh_shape,
        "num_processes": _process_count(),
        "config": json.loads(config.to_json_best_effort()),
    }


PROTOCOL_NOTES = {
    "sliding": "ppl_jax native: every token after the first scored once, stride windows",
    "hf_strided": "Hugging Face 'Perplexity of fixed-length models' strided recipe",
    "lm_eval_rolling": "lm-evaluation-harness loglikelihood_rolling, per document",
    "gptq_chunks": "GPTQ/AWQ: n // seq_len disjoint chunks, tail dropped",
}


def protocol_dict(ev: Evaluation, settings: Settings) -> dict[str, Any]:
    """The convention, named, with every count a reader needs to match a published number."""
    plan = ev.plan
    return {
        "name": plan.protocol,
        "reference": PROTOCOL_NOTES[plan.protocol],
        "seq_len": settings.eval.seq_len,
        "stride": settings.eval.stride if plan.protocol in ("sliding", "hf_strided") else None,
        "packing": settings.eval.packing,
        "padding_fraction": ev.layout.padding_fraction,
        "row_widths": sorted(set(ev.layout.widths)),
        "add_bos": plan.add_bos,
        "add_bos_setting": settings.eval.add_bos,
        "prefix_token_id": plan.prefix_id,
        "separator": settings.data.separator if plan.protocol == "sliding" else "\n\n",
        "text_tokens": plan.text_tokens,
        "scored_tokens": ev.sums.num_tokens,
        "unscored_tokens": plan.unscored_tokens,
    }


def _process_count() -> int:
    import jax

    return jax.process_count()


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
    gzip_bpb = results["gzip_bits_per_byte"]
    rows = [
        (
            "model",
            f"{arch} ({results['tokenizer']}), {results['dtype']}, "
            f"{results['attention']} attention",
        ),
        ("checkpoint", f"{results['checkpoint']['path']} @ step {results['checkpoint']['step']}"),
        (
            "data",
            f"{results['data']['name']} ({results['num_documents']} documents, "
            f"{results['num_bytes']:,} bytes)",
        ),
        ("protocol", f"{proto['name']} seq_len={proto['seq_len']}{stride}{bos}"),
        (
            "mesh",
            f"data={results['mesh']['data']} x model={results['mesh']['model']}, "
            f"{results['num_processes']} process(es)",
        ),
        (
            "tokens",
            f"{results['num_tokens']:,} scored in {results['num_windows']:,} windows"
            + (
                f"; {proto['unscored_tokens']:,} of the text's {proto['text_tokens']:,} "
                f"left unscored by the convention"
                if proto["unscored_tokens"]
                else ""
            ),
        ),
        ("perplexity", f"{results['perplexity']:.4f}"),
        ("bits per token", f"{results['bits_per_token']:.4f}"),
        (
            "bits per byte",
            f"{results['bits_per_byte']:.4f}"
            + (f"   (gzip -9: {gzip_bpb:.4f})" if gzip_bpb is not None else ""),
        ),
        ("byte perplexity", f"{results['byte_perplexity']:.4f}"),
        ("word perplexity", f"{results['word_perplexity']:.4f}"),
        (
            "top-1 accuracy",
            f"{results['top1_accuracy']:.4f}   (predictive perplexity exp(H) "
            f"{results['predictive_perplexity']:.4f})",
        ),
        (
            "batches",
            f"{len(results['protocol']['row_widths'])} compiled shape(s), "
            f"padding {100 * results['protocol']['padding_fraction']:.1f}%",
        ),
        (
            "tokens/s",
            f"{results['tokens_per_second']:,.0f}"
            f" (compile {results['compile_seconds']:.1f} s apart)",
        ),
        ("wall time", f"{results['wall_seconds']:.1f} s"),
    ]
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)


def write_results(results: dict[str, Any], output_dir: str) -> str:
    """Writes `results.json` into `output_dir` (created if needed) atomically; returns its path."""
    os.makedirs(output_dir, exist_ok=True)
    path = os.path.join(output_dir, "results.json")
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(results, f, indent=2, sort_keys=True)
        f.write("\n")
    os.replace(tmp, path)
    return path


def write_documents(documents: list[dict[str, Any]], output_dir: str) -> str:
    """Writes `documents.jsonl` (one JSON object per document) into `output_dir`."""
    os.makedirs(output_dir, exist_ok=True)
    path = os.path.join(output_dir, "documents.jsonl")
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        for record in documents:
            f.write(json.dumps(record) + "\n")
    os.replace(path + ".tmp", path)
    return path


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
