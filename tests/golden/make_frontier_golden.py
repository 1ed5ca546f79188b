"""Writes the golden files of GPT-OSS, Llama 4 (text) and DeepSeek-V3 (issue 24) by running
transformers itself, as tests/golden/make_family_golden.py does for the families before them
(with the same helpers, in common.py: the documents, the protocols' reference windows, the 1-D
weight perturbation and the numbers).

    python tests/golden/make_frontier_golden.py                 # rebuilds the models and numbers
    python tests/golden/make_frontier_golden.py --numbers-only  # keeps the committed models
    python tests/golden/make_frontier_golden.py --only gpt_oss --out /tmp/families

Each family of `FAMILIES` gets `tests/golden/families/<name>/` (`OUT`, where
tests/unit/models/test_families.py finds them; `<name>` is the ppl_jax family that reads it): a
tiny random transformers 5 model (seed 0, 1-D weights perturbed, and the weights named below drawn
so that their feature bites) as `save_pretrained` writes it, and `golden.json` with transformers'
float32 log-probabilities of every scored target of the `sliding`, `hf_strided` and
`lm_eval_rolling` windows (24 inputs each). What each exercises inside the scored windows:

- `gpt_oss` (`GptOssForCausalLM`): learned attention sinks (drawn N(0, 1)); a sliding window of 8
  on layers 0 and 2, full attention on 1 and 3; q/k/v/o biases; 6 experts, 3 chosen, softmax over
  the chosen router logits (router bias); expert biases; the clamped SwiGLU (alpha 1.702, limit
  7) with the experts' gate-and-up weights scaled so that about a tenth of the pre-activations
  pass the limit; YaRN (factor 4, no truncation) past an original length of 16; untied.
- `llama4` (`Llama4ForCausalLM`, model type `llama4_text`): layers 0-2 rotary (interleaved pairs,
  llama3 scaling past an original length of 16) with chunked attention of 8 and L2 QK-norm, layer
  3 NoPE with attention temperature tuning (`floor_scale` 4, `attn_scale` 0.25, so that the scale
  grows inside the window); MoE on layers 1 and 3 (`interleave_moe_layer_step` 2): 4 experts, a
  sigmoid top-1 router scaling the expert's input, a shared expert; dense MLPs of
  `intermediate_size_mlp` on 0 and 2; untied.
- `deepseek_v3` (`DeepseekV3ForCausalLM`): multi-head latent attention (`q_lora_rank` 16,
  `kv_lora_rank` 16, rotary head dims 8 interleaved, non-rotary 8, `v_head_dim` 12 != 16);
  layer 0 dense (`first_k_dense_replace` 1), layers 1-2 MoE: 8 experts in 4 groups, the best 2
  groups kept (`topk_group`), 3 experts chosen by sigmoid scores plus a drawn
  `e_score_correction_bias`, weights renormalised and times `routed_scaling_factor` 2.5, a shared
  expert; YaRN (factor 4 past 16, `mscale` 1, `mscale_all_dim` 0.8: cos/sin and the softmax
  scale both change); `num_nextn_predict_layers` 1, and the safetensors file carries tensors of
  a multi-token-prediction layer `model.layers.3.*` (as the published checkpoints do at 61)
  that transformers does not load and ppl_jax must ignore.

tests/unit/models/test_families.py compares ppl_jax with these files; the live check
tests/reference/test_frontier_live.py recomputes the numbers from the committed models.
"""

from __future__ import annotations

import json
import os
import sys

import torch
import transformers as tf

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
from common import GQA, LLAMA3, TINY, YARN  # noqa: E402

OUT = common.FAMILY_DIR
SMALL = dict(**TINY, **GQA)


