"""The quantization suite of docs/diagnostics.md end to end: examples/demo_to_hf.py writes the
demo model as a Hugging Face directory, a 4-bit GPTQ copy of it is written here by the format's
formula (round to nearest, groups of 32, `gptq_v2`, independent of ppl_jax's reader), and
examples/compare_quantized.py scores both in one pass with configs/quantization.py (`gptq_chunks`)
and `study.copies`: the table has each model's intervals, the copy's paired change in bits per
byte, its KL from the original and top-1 agreement, and the study records the copy's
quantization."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
from safetensors.numpy import load_file, save_file

from ppl_jax import testing

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def gptq_copy(original: str, out: str, group: int = 32) -> None:
    """A GPTQ v2 copy of a float Llama directory: every decoder projection's codes
    round(w / s) + z (asymmetric min-max per group of 32 input columns, 4 bits) packed 8 to a
    word along the input axis, zero points 8 to a word along the output axis, float16 scales."""
    os.makedirs(out)
    tensors = load_file(os.path.join(original, "model.safetensors"))
    for name in [n for n in tensors if ".layers." in n and tensors[n].ndim == 2]:
        w = np.ascontiguousarray(tensors.pop(name).T, np.float32)  # [in, out]
        d_in, d_out = w.shape
        g = w.reshape(d_in // group, group, d_out)
        lo, hi = np.minimum(g.min(1), 0), np.maximum(g.max(1), 0)
        scales = ((hi - lo) / 15).astype(np.float16)
        s = scales.astype(np.float32)
        zeros = np.round(-lo / s).astype(np.uint32)
        codes = np.clip(np.round(g / s[:, None]) + zeros[:, None], 0, 15).astype(np.uint32)
        codes = codes.reshape(d_in, d_out)
        shifts = (4 * np.arange(8, dtype=np.uint32))[None, :, None]
        head = name.removesuffix("weight")
        tensors[head + "qweight"] = (
            (codes.reshape(d_in // 8, 8, d_out) << shifts).sum(1, dtype=np.uint32).view(np.int32)
        )
        tensors[head + "qzeros"] = (
            (zeros.reshape(d_in // group, d_out // 8, 8) << shifts[:, :, 0][:, None, :])
            .sum(2, dtype=np.uint32)
            .view(np.int32)
        )
        tensors[head + "scales"] = scales
        tensors[head + "g_idx"] = (np.arange(d_in) // group).astype(np.int32)
    # safetensors.numpy writes an array's memory as it lies: each made C-contiguous first
    save_file({k: np.ascontiguousarray(v) for k, v in tensors.items()},
              os.path.join(out, "model.safetensors"))  # fmt: skip
    with open(os.path.join(original, "config.json"), encoding="utf-8") as f:
        config = json.load(f)
    config["quantization_config"] = {"quant_method": "gptq", "bits": 4, "group_size": group,
                                     "sym": False, "desc_act": False,
                                     "checkpoint_format": "gptq_v2"}  # fmt: skip
    with open(os.path.join(out, "config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f)


def test_the_suite_reports_each_copy_against_its_original(tmp_path):
    original, copy = str(tmp_path / "original"), str(tmp_path / "gptq4")
    env = {**os.environ, "PYTHONPATH": ROOT}
    subprocess.run([sys.executable, os.path.join(ROOT, "examples", "demo_to_hf.py"), original],
                   check=True, env=env, capture_output=True)  # fmt: skip
    gptq_copy(original, copy)
    corpus = testing.write_corpus(str(tmp_path / "text"), [testing.stdlib_text(12_000)])
    out = str(tmp_path / "results")
    done = subprocess.run(
        [sys.executable, os.path.join(ROOT, "examples", "compare_quantized.py"),
         "--original", original, "--copy", f"gptq4={copy}", "--data", corpus, "--out", out,
         "--", "--config.data.tokenizer=byte", "--config.eval.seq_len=256",
         "--config.metrics.bootstrap_samples=200"],
        env=env, capture_output=True, text=True,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert "| gptq4 |" in done.stdout and "| original |" in done.stdout
    with open(os.path.join(out, "table.json"), encoding="utf-8") as f:
        (table,) = json.load(f)
    base, q = table["study"]["original"], table["study"]["copies"]["gptq4"]
    assert q["quantization"]["method"] == "gptq" and q["quantization"]["bits"] == 4
    assert q["quantization"]["format"] == "gptq_v2"
    for row in (base, q):
        lo, hi = row["bits_per_byte_interval"]
        assert lo < row["bits_per_byte"] < hi
    lo, hi = q["delta_bits_per_byte_interval"]
    assert lo <= q["delta_bits_per_byte"] <= hi
    assert abs(q["delta_bits_per_byte"] - (q["bits_per_byte"] - base["bits_per_byte"])) < 1e-9
    assert 0 < q["kl_mean"] < 1 and 0.5 < q["same_top1"] < 1  # close to, not equal to, it
    with open(os.path.join(out, os.path.basename(corpus).split(".")[0], "results.json"),
              encoding="utf-8") as f:  # fmt: skip
        results = json.load(f)
    assert results["protocol"]["name"] == "gptq_chunks" and results["quantization"] is None
    assert results["study"] == table["study"]
