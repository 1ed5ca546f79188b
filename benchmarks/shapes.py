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

# The widths of each golden family's released model (`tests/golden/families/<family>`'s
# config.json keys, Hugging Face names), laid over the golden config (its depth, layer pattern,
# expert count and routing kept) by `benchmarks.families_check`: hidden size, heads, key/value
# heads, head width, MLP (and expert) width, vocabulary, window and chunk. The released model in
# brackets. The state-space and linear-attention families (Mamba2, Falcon-H1, Nemotron-H,
# Qwen3.5, Qwen3-Next) are absent: their mixers' widths are tied to the hidden size by keys of
# their own, so they run at the golden widths (`families_check` records `"widths": "golden"`).
RELEASED = {
    # DeepSeek-V3 (MLA: query rank 1,536, key/value rank 512, heads of 128 + 64 rotary)
    "deepseek_v3": dict(hidden_size=7168, num_attention_heads=128, num_key_value_heads=128,
                        q_lora_rank=1536, kv_lora_rank=512, qk_nope_head_dim=128,
                        qk_rope_head_dim=64, qk_head_dim=192, v_head_dim=128, head_dim=64,
                        intermediate_size=18432, moe_intermediate_size=2048, vocab_size=129280),
    # Gemma 2 9B (soft-caps 50 and 30, windows of 4,096)
    "gemma2": dict(hidden_size=3584, num_attention_heads=16, num_key_value_heads=8, head_dim=256,
                   query_pre_attn_scalar=256, intermediate_size=14336, vocab_size=256000,
                   sliding_window=4096),
    # Gemma 3 4B (windows of 1,024)
    "gemma3": dict(hidden_size=2560, num_attention_heads=8, num_key_value_heads=4, head_dim=256,
                   query_pre_attn_scalar=256, intermediate_size=10240, vocab_size=262208,
                   sliding_window=1024),
    # Pythia 1.4B
    "gpt_neox": dict(hidden_size=2048, num_attention_heads=16, intermediate_size=8192,
                     vocab_size=50304),
    # gpt-oss-20b (sinks, windows of 128)
    "gpt_oss": dict(hidden_size=2880, num_attention_heads=64, num_key_value_heads=8, head_dim=64,
                    intermediate_size=2880, vocab_size=201088, sliding_window=128),
    # Llama 4 Scout (chunks of 8,192)
    "llama4": dict(hidden_size=5120, num_attention_heads=40, num_key_value_heads=8, head_dim=128,
                   intermediate_size=8192, intermediate_size_mlp=16384, vocab_size=202048,
                   attention_chunk_size=8192),
    # Mixtral 8x7B (windows of 4,096 as the golden model's)
    "mixtral": dict(hidden_size=4096, num_attention_heads=32, num_key_value_heads=8,
                    intermediate_size=14336, vocab_size=32000, sliding_window=4096),
    # OLMo 2 7B; Olmo 3 7B (windows of 4,096); OLMoE 1B-7B
    "olmo2": dict(hidden_size=4096, num_attention_heads=32, num_key_value_heads=32,
                  intermediate_size=11008, vocab_size=100352),
    "olmo3": dict(hidden_size=4096, num_attention_heads=32, num_key_value_heads=32,
                  intermediate_size=11008, vocab_size=100278, sliding_window=4096),
    "olmoe": dict(hidden_size=2048, num_attention_heads=16, num_key_value_heads=16,
                  intermediate_size=1024, vocab_size=50304),
    # Phi-3 mini 128k (longrope over heads of 96; windows of 2,047)
    "phi3": dict(hidden_size=3072, num_attention_heads=32, num_key_value_heads=32,
                 intermediate_size=8192, vocab_size=32064, sliding_window=2047,
                 partial_rotary_factor=1.0,
                 rope_parameters={"rope_type": "longrope", "rope_theta": 10000.0,
                                  "original_max_position_embeddings": 4096,
                                  "short_factor": [1.0] * 48, "long_factor": [2.0] * 48},
                 original_max_position_embeddings=4096),
    # Qwen1.5-MoE-A2.7B; Qwen3 8B; Qwen3-30B-A3B
    "qwen2_moe": dict(hidden_size=2048, num_attention_heads=16, num_key_value_heads=16,
                      intermediate_size=5632, moe_intermediate_size=1408,
                      shared_expert_intermediate_size=5632, vocab_size=151936),
    "qwen3": dict(hidden_size=4096, num_attention_heads=32, num_key_value_heads=8, head_dim=128,
                  intermediate_size=12288, vocab_size=151936),
    "qwen3_moe": dict(hidden_size=2048, num_attention_heads=32, num_key_value_heads=4,
                      head_dim=128, intermediate_size=6144, moe_intermediate_size=768,
                      vocab_size=151936),
    # SmolLM3 3B
    "smollm3": dict(hidden_size=2048, num_attention_heads=16, num_key_value_heads=4,
                    intermediate_size=11008, vocab_size=128256, sliding_window=4096),
}  # fmt: skip
RELEASED["gemma3_multimodal"] = RELEASED["gemma3"]  # its text tower's (`text_config`)
