"""LongPPL of ppl_jax against the reference implementation's golden (tests/golden/longppl, made by
tests/golden/make_longppl_golden.py running PKU-ML/LongPPL itself): per document and in all, for
the model as its own evaluator and with another evaluator model.

    python -m benchmarks.bench_longppl [--figure docs/images/longppl_golden.png]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import tempfile

import numpy as np

from ppl_jax.config import from_config, get_config
from ppl_jax.evaluation import evaluate
from ppl_jax.outputs import OutputDir

FOLDER = os.path.join(os.path.dirname(os.path.dirname(__file__)), "tests", "golden", "longppl")


def scored(golden: dict, scenario: str, out: str) -> tuple[float, list[float | None]]:
    """ppl_jax's LongPPL, in all and per document, for one scenario of the golden."""
    s = golden["scenarios"][scenario]
    c = get_config()
    c.checkpoint.dir = os.path.join(FOLDER, "model")
    c.data.path, c.data.format = os.path.join(FOLDER, "documents.jsonl"), "jsonl"
    c.eval.protocol, c.eval.seq_len, c.eval.add_bos = "whole_documents", 768, "false"
    c.eval.short_context, c.eval.short_targets = golden["trunc_len"], golden["sliding_window"]
    c.longppl.alpha, c.longppl.beta = s["alpha"], s["beta"]
    if scenario == "evaluator":
        c.longppl.evaluator.dir = os.path.join(FOLDER, "evaluator")
    c.output.dir, c.output.progress, c.output.gzip_baseline = out, False, False
    c.output.tokens = True
    c.metrics.bootstrap_samples = 0
    folder = OutputDir.open(out)
    try:
        ev = evaluate(from_config(c), out=folder)
    finally:
        folder.close()
    import pyarrow.parquet as pq

    table = pq.read_table(ev.diagnostics["tokens_file"]).to_pandas()
    keys = ev.diagnostics["longppl_keys"]
    per_doc = []
    for d in range(len(s["documents"])):
        rows = table[table.document == d]
        key = keys[ev.plan.doc_starts[d] + rows.offset.to_numpy()]
        mean = math.fsum(rows.nll[key].astype(np.float64)) / key.sum() if key.any() else None
        per_doc.append(None if mean is None else math.exp(mean))
    return ev.diagnostics["long_context"]["longppl"]["longppl"], per_doc


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--figure", default="", help="write the figure here (.png, .pdf, .svg)")
    args = parser.parse_args()
    with open(os.path.join(FOLDER, "golden.json"), encoding="utf-8") as f:
        golden = json.load(f)
    found = {}
    with tempfile.TemporaryDirectory() as tmp:
        for scenario in golden["scenarios"]:
            found[scenario] = scored(golden, scenario, os.path.join(tmp, scenario))
    print("scenario   document  reference LongPPL   ppl_jax LongPPL   relative difference")
    for scenario, (total, per_doc) in found.items():
        want = golden["scenarios"][scenario]
        rows = [(str(d), doc["longppl"], per_doc[d]) for d, doc in enumerate(want["documents"])]
        for name, ref, mine in rows + [("all", want["longppl"], total)]:
            if ref is None:
                print(f"{scenario:<10} {name:>8}  {'no key tokens':>17}   {str(mine):>15}")
                continue
            print(f"{scenario:<10} {name:>8}  {ref:17.8f}   {mine:15.8f}   {mine / ref - 1:+.2e}")
    if args.figure:
        from ppl_jax.outputs import figures

        fig = figures.new_figure(7.0, 3.2, "the LongPPL golden figure")
        ax = fig.add_subplot()
        for i, (scenario, (total, per_doc)) in enumerate(found.items()):
            want = golden["scenarios"][scenario]
            pairs = [(doc["longppl"], per_doc[d]) for d, doc in enumerate(want["documents"])]
            pairs = [p for p in pairs if p[0] is not None] + [(want["longppl"], total)]
            x = np.arange(len(pairs)) + 0.2 * i
            rel = [abs(mine / ref - 1) for ref, mine in pairs]
            ax.semilogy(x, np.maximum(rel, 1e-12), "o", color=figures.COLORS[i], label=scenario)
        ax.axhline(1e-6, color=figures.GREY, linestyle="--", label="1e-6")
        ax.set(xlabel="documents with key tokens, then all", ylabel="|ppl_jax / reference - 1|")
        ax.set_title("LongPPL against PKU-ML/LongPPL (tiny Llamas)")
        ax.grid(True, **figures.GRID)
        ax.legend(title="evaluator")
        figures.save_figure(fig, args.figure)
        print(f"figure: {args.figure}")


if __name__ == "__main__":
    main()
