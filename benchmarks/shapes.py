"""Shapes of published models that the benchmarks build with random weights (`LlamaConfig`
fields): one definition for every script that uses them, with no flags of its own, so that a
script can import it without defining another script's absl flags."""

from __future__ import annotations

# The Llama 3.2 1B shape: 16 layers, width 2048, 32 query heads over 8 key/value heads of 64,
# MLP 8192, vocabulary 128,256, tied; positions up to 1M + 1 tokens (one window of 1,048,576
# tokens and its next-token target).
LLAMA_1B = dict(
    vocab_size=128256,
    embed_dim=2048,
    num_layers=16,
    num_heads=32,
    num_kv_heads=8,
    head_dim=64,
    mlp_dim=8192,
    max_positions=1_048_577,
    rope_theta=500000.0,
    tie_embeddings=True,
)
# The Llama 3.1 8B shape: 32 layers, width 4096, 32 query heads over 8 key/value heads of 128,
# MLP 14,336, untied.
LLAMA_8B = dict(
    LLAMA_1B,
    embed_dim=4096,
    num_layers=32,
    num_heads=32,
    num_kv_heads=8,
    head_dim=128,
    mlp_dim=14336,
    tie_embeddings=False,
)
