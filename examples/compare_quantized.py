"""Score an original model and its quantized copies on the quantization papers' corpora and print
one table per corpus: perplexity and bits per byte with their 95% intervals, the change in bits
per byte and the perplexity ratio to the original with their paired 95% intervals, the
correlation of per-chunk ln perplexity, KL(original || copy) and the top-1 agreement.

    python examples/compare_quantized.py --original /models/llama \\
        --copy gptq4=/models/llama-gptq --copy awq4=/models/llama-awq \\
        --data /data/wikitext-2-raw/wiki.test.raw --data /data/c4-validation.00000-of-00008.json \\
        --out results/quant [-- --config.model.dtype=bfloat16 ...]

One `ppl-jax` run per corpus (`configs/quantization.py`: `gptq_chunks` at 2,048 tokens,
intervals) scores the original and every copy in the same pass (`study.copies`: the original's
logits computed once per batch, each copy's against them; docs/diagnostics.md, "Comparing
quantized copies"), with a progress bar. A corpus whose `OUT/<corpus>/study.json` exists is not
scored again. Arguments after `--` go to every `ppl-jax` run. The tables are printed and written
to `OUT/table.json`.
"""

import argparse
import json
import os
import subprocess
import sys

from ppl_jax.metrics.study import table_lines

CONFIG = os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "..", "configs", "quantization.py"
)


def study(corpus: str, original: str, copies: dict[str, str], out: str, extra: list[str]) -> dict:
    """One corpus's study (`OUT/<corpus>/study.json`), scoring it unless `out` holds it."""
    path = os.path.join(out, "study.json")
    if not os.path.isfile(path):
        listed = ",".join(f"{name}={folder}" for name, folder in copies.items())
        flags = [f"--config={CONFIG}:{corpus}", f"--config.checkpoint.dir={original}",
                 f"--config.study.copies={listed}", f"--config.output.dir={out}"]  # fmt: skip
        # The progress bar (stderr) shows; the summary (stdout) is printed below, as a table.
        done = subprocess.run([sys.executable, "-m", "ppl_jax", *flags, *extra], stdout=subprocess.DEVNULL)  # fmt: skip
        if done.returncode:
            sys.exit(f"ppl-jax failed on {corpus} (exit status {done.returncode}).")
    with open(path, encoding="utf-8") as f:
        return json.load(f)


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
        found = study(corpus, args.original, copies, os.path.join(args.out, name), extra)
        with open(os.path.join(args.out, name, "results.json"), encoding="utf-8") as f:
            warning = (json.load(f).get("intervals") or {}).get("warning")
        table.append({"corpus": corpus, "study": found, "interval_warning": warning})
        title = f"{corpus} (gptq_chunks; 95% intervals)"
        print("\n" + "\n".join(table_lines(found, title, warning)))
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "table.json"), "w", encoding="utf-8") as f:
        json.dump(table, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
