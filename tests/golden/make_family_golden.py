"""Writes the golden files of the model families (issue 17) by running transformers itself.

    python tests/golden/make_family_golden.py                 # rebuilds the models and numbers
    python tests/golden/make_family_golden.py --numbers-only  # keeps the committed models
    python tests/golden/make_family_golden.py --only qwen3 --out /tmp/families

For each family in `FAMILIES`, `tests/golden/families/<name>/` holds a tiny random transformers 5
model (seed 0, its 1-D weights perturbed so that a wrongly loaded norm or bias shows) as
`save_pretrained` writes it, and `golden.json` (`common.numbers`): the token ids (bytes of English
text, ids below 256; 256 is the documents' prefix token, and the vocabularies are padded past it),
and for each protocol (`sliding`, `hf_strided`, `lm_eval_rolling`) its windows as the reference
loops cut them (each a row of ids, the row position of its first scored target) with transformers'
float32 log-probabilities of every scored target. The reference loops are those of the Hugging
Face guide (hf_strided), the plain sliding loop, and lm-evaluation-harness's
`get_rolling_token_windows` + `make_disjoint_window` as HFLM scores them. Nothing here imports
ppl_jax; what the generators share is in common.py.

The traps each family covers are in `FAMILIES` (sliding windows of 8 shorter than the scored
windows of 24 targets, yarn and longrope past an original length of 16, a soft-cap that bites,
tied and untied embeddings, a padded vocabulary, SmolLM3's layers without rotary embedding).
tests/unit/models/test_families.py compares ppl_jax with these files;
tests/reference/test_families_live.py recomputes them live.
"""

from __future__ import annotations

import os
import sys

import torch
import transformers as tf

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
from common import DECODER, VOCAB, YARN, load, numbers  # noqa: E402 (tests/reference: load, numbers)

FAMILY_DIR = common.FAMILY_DIR


def _qwen3():
    # per-head QK-norm, head_dim 16 independent of 32 / 4, tied, yarn past 16 positions
    return tf.Qwen3ForCausalLM(
        tf.Qwen3Config(**DECODER, head_dim=16, tie_word_embeddings=True, rope_parameters=YARN)
    )


def _olmo2():
    return tf.Olmo2ForCausalLM(tf.Olmo2Config(**DECODER, tie_word_embeddings=False))


def _olmo3():
    # 4 layers: 3 sliding (window 8) and 1 full; default rope on sliding, yarn on full layers
    return tf.Olmo3ForCausalLM(
        tf.Olmo3Config(
            **{**DECODER, "num_hidden_layers": 4},
            sliding_window=8,
            rope_parameters={
                "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                "full_attention": {**YARN, "factor": 2.0, "rope_theta": 50000.0},
            },
        )
    )


def _gemma2():
    # alternating window 8 / global; soft-caps small enough to bite on these logits
    return tf.Gemma2ForCausalLM(
        tf.Gemma2Config(
            **DECODER,
            head_dim=16,
            query_pre_attn_scalar=12,
            sliding_window=8,
            attn_logit_softcapping=3.0,
            final_logit_softcapping=5.0,
        )
    )


GEMMA3_TEXT = dict(
    **{**DECODER, "num_hidden_layers": 3},
    head_dim=16,
    query_pre_attn_scalar=16,
    sliding_window=8,
    layer_types=["sliding_attention", "sliding_attention", "full_attention"],
    rope_parameters={
        "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
        "full_attention": {"rope_type": "linear", "rope_theta": 1000000.0, "factor": 8.0},
    },
)


def _gemma3():
    return tf.Gemma3ForCausalLM(tf.Gemma3TextConfig(**GEMMA3_TEXT))


def _gemma3_multimodal():
    # the text tower of a multimodal checkpoint: nested text_config, language_model. weights
    vision = dict(
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        image_size=32,
        patch_size=16,
    )
    config = tf.Gemma3Config(
        text_config=GEMMA3_TEXT,
        vision_config=vision,
        mm_tokens_per_image=4,
        image_token_index=VOCAB - 1,
        boi_token_index=VOCAB - 3,
        eoi_token_index=VOCAB - 2,
    )
    return tf.Gemma3ForConditionalGeneration(config)


