"""Writes the golden files of the context axis's default tests (tests/unit/scoring/
test_context_scoring.py) by running transformers in PyTorch, float32.

    python tests/golden/make_context_golden.py          # the models, then the numbers
    python tests/golden/make_context_golden.py --numbers-only
    python tests/golden/make_context_golden.py --out /tmp/context

What it writes under tests/golden/context/ (committed, about 150 KB):

- `llama/`, `mistral/`: tiny random transformers models (seed 0, vectors perturbed) with 4,096
  positions, grouped-query heads; Mistral with a sliding window of 300 tokens;
- `log_probs.json`: `DOC` random token ids (seed 0) and, per model, transformers' float32
  log-probabilities of tokens 1.. given the ones before, the whole document in one forward pass
  (eager attention).

`context_model(name, positions)` is also the model of the slow test that scores a 65,536-token
window against transformers live (tests/slow/test_long_window.py).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

CONTEXT_DIR = os.path.join(common.HERE, "context")
MODELS = ("llama", "mistral")
VOCAB = 256
DOC = 2048
WINDOW = 300  # Mistral's sliding window


def context_model(name: str, positions: int = 4096):
    """A tiny random transformers model of `name` (seed 0): `common.DECODER` (2 layers, width 32,
    4 query heads over 2 key/value heads, RoPE) over `VOCAB` ids with `positions` positions and
    eager attention; norms and biases perturbed so that a wrongly loaded one shows."""
    import torch
    import transformers as tf

    fields = dict(
        common.DECODER,
        vocab_size=VOCAB,
        max_position_embeddings=positions,
        attn_implementation="eager",
    )
    torch.manual_seed(0)
    if name == "llama":
        model = tf.LlamaForCausalLM(tf.LlamaConfig(**fields))
    else:
        model = tf.MistralForCausalLM(tf.MistralConfig(**fields, sliding_window=WINDOW))
    return common.perturbed(model)


def document(length: int = DOC, seed: int = 0) -> np.ndarray:
    """`[length]` random token ids below `VOCAB`."""
    return np.random.default_rng(seed).integers(0, VOCAB, size=length)


def log_probs(model, tokens: np.ndarray) -> np.ndarray:
    """`[len(tokens) - 1]` float32 log-probabilities (nats) of `tokens[1:]`, one forward pass."""
    return common.row_log_probs(model, tokens)


def main() -> None:
    import transformers as tf

    parser = argparse.ArgumentParser()
    parser.add_argument("--numbers-only", action="store_true")
    parser.add_argument("--out", default=CONTEXT_DIR)
    args = parser.parse_args()
    if not args.numbers_only:
        shutil.rmtree(args.out, ignore_errors=True)
        for name in MODELS:
            context_model(name).save_pretrained(os.path.join(args.out, name))
    tokens = document()
    out = {"tokens": tokens.tolist(), "transformers": tf.__version__}
    for name in MODELS:
        model = tf.AutoModelForCausalLM.from_pretrained(
            os.path.join(args.out, name), attn_implementation="eager"
        ).eval()
        out[name] = [float(x) for x in log_probs(model, tokens)]
    with open(os.path.join(args.out, "log_probs.json"), "w", encoding="utf-8") as f:
        json.dump(out, f)


if __name__ == "__main__":
    main()
