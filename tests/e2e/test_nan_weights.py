"""A NaN weight ends the run in the scorer's NaN sentence, whatever the reader and the weight
(REVIEW item 19): an attention weight, a norm, an MLP weight or a quantization scale of a Hugging
Face safetensors GPT-2, a GGUF GPT-2 (4-bit blocks, whose scale is the NaN) and a GPTQ Llama; a
scan's decay (Mamba2, Gated DeltaNet) and a router.
Before, a NaN that made every attention score of a query NaN was taken for a query that sees no
key (zeros out of the flash kernel), and the run scored a finite perplexity with exit 0.

The grid runs the library path (`evaluate`, what the command line runs); one command line case
checks the exit status, the sentence on stderr and that no results.json is written."""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
import sys

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from ppl_jax.checkpoints.formats import gguf_file
from ppl_jax.config.defaults import get_config
from ppl_jax.config.settings import from_config
from ppl_jax.errors import NumericsError
from ppl_jax.evaluation.run import evaluate

from helpers import GOLDEN, xla_flags

CORPUS = "def f(x):\n    return x + 1\n\nprint(f(41))\n" * 3
SENTENCE = "NaN or infinite log-probabilities at scored positions"

# name -> (golden checkpoint, tensor, index): the NaN's place. A GGUF index is a byte offset in
# the tensor's data (0: the fp16 scale `d` of the first Q4_1 block, or the first F32 value).
HF, GGUF, GPTQ = "hf/gpt2", "gguf/gpt2.gguf", "quantized/gptq_sym"
CASES = {
    "hf-attention": (HF, "transformer.h.0.attn.c_attn.weight", (0, 0)),
    "hf-norm": (HF, "transformer.h.0.ln_1.weight", (0,)),
    "hf-mlp": (HF, "transformer.h.0.mlp.c_fc.weight", (0, 0)),
    "gguf-attention-scale": (GGUF, "blk.0.attn_qkv.weight", 0),
    "gguf-norm": (GGUF, "blk.0.attn_norm.weight", 0),
    "gguf-mlp-scale": (GGUF, "blk.0.ffn_up.weight", 0),
    "gptq-attention-scale": (GPTQ, "model.layers.0.self_attn.q_proj.scales", ...),
    "gptq-norm": (GPTQ, "model.layers.0.input_layernorm.weight", (0,)),
    "gptq-mlp-scale": (GPTQ, "model.layers.0.mlp.down_proj.scales", (0, 0)),
    # The scans' decays (a NaN `A_log` was a decay below the floor: the state dropped) and a
    # router, through the same HF reader.
    "mamba2-decay": ("families/mamba2", "backbone.layers.0.mixer.A_log", (0,)),
    "gated-delta-decay": ("families/qwen3_next", "model.layers.0.linear_attn.A_log", (0,)),
    "moe-router": ("families/qwen3_next", "model.layers.0.mlp.gate.weight", (0, 0)),
}
# Two by default (and the command line case below); the whole grid in the slow tier.
DEFAULT = ("gguf-attention-scale", "gptq-attention-scale")  # hf-attention: the CLI case


def with_nan(tmp_path, case: str) -> str:
    """A copy of the case's golden checkpoint with its NaN written in; the path to score."""
    golden, tensor, index = CASES[case]
    source = os.path.join(GOLDEN, golden)
    if golden.endswith(".gguf"):
        path = str(tmp_path / os.path.basename(golden))
        shutil.copy(source, path)
        t = gguf_file.read(path).tensors[tensor]
        assert t.type in ("F32", "Q4_1"), t.type  # both start with a float (value or scale)
        nan = struct.pack("<f", np.nan) if t.type == "F32" else np.float16(np.nan).tobytes()
        with open(path, "r+b") as f:
            f.seek(t.start + index)
            f.write(nan)
        return path
    path = str(tmp_path / "model")
    shutil.copytree(source, path)
    weights = os.path.join(path, "model.safetensors")
    tensors = load_file(weights)
    assert np.isfinite(tensors[tensor].astype(np.float32)).all()
    tensors[tensor][index] = np.nan
    save_file(tensors, weights, metadata={"format": "pt"})
    return path


def settings(checkpoint: str, corpus: str) -> dict[str, object]:
    """The run's config keys: the GGUF's own tokenizer, bytes for the others (which have none)."""
    own_tokenizer = checkpoint.endswith(".gguf")
    return {
        "checkpoint.dir": checkpoint,
        "data.path": corpus,
        "data.tokenizer": "auto" if own_tokenizer else "byte",
        "data.allow_tokenizer_mismatch": not own_tokenizer,
        "eval.seq_len": 16,
        "eval.stride": 16,
        "output.progress": False,
    }


@pytest.fixture
def corpus(tmp_path) -> str:
    path = tmp_path / "corpus.py"
    path.write_text(CORPUS, encoding="utf-8")
    return str(path)


@pytest.mark.parametrize(
    "case", [c if c in DEFAULT else pytest.param(c, marks=pytest.mark.slow) for c in CASES]
)
def test_a_nan_weight_is_the_nan_error(tmp_path, corpus, case):
    c = get_config()
    for key, value in settings(with_nan(tmp_path, case), corpus).items():
        section, name = key.split(".")
        c[section][name] = value
    with pytest.raises(NumericsError, match=SENTENCE):
        evaluate(from_config(c))


def test_the_command_line_exits_2_and_writes_no_results(tmp_path, corpus):
    checkpoint = with_nan(tmp_path, "hf-attention")
    out = tmp_path / "out"
    keys = dict(settings(checkpoint, corpus), **{"output.dir": out})
    flags = [f"--config.{k}={v}" for k, v in keys.items()]
    env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS=xla_flags(1))
    r = subprocess.run(
        [sys.executable, "-m", "ppl_jax", *flags],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert r.returncode == 2, r.stderr[-2000:]
    assert SENTENCE in r.stderr and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert not (out / "results.json").exists()
