"""Writes the golden files of the context axis's default tests (tests/unit/scoring/
test_context_scoring.py) by running transformers in PyTorch, float32.

    python tests/golden/make_context_golden.py          # the models, then the numbers
    python tests/golden/make_context_golden.py --numbers-only

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

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
CONTEXT_DIR = os.path.join(HERE, "context")
MODELS = ("llama", "mistral")
VOCAB = 256
DOC = 2048
WINDOW = 300  # Mistral's sliding window


def context_model(name: str, positions: int = 4096):
    """A tiny random transformers model of `name` (seed 0): 2 layers, width 32, 4 query heads
    over 2 key/value heads, RoPE, `positions` positions; norms and biases perturbed so that a
    wrongly loaded one shows."""
    import torch
    import transformers as tf

    common = dict(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=positions,
        initializer_range=0.2,
        rms_norm_eps=1e-5,
        attn_implementation="eager",
    )
    torch.manual_seed(0)
    if name == "llama":
        model = tf.LlamaForCausalLM(tf.LlamaConfig(**common))
    else:
        model = tf.MistralForCausalLM(tf.MistralConfig(**common, sliding_window=WINDOW))
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 1:
                p.add_(0.2 * torch.randn_like(p))
    return model.eval()


def document(length: int = DOC, seed: int = 0) -> np.ndarray:
    """`[length]` random token ids below `VOCAB`."""
    return np.random.default_rng(seed).integers(0, VOCAB, size=length)


def log_probs(model, tokens: np.ndarray) -> np.ndarray:
    """`[len(tokens) - 1]` float32 log-probabilities (nats) of `tokens[1:]`, one forward pass."""
    import torch

    with torch.no_grad():
        logits = model(torch.tensor(np.asarray(tokens)[None, :-1])).logits
    lp = torch.log_softmax(logits.float(), dim=-1)[0]
    return lp[torch.arange(len(tokens) - 1), torch.tensor(np.asarray(tokens)[1:])].numpy()


def main() -> None:
    import transformers as tf

    parser = argparse.ArgumentParser()
    parser.add_argument("--numbers-only", action="store_true")
    args = parser.parse_args()
    if not args.numbers_only:
        shutil.rmtree(CONTEXT_DIR, ignore_errors=True)
        for name in MODELS:
            context_model(name).save_pretrained(os.path.join(CONTEXT_DIR, name))
    tokens = document()
    out = {"tokens": tokens.tolist(), "transformers": tf.__version__}
    for name in MODELS:
        model = tf.AutoModelForCausalLM.from_pretrained(
            os.path.join(CONTEXT_DIR, name), attn_implementation="eager"
        ).eval()
        out[name] = [float(x) for x in log_probs(model, tokens)]
    with open(os.path.join(CONTEXT_DIR, "log_probs.json"), "w", encoding="utf-8") as f:
        json.dump(out, f)


if __name__ == "__main__":
    main()
