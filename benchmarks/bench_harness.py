"""Benchmark: lm-evaluation-harness `loglikelihood` requests per second, ppl_jax's harness model
against the harness's own HF backend (`HFLM`), same model, same requests, one run (issue 18).

    python -m benchmarks.bench_harness                    # 1,200 requests, max_length 128
    python -m benchmarks.bench_harness --requests 300 --layers 2

The model: a random GPT-2 built here with transformers (seed 0; `--layers` layers, width
`--width`, 4 heads, 256 positions) with the byte-level BPE tokenizer of tests/golden/references/
gpt2 (512 ids), saved to a temporary directory that both backends read (HFLM: `pretrained=DIR`,
CPU, float32; ppl_jax: `checkpoint=DIR`, float32, the mesh of every local device). The requests:
the LAMBADA-, ARC- and HellaSwag-shaped requests of tests/golden/harness/ (the strings HFLM
scored there), repeated with a distinct number at the start of each context (no two requests
alike, so neither backend's caches help) until `--requests`. Both use batch size `--batch_size`
and `max_length` (ppl_jax's seq_len) `--max_length`; ppl_jax packs several requests per row.

Each backend scores the requests twice in the same process: the first call includes ppl_jax's
compilation (HFLM has none), the second is the steady state. Reported: requests/s of each call
(tokenization included, as the harness calls `loglikelihood`), and the largest relative
difference of the two backends' log-likelihoods and the number of greedy flags that differ.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(REPO, "tests", "unit", "harness"))

import harness_tasks as tasks  # noqa: E402


def build_model(path: str, layers: int, width: int) -> None:
    import torch
    import transformers as tf

    source = os.path.join(tasks.MODELS, "gpt2")
    tok = tf.AutoTokenizer.from_pretrained(source)
    torch.manual_seed(0)
    config = tf.GPT2Config(
        vocab_size=len(tok),
        n_embd=width,
        n_layer=layers,
        n_head=4,
        n_positions=256,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
    )
    tf.GPT2LMHeadModel(config).eval().save_pretrained(path)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(source, name), path)


def requests(n: int) -> list[tuple[str, str]]:
    golden = tasks.load_golden()["families"]["gpt2"]["tasks"]
    base = [
        tuple(r["args"])
        for t in ("lambada_local", "arc_local", "hellaswag_local")
        for r in golden[t]["requests"]
    ]
    return [(f"{i}. {base[i % len(base)][0]}", base[i % len(base)][1]) for i in range(n)]


def timed(lm, instances) -> tuple[float, list]:
    start = time.perf_counter()
    out = lm.loglikelihood(instances, disable_tqdm=True)
    return time.perf_counter() - start, out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=1200)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--batch_size", type=int, default=16)
    parser.add_argument("--max_length", type=int, default=128)
    args = parser.parse_args()

    import jax
    import torch
    from lm_eval.api.instance import Instance
    from lm_eval.models.huggingface import HFLM

    from ppl_jax.harness import PplJaxLM

    pairs = requests(args.requests)
    instances = [Instance("loglikelihood", {}, p, i) for i, p in enumerate(pairs)]
    report = {
        "requests": len(pairs),
        "model": f"GPT-2 {args.layers} layers, width {args.width}, vocabulary 512",
        "max_length": args.max_length,
        "batch_size": args.batch_size,
        "torch_threads": torch.get_num_threads(),
        "jax_devices": jax.device_count(),
    }
    with tempfile.TemporaryDirectory() as path:
        build_model(path, args.layers, args.width)
        hf = HFLM(
            pretrained=path,
            tokenizer=path,
            max_length=args.max_length,
            batch_size=args.batch_size,
            device="cpu",
            dtype="float32",
        )
        mine = PplJaxLM(checkpoint=path, seq_len=args.max_length, batch_size=args.batch_size)
        results = {}
        for name, lm in (("hf", hf), ("ppl_jax", mine)):
            first, _ = timed(lm, instances)
            second, out = timed(lm, instances)
            results[name] = out
            report[name] = {
                "first_call_s": round(first, 2),
                "first_call_requests_per_s": round(len(pairs) / first, 1),
                "steady_s": round(second, 2),
                "steady_requests_per_s": round(len(pairs) / second, 1),
            }
    rel = [
        abs(a[0] - b[0]) / max(abs(a[0]), 1e-12)
        for a, b in zip(results["hf"], results["ppl_jax"], strict=True)
    ]
    report["max_relative_difference"] = max(rel)
    report["greedy_flags_differing"] = sum(
        a[1] != b[1] for a, b in zip(results["hf"], results["ppl_jax"], strict=True)
    )
    report["greedy_true"] = sum(b[1] for b in results["ppl_jax"])
    report["speedup_steady"] = round(
        report["ppl_jax"]["steady_requests_per_s"] / report["hf"]["steady_requests_per_s"], 2
    )
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