def _gpt_neox():
    # parallel residual, rotary on 4 of 16 dims, per-head fused qkv, untied, padded vocabulary
    return tf.GPTNeoXForCausalLM(
        tf.GPTNeoXConfig(
            vocab_size=VOCAB,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            max_position_embeddings=64,
            initializer_range=0.2,
            rotary_pct=0.25,
        )
    )


def _phi3():
    # fused qkv_proj and gate_up_proj, longrope past 16 positions, half the dims rotary, a
    # sliding window of 8 on every layer
    half = 8 // 2  # rotary dims 8 of head_dim 16 -> 4 factors
    return tf.Phi3ForCausalLM(
        tf.Phi3Config(
            **{**DECODER, "num_attention_heads": 2, "num_key_value_heads": 1},
            original_max_position_embeddings=16,
            sliding_window=8,
            partial_rotary_factor=0.5,
            pad_token_id=0,
            bos_token_id=1,
            eos_token_id=2,
            rope_parameters={
                "rope_type": "longrope",
                "rope_theta": 10000.0,
                "short_factor": [1.0, 1.1, 1.3, 1.6][:half],
                "long_factor": [1.5, 2.5, 4.0, 7.0][:half],
            },
        )
    )


MOE = dict(**DECODER, num_experts_per_tok=2)


def _mixtral():
    return tf.MixtralForCausalLM(tf.MixtralConfig(**MOE, num_local_experts=4, sliding_window=8))


def _qwen2_moe():
    # a shared expert with its sigmoid gate; layer 0 dense by decoder_sparse_step=2
    return tf.Qwen2MoeForCausalLM(
        tf.Qwen2MoeConfig(
            **MOE,
            num_experts=4,
            moe_intermediate_size=16,
            shared_expert_intermediate_size=48,
            decoder_sparse_step=2,
            norm_topk_prob=False,
        )
    )


def _qwen3_moe():
    # layer 0 dense by mlp_only_layers; experts 1 and 2 identical (router rows and weights), so
    # that they tie on every token, at the top-k boundary on some
    model = tf.Qwen3MoeForCausalLM(
        tf.Qwen3MoeConfig(
            **MOE,
            num_experts=4,
            moe_intermediate_size=16,
            mlp_only_layers=[0],
            norm_topk_prob=True,
        )
    )
    moe = model.model.layers[1].mlp
    with torch.no_grad():
        for p in moe.parameters():
            if p.dim() >= 2 and p.shape[0] == 4:  # router [4, d] or stacked experts [4, ...]
                p[2] = p[1]
    return model


def _olmoe():
    return tf.OlmoeForCausalLM(
        tf.OlmoeConfig(
            **{**MOE, "intermediate_size": 16}, num_experts=4, pad_token_id=0, eos_token_id=2
        )
    )


def _smollm3():
    # 4 layers: NoPE on layers 1 and 3 (no_rope_layers 0), a window of 8 on layers 0 and 1, so
    # each of the four (rotary or not, windowed or not) is scored; biases on q, k, v and o
    return tf.SmolLM3ForCausalLM(
        tf.SmolLM3Config(
            **{**DECODER, "num_hidden_layers": 4},
            use_sliding_window=True,
            sliding_window=8,
            no_rope_layers=[1, 0, 1, 0],
            layer_types=["sliding_attention"] * 2 + ["full_attention"] * 2,
            attention_bias=True,
            pad_token_id=0,
            bos_token_id=1,
            eos_token_id=2,
        )
    )


FAMILIES = {
    "mixtral": _mixtral,
    "qwen2_moe": _qwen2_moe,
    "qwen3_moe": _qwen3_moe,
    "olmoe": _olmoe,
    "qwen3": _qwen3,
    "olmo2": _olmo2,
    "olmo3": _olmo3,
    "gemma2": _gemma2,
    "gemma3": _gemma3,
    "gemma3_multimodal": _gemma3_multimodal,
    "gpt_neox": _gpt_neox,
    "phi3": _phi3,
    "smollm3": _smollm3,
}


def save_family(name: str, path: str):
    return common.save_family(FAMILIES[name], path)


if __name__ == "__main__":
    common.main(
        FAMILIES,
        common.family_writer(save_family, lambda p: numbers(load(p))),
        FAMILY_DIR,
        models=True,
    )
