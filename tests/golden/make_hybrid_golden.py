"""Writes the golden files of the hybrid families (issue 24: Gated DeltaNet and Mamba2 layers) by
running transformers itself, as tests/golden/make_family_golden.py does for the softmax-attention
families (with the same helpers, in common.py: the documents, the protocols' reference windows,
the 1-D weight perturbation and the numbers).

    python tests/golden/make_hybrid_golden.py                 # rebuilds the models and numbers
    python tests/golden/make_hybrid_golden.py --numbers-only  # keeps the committed models
    python tests/golden/make_hybrid_golden.py --only mamba2 --out /tmp/families

Each family of `FAMILIES` gets `tests/golden/families/<name>/` (`OUT`, where
tests/unit/models/test_families.py finds it by itself): a tiny random transformers 5 model
(seed 0, 1-D weights perturbed) as `save_pretrained` writes it, and `golden.json` with
transformers' float32 log-probabilities of every scored target of the `sliding`, `hf_strided` and
`lm_eval_rolling` windows (24 inputs each), and in float64 (`log_probs_float64`, to show the
float32 numbers' own rounding). transformers runs its PyTorch fallbacks of the scans
(`torch_chunk_gated_delta_rule`, `mamba2_chunk_scan`, `causal_conv1d_fn`). What each exercises
inside the scored windows:

- `qwen3_5` (`Qwen3_5ForCausalLM`, the text model): 3 Gated DeltaNet layers then a gated
  full-attention layer (`full_attention_interval` 4), 2 key heads serving 4 value heads, conv
  width 4; the attention's query-and-gate projection, per-head QK-norm, partial rotary (4 of 16
  dims), the `(1 + w)` RMSNorms; tied embeddings; decays drawn milder than at initialisation
  (`_milder_decays`).
- `qwen3_next`: the same layers with Qwen3-Next's interleaved projections, and a mixture of 8
  experts (3 chosen, renormalised) with a gated shared expert on layers 0, 2 and 3 (layer 1 dense,
  `mlp_only_layers`); untied.
- `mamba2`: 2 Mamba2 layers (8 heads of 8 in 2 groups, state 8, conv 4, chunks of 8 < 24, dt
  clamped to [0.01, 0.05], both bounds biting), tied.
- `nemotron_h`: the pattern `M E * - M`: Mamba2 (dt clamped below at `time_step_min` 0.05),
  sigmoid-routed MoE of squared-ReLU experts (3 of 8, group-limited to 1 of 2 groups, the
  correction bias, `routed_scaling_factor` 2.5, a latent projection, a shared expert),
  attention without rotary embeddings, a squared-ReLU MLP.
- `falcon_h1`: 2 layers of attention and Mamba2 in parallel, every multiplier away from 1
  (embedding, LM head, key, attention in/out, SSM in/out, the 5 `ssm_multipliers`, the 2
  `mlp_multipliers`), the gated RMSNorm applied before the gate.

tests/unit/models/test_families.py compares ppl_jax with these files;
tests/reference/test_families_live.py recomputes them live.
"""

from __future__ import annotations

import math
import os
import sys

import torch
import transformers as tf

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
from common import GDN, MAMBA, TINY  # noqa: E402

OUT = common.FAMILY_DIR
SMALL = dict(**TINY, intermediate_size=64)
QWEN_ATTENTION = dict(
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    rms_norm_eps=1e-6,
    rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25},
)


def _milder_decays(model):
    """Gated DeltaNet decays `A = exp(A_log)` drawn from [0.02, 1] rather than the
    initialisation's [0.01, 16]. With the strong decays the state restarts at almost every token,
    each head's output is one term `beta v (q . k)`, and the gated norm scales it to unit size
    whatever its rounding: transformers' own float32 log-probabilities then depart from its
    float64 ones by up to 1.6e-5 per token (measured on these models), beyond the 1e-5 a
    comparison with them can resolve. With [0.02, 1] that departure is at most 3.9e-6."""
    with torch.no_grad():
        for layer in model.model.layers:
            if hasattr(layer, "linear_attn"):
                layer.linear_attn.A_log.uniform_(math.log(0.02), math.log(1.0))
    return model


