"""The device check: everything a GPU must show, in one command of at most 590 seconds on one
H100 or H200 (480 without `families` and `quantized`), each part bounded in time and written into one JSON as it
finishes.

    python -m benchmarks.gpu_check                     # all parts, into gpu_check.json
    python -m benchmarks.gpu_check --parts=tests,parity --out=/tmp/check.json

Run from the repository root with the project's source importable (`pip install .`, or
`PYTHONPATH=.`), on a machine whose JAX sees one NVIDIA GPU. The parts, each in its own process
(so that one part's memory or crash is its own) under its own time limit (`BUDGETS`, in seconds,
cut to what is left of `--total` seconds):

- `tests`: `PPL_JAX_GPU_TESTS=1 python -m pytest -n 0 tests/gpu` (cuDNN against the flash kernel,
  packed rows that never see each other, the split-merge with real cuDNN, float32 = float32);
- `parity`: float32 on the GPU against float64 on the host: per-token NLL of two golden models
  (`tests/golden/families/`: Qwen3 and Gemma 2) by ppl_jax in float32 against transformers in
  float64 on the CPU (PyTorch), the largest relative difference (`model.matmul_precision` highest:
  about 1e-6; TF32 would be about 1e-4);
- `full_rows`: the Llama 3.2 1B shape at T = 2,048, cuDNN, against transformers SDPA beside it
  (`benchmarks.bench`, tokens/s and MFU of each);
- `packed`: the same shape on documents of log-uniform length packed into rows of 2,048
  (`benchmarks.bench_long_gpu --part=packed`: padding, tokens/s, MFU), and one document per row;
- `long_131k`: one 131,072-token window with cuDNN over the whole row, with cuDNN in query chunks
  of 16,384 (the diagonal-and-prefix split merged by log-sum-exp: what `mesh.context` runs on each
  device), and with the flash kernel in JAX (`xla`);
- `long_1m`: the 1B at 1,048,576 tokens with cuDNN in query chunks: time, MFU, the compiled
  step's temporaries and the device's peak memory.
- `families`: each golden family's layers at its released model's widths, one row of 8,192
  tokens in bfloat16 under `model.attention=auto` (`benchmarks.families_check`): tokens/s, MFU,
  the kernel each kind of layer ran and the attention note; the families its budget does not
  reach are listed as skipped.
- `quantized`: the Llama 3.1 8B shape at 8 x 2,048 tokens, bfloat16 against its llama.cpp
  Q4_K_M layout kept packed on the device (`benchmarks.bench_quantized_memory --run`): the
  compiled arguments and temporaries, the device's peak memory, tokens/s and MFU of each.

With `families` and `quantized` the whole check takes at most 590 seconds (`--total`);
`--parts=families` runs it alone. The parts that allocate much set `XLA_PYTHON_CLIENT_MEM_FRACTION=0.92` (JAX takes 75% of the GPU
by default). `BENCHMARKS.md`'s GPU rows come from this JSON.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time

from absl import app, flags

from benchmarks import check_runner
from benchmarks.check_runner import ROOT, env, json_rows, part_families, run

# Seconds each part may take (the whole check: at most `--total`).
BUDGETS = {
    "tests": 70,
    "parity": 40,
    "full_rows": 60,
    "packed": 45,
    "long_131k": 75,
    "long_1m": 190,
    "families": 80,
    "quantized": 60,
}
_PARTS = flags.DEFINE_list("parts", list(BUDGETS), "The parts to run, in order.")
_OUT = flags.DEFINE_string("out", "gpu_check.json", "The JSON written after each part.")
_TOTAL = flags.DEFINE_integer("total", 590, "Seconds for the whole check.")

HELD_OUT = os.path.join(ROOT, "ppl_jax", "demo", "held_out", "difflib.py.txt")
TOKENIZER = os.path.join(ROOT, "tests", "golden", "references", "gpt2", "tokenizer.json")
PARITY_FAMILIES = ("qwen3", "gemma2")


def part_tests(seconds: float) -> dict:
    gpu_env = dict(env(), PPL_JAX_GPU_TESTS="1")
    got = run([sys.executable, "-m", "pytest", "-n", "0", "-q", "tests/gpu"], seconds, gpu_env)
    summary = [
        line for line in got["log_tail"].splitlines() if " passed" in line or " failed" in line
    ]
    return {**got, "summary": summary[-1] if summary else None}


def part_parity(seconds: float) -> dict:
    code = "import benchmarks.gpu_check as c, json; print(json.dumps(c.parity()))"
    got = run([sys.executable, "-c", code], seconds, env())
    lines = [x for x in got["log_tail"].splitlines() if x.startswith("{")]
    return {**got, "result": json.loads(lines[-1]) if lines else None}


def parity() -> dict:
    """Per family, the largest relative difference of ppl_jax's float32 per-token NLL (on the
    default device) from transformers' float64 (PyTorch, CPU), on the golden model's windows."""
    import jax
    import numpy as np
    import torch
    from transformers import AutoModelForCausalLM

    sys.path.insert(0, os.path.join(ROOT, "tests"))
    sys.path.insert(0, os.path.join(ROOT, "tests", "unit", "models"))
    import test_families  # the golden models and their windows

    out = {"device": jax.devices()[0].device_kind}
    for family in PARITY_FAMILIES:
        path = os.path.join(test_families.FAMILY_DIR, family)
        model, params = test_families.load_dir(path)
        windows = test_families.ppl_windows(test_families.golden(family), "sliding")
        rows = windows.rows(np.arange(windows.num_windows))
        ours = test_families.score_rows(model, params, rows)
        hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float64)
        ref = np.zeros_like(ours)
        for r, n in enumerate((rows["segment_ids"] > 0).sum(axis=1)):  # each row alone, unpadded
            tokens = torch.as_tensor(rows["tokens"][r : r + 1, :n], dtype=torch.long)
            with torch.no_grad():
                logp = torch.log_softmax(hf(input_ids=tokens[:, :-1]).logits, dim=-1)
            ref[r, : n - 1] = -logp.gather(-1, tokens[:, 1:, None])[0, :, 0].numpy()
        scored = rows["target_mask"][:, 1:]
        rel = np.abs(ours[scored] - ref[scored]) / np.abs(ref[scored])
        out[family] = {"max_relative": float(rel.max()), "tokens": int(scored.sum())}
    return out


def part_full_rows(seconds: float) -> dict:
    with tempfile.TemporaryDirectory() as work:
        path = os.path.join(work, "bench.json")
        got = run(
            [sys.executable, "-m", "benchmarks.bench", "--model=llama-1b", "--seq_len=2048",
             "--dtype=bfloat16", "--num_sequences=128", "--batch_size=32", "--attention=cudnn",
             "--peer_batch_sizes=16", "--compare_bf16=false", f"--data={HELD_OUT}",
             f"--tokenizer={TOKENIZER}", f"--work_dir={work}", f"--out={path}"],
            seconds, env(big=True),
        )  # fmt: skip
        return {**got, "result": json_rows(path)}


def part_packed(seconds: float) -> dict:
    with tempfile.TemporaryDirectory() as work:
        path = os.path.join(work, "packed.json")
        got = run(
            [sys.executable, "-m", "benchmarks.bench_long_gpu", "--part=packed",
             "--num_rows=128", "--length_buckets=8", f"--out={path}"],
            seconds, env(big=True),
        )  # fmt: skip
        return {**got, "result": json_rows(path)}


def _long(seconds: float, length: int, variants: list[tuple[str, int]]) -> dict:
    """One window of `length` tokens per (attention, token_chunk), each in its own process,
    within `seconds` together."""
    deadline = time.perf_counter() + seconds
    out = {}
    with tempfile.TemporaryDirectory() as work:
        for attention, chunk in variants:
            name = f"{attention}, token_chunk {chunk}"
            path = os.path.join(work, "long.json")
            got = run(
                [sys.executable, "-m", "benchmarks.bench_long_gpu", "--part=long",
                 f"--lengths={length}", f"--attention={attention}", f"--token_chunk={chunk}",
                 f"--out={path}"],
                deadline - time.perf_counter(), env(big=True),
            )  # fmt: skip
            out[name] = {**got, "result": json_rows(path)}
            if os.path.exists(path):
                os.remove(path)
    return out


def part_quantized(seconds: float) -> dict:
    with tempfile.TemporaryDirectory() as work:
        path = os.path.join(work, "quantized.json")
        got = run(
            [sys.executable, "-m", "benchmarks.bench_quantized_memory", "--models=llama-8b",
             "--run=5", "--attention=cudnn", f"--out={path}"],
            seconds, env(big=True),
        )  # fmt: skip
        return {**got, "result": json_rows(path)}


def part_long_131k(seconds: float) -> dict:
    return _long(seconds, 131072, [("cudnn", 0), ("cudnn", 16384), ("xla", 16384)])


def part_long_1m(seconds: float) -> dict:
    return _long(seconds, 1048576, [("cudnn", 16384)])


PARTS = {
    "tests": part_tests,
    "parity": part_parity,
    "full_rows": part_full_rows,
    "packed": part_packed,
    "long_131k": part_long_131k,
    "long_1m": part_long_1m,
    "families": part_families,
    "quantized": part_quantized,
}


def main(argv: list[str]) -> None:
    del argv
    check_runner.run_parts("gpu_check", PARTS, BUDGETS, _PARTS.value, _TOTAL.value, _OUT.value)


if __name__ == "__main__":
    app.run(main)