def _gpt_oss():
    model = tf.GptOssForCausalLM(
        tf.GptOssConfig(
            **SMALL,
            num_hidden_layers=4,
            head_dim=16,
            intermediate_size=16,
            num_local_experts=6,
            num_experts_per_tok=3,
            sliding_window=8,
            rope_parameters={**YARN, "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False},
        )
    )
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.sinks.normal_(0.0, 1.0)
            experts = layer.mlp.experts
            experts.gate_up_proj.mul_(4.0)  # pre-activations past the clamp at 7
            experts.gate_up_proj_bias.normal_(0.0, 0.5)
            experts.down_proj_bias.normal_(0.0, 0.2)
    return model


def _llama4_text():
    return tf.Llama4ForCausalLM(
        tf.Llama4TextConfig(
            **SMALL,
            num_hidden_layers=4,
            head_dim=16,
            intermediate_size=16,
            intermediate_size_mlp=64,
            num_local_experts=4,
            num_experts_per_tok=1,
            interleave_moe_layer_step=2,
            attention_chunk_size=8,
            no_rope_layer_interval=4,
            use_qk_norm=True,
            attn_temperature_tuning=True,
            floor_scale=4,
            attn_scale=0.25,
            rope_parameters=LLAMA3,
        )
    )


def _deepseek_v3():
    model = tf.DeepseekV3ForCausalLM(
        tf.DeepseekV3Config(
            **{**SMALL, "num_key_value_heads": 4},
            num_hidden_layers=3,
            intermediate_size=64,
            moe_intermediate_size=16,
            q_lora_rank=16,
            kv_lora_rank=16,
            qk_rope_head_dim=8,
            qk_nope_head_dim=8,
            v_head_dim=12,
            n_routed_experts=8,
            n_group=4,
            topk_group=2,
            num_experts_per_tok=3,
            routed_scaling_factor=2.5,
            n_shared_experts=1,
            first_k_dense_replace=1,
            norm_topk_prob=True,
            rope_interleave=True,
            num_nextn_predict_layers=1,
            rope_parameters={
                **YARN,
                "beta_fast": 32.0,
                "beta_slow": 1.0,
                "mscale": 1.0,
                "mscale_all_dim": 0.8,
            },
        )
    )
    with torch.no_grad():
        for layer in model.model.layers[1:]:
            layer.mlp.gate.e_score_correction_bias.normal_(0.0, 0.3)
    return model


FAMILIES = {"gpt_oss": _gpt_oss, "llama4": _llama4_text, "deepseek_v3": _deepseek_v3}


def _add_mtp_layer(path: str) -> None:
    """Appends to DeepSeek-V3's safetensors the tensors of a multi-token-prediction layer
    (`model.layers.<num_hidden_layers>.*`, names as in the published checkpoints' layer 61),
    which transformers' DeepseekV3ForCausalLM does not load."""
    from safetensors.torch import load_file, save_file

    file = os.path.join(path, "model.safetensors")
    tensors = load_file(file)
    with open(os.path.join(path, "config.json"), encoding="utf-8") as f:
        c = json.load(f)
    n, d = c["num_hidden_layers"], c["hidden_size"]
    g = torch.Generator().manual_seed(1)
    for name, shape in (
        ("enorm.weight", (d,)),
        ("hnorm.weight", (d,)),
        ("eh_proj.weight", (d, 2 * d)),
        ("input_layernorm.weight", (d,)),
        ("self_attn.kv_a_proj_with_mqa.weight", (c["kv_lora_rank"] + c["qk_rope_head_dim"], d)),
        ("shared_head.norm.weight", (d,)),
        ("shared_head.head.weight", (c["vocab_size"], d)),
    ):
        tensors[f"model.layers.{n}.{name}"] = torch.randn(shape, generator=g)
    save_file(tensors, file, metadata={"format": "pt"})


def save(name: str, path: str):
    model = common.save_family(FAMILIES[name], path)
    if name == "deepseek_v3":
        _add_mtp_layer(path)
    return model


if __name__ == "__main__":
    common.main(
        FAMILIES,
        common.family_writer(save, lambda p: common.numbers(common.load(p))),
        OUT,
        models=True,
    )