def _qwen3_5():
    config = tf.Qwen3_5TextConfig(**SMALL, **GDN, **QWEN_ATTENTION, tie_word_embeddings=True)
    return _milder_decays(tf.Qwen3_5ForCausalLM(config))


def _qwen3_next():
    config = tf.Qwen3NextConfig(
        **SMALL,
        **GDN,
        **QWEN_ATTENTION,
        num_experts=8,
        num_experts_per_tok=3,
        moe_intermediate_size=16,
        shared_expert_intermediate_size=24,
        mlp_only_layers=[1],
        norm_topk_prob=True,
        tie_word_embeddings=False,
    )
    return _milder_decays(tf.Qwen3NextForCausalLM(config))


def _mamba2():
    config = tf.Mamba2Config(
        **{**SMALL, "initializer_range": 0.1},
        **MAMBA,
        num_hidden_layers=2,
        expand=2,
        num_heads=8,
        head_dim=8,
        state_size=8,
        time_step_limit=(0.01, 0.05),
        tie_word_embeddings=True,
    )
    return tf.Mamba2ForCausalLM(config)


def _nemotron_h():
    config = tf.NemotronHConfig(
        **SMALL,
        **MAMBA,
        layers_block_type=["linear_attention", "moe", "full_attention", "mlp", "linear_attention"],
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        mamba_num_heads=8,
        mamba_head_dim=4,
        ssm_state_size=8,
        time_step_min=0.05,
        n_routed_experts=8,
        num_experts_per_tok=3,
        moe_intermediate_size=16,
        moe_shared_expert_intermediate_size=24,
        moe_latent_size=16,
        n_group=2,
        topk_group=1,
        routed_scaling_factor=2.5,
        norm_topk_prob=True,
        layer_norm_epsilon=1e-5,
    )
    model = tf.NemotronHForCausalLM(config)
    with torch.no_grad():  # the correction bias is a buffer: give it values that change choices
        for layer in model.model.layers:
            if layer.block_type == "moe":
                layer.mixer.gate.e_score_correction_bias.normal_(0.0, 0.3)
    return model


def _falcon_h1():
    config = tf.FalconH1Config(
        **SMALL,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        **common.FALCON_MAMBA,
        mamba_d_state=8,
        mamba_rms_norm=True,
        mamba_norm_before_gate=True,
        rms_norm_eps=1e-5,
        embedding_multiplier=2.0,
        lm_head_multiplier=0.5,
        mlp_multipliers=[1.5, 0.7],
        key_multiplier=1.3,
        attention_in_multiplier=0.8,
        attention_out_multiplier=1.2,
        ssm_multipliers=common.SSM_MULTIPLIERS,
        ssm_in_multiplier=0.7,
        ssm_out_multiplier=1.1,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        tie_word_embeddings=False,
    )
    return tf.FalconH1ForCausalLM(config)


FAMILIES = {
    "qwen3_5": _qwen3_5,
    "qwen3_next": _qwen3_next,
    "mamba2": _mamba2,
    "nemotron_h": _nemotron_h,
    "falcon_h1": _falcon_h1,
}


def save_family(name: str, path: str):
    return common.save_family(FAMILIES[name], path)


def load(path: str, dtype=torch.float32):
    return common.load(path, dtype, experts_implementation="eager")


def numbers(path: str) -> dict:
    """`common.numbers` (transformers in float32), and each window's `log_probs_float64`: the
    same model run in float64, the float32 numbers' own error."""
    out = common.numbers(load(path))
    model = load(path, torch.float64)
    for windows in out["protocols"].values():
        for w in windows:
            w["log_probs_float64"] = common.row_log_probs(model, w["row"], w["first"]).tolist()
    return out


if __name__ == "__main__":
    common.main(FAMILIES, common.family_writer(save_family, numbers), OUT, models=True)
