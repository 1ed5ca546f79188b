"""Score an original model and its quantized copies on the quantization papers' corpora and print
one table: perplexity and bits per byte with their 95% intervals, the change in bits per byte
from the original with its paired 95% interval, the KL from the original and the top-1
agreement, per copy and corpus.

    python examples/compare_quantized.py --original /models/llama \\
        --copy gptq4=/models/llama-gptq --copy awq4=/models/llama-awq \\
        --data /data/wikitext-2-raw/wiki.test.raw --data /data/c4-validation.00000-of-00008.json \\
        --out results/quant [-- --config.model.dtype=bfloat16 ...]

It composes what ppl-jax has: `configs/quantization.py` (`gptq_chunks` at 2,048 tokens, intervals)
for each corpus; each copy scored with the original as the reference model
(`reference.checkpoint.dir`: KL(original || copy), same top-1); the original alone; then
`ppl-jax compare` of the original and each copy (paired intervals). Runs already in `--out` are
resumed or reused (ppl-jax's own journal). Arguments after `--` go to every `ppl-jax` run. The
table is printed and written to `OUT/table.json`; docs/diagnostics.md has a worked example.
"""

import argparse
import json
import os
import subprocess
import sys

CONFIG = os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "..", "configs", "quantization.py"
)


def ppl_jax(*args: str) -> str:
    """Runs `ppl-jax ARGS` (this Python's), returning its standard output; stops on failure."""
    done = subprocess.run([sys.executable, "-m", "ppl_jax", *args], capture_output=True, text=True)
    if done.returncode:
        sys.exit(f"ppl-jax {' '.join(args)} failed:\n{done.stderr.strip()[-2000:]}")
    return done.stdout


def run(corpus: str, model: str, out: str, reference: str | None, extra: list[str]) -> dict:
    """One run's results.json (scoring it unless `out` holds it)."""
    if not os.path.isfile(os.path.join(out, "results.json")):
        flags = [f"--config={CONFIG}:{corpus}", f"--config.checkpoint.dir={model}",
                 f"--config.output.dir={out}", "--config.output.progress=false"]  # fmt: skip
        if reference:
            flags.append(f"--config.reference.checkpoint.dir={reference}")
        ppl_jax(*flags, *extra)
    with open(os.path.join(out, "results.json"), encoding="utf-8") as f:
        return json.load(f)


def row(name: str, r: dict, paired: dict | None) -> dict:
    """The table's numbers of one run."""
    intervals, div = r.get("intervals") or {}, r.get("divergence") or {}
    out = {
        "model": name,
        "perplexity": r["perplexity"],
        "perplexity_interval": intervals.get("perplexity"),
        "bits_per_byte": r["bits_per_byte"],
        "bits_per_byte_interval": intervals.get("bits_per_byte"),
        "quantization": r.get("quantization"),
    }
    if paired is not None:
        out["delta_bits_per_byte"] = paired["bits_per_byte"]["difference"]
        out["delta_bits_per_byte_interval"] = paired["bits_per_byte"]["interval"]
        out["kl_mean"], out["kl_p99"] = div.get("kl_mean"), div.get("kl_p99")
        out["same_top1"] = div.get("same_top1")
    return out


def fmt(value, interval=None, digits=4) -> str:
    if value is None:
        return "-"
    text = f"{value:.{digits}f}"
    return text if not interval else f"{text} [{interval[0]:.{digits}f}, {interval[1]:.{digits}f}]"


def main(argv: list[str]) -> int:
    extra = argv[argv.index("--") + 1 :] if "--" in argv else []
    argv = argv[: argv.index("--")] if "--" in argv else argv
    parser = argparse.ArgumentParser(
        prog="compare_quantized.py", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--original", required=True, help="the float model (a checkpoint dir)")
    parser.add_argument("--copy", action="append", required=True, metavar="NAME=DIR",
                        help="a quantized copy (repeatable)")  # fmt: skip
    parser.add_argument("--data", action="append", required=True, metavar="FILE",
                        help="a corpus: a text file (WikiText-2) or JSONL (C4); repeatable")  # fmt: skip
    parser.add_argument("--out", default="results/quantization", help="output folder")
    args = parser.parse_args(argv)
    copies = dict(c.split("=", 1) for c in args.copy)
    table = []
    for corpus in args.data:
        name = os.path.basename(corpus).split(".")[0]
        base = os.path.join(args.out, name, "original")
        rows = [row("original", run(corpus, args.original, base, None, extra), None)]
        for label, folder in copies.items():
            out = os.path.join(args.out, name, label)
            r = run(corpus, folder, out, args.original, extra)
            paired = json.loads(ppl_jax("compare", base, out, "--json"))[0]
            rows.append(row(label, r, paired))
        table.append({"corpus": corpus, "rows": rows})
        print(f"\n{corpus} (gptq_chunks, {r['protocol']['seq_len']} tokens; 95% intervals)\n")
        print(
            "| model | perplexity | bits per byte | Δ bits per byte | KL mean (p99) | same top-1 |"
        )
        print("| --- | --- | --- | --- | --- | --- |")
        for x in rows:
            kl = "-" if x.get("kl_mean") is None else f"{x['kl_mean']:.5f} ({x['kl_p99']:.4f})"
            top1 = "-" if x.get("same_top1") is None else f"{100 * x['same_top1']:.2f}%"
            print(f"| {x['model']} | {fmt(x['perplexity'], x['perplexity_interval'], 3)} | "
                  f"{fmt(x['bits_per_byte'], x['bits_per_byte_interval'])} | "
                  f"{fmt(x.get('delta_bits_per_byte'), x.get('delta_bits_per_byte_interval'))} | "
                  f"{kl} | {top1} |")  # fmt: skip
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "table.json"), "w", encoding="utf-8") as f:
        json.dump(table, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
