"""Writes tests/golden/frontier_layers/*.npz: transformers' own layers of GPT-OSS, Llama 4 and
DeepSeek-V3 on drawn weights, float32.

    python tests/golden/make_frontier_layers_golden.py
    python tests/golden/make_frontier_layers_golden.py --only deepseek_mla --out /tmp/layers

For each case of `CASES` one file (a few KB) with the module's weights under their transformers
names (`w:<state_dict key>`), its input `x [2, 24, embed]`, and what it computes:

- routed MLP blocks (`GptOssMLP`, `Llama4TextMoe`, `DeepseekV3MoE`): the output `y` and the
  router's chosen experts `experts [48, top_k]`. GPT-OSS's expert weights are drawn large enough
  that the clamp at 7 bites (the fraction is stored as `clamped`); DeepSeek's correction bias is
  drawn, so that it changes the choice.
- attention projections (`DeepseekV3Attention`, `Llama4TextAttention`): the query, key and value
  states the module hands to its attention function (`q`, `k [2, heads, 24, dim]`, `v`) and the
  softmax scale `scaling`, captured through a registered attention function; positions 0-23,
  past the rotary scalings' original length of 16.

Weights are those transformers' `_init_weights` draws (seed per case, `initializer_range` 0.2),
with the changes above. tests/slow/test_frontier_layers.py compares ppl_jax with these
files; tests/reference/test_frontier_layers_live.py reruns `run_case` with the installed
transformers.
"""

from __future__ import annotations

import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

OUT = os.path.join(common.HERE, "frontier_layers")
T = 24
COMMON = dict(hidden_size=16, initializer_range=0.2, rms_norm_eps=1e-5, max_position_embeddings=64)
YARN = {**common.YARN, "mscale": 1.0, "mscale_all_dim": 0.8}
DEEPSEEK_MOE = dict(
    n_routed_experts=8,
    n_group=4,
    topk_group=2,
    num_experts_per_tok=3,
    moe_intermediate_size=8,
    n_shared_experts=2,
    routed_scaling_factor=2.5,
    num_attention_heads=2,
)
MLA = dict(
    hidden_size=32,
    num_attention_heads=4,
    num_key_value_heads=4,
    q_lora_rank=16,
    kv_lora_rank=16,
    qk_rope_head_dim=8,
    qk_nope_head_dim=8,
    v_head_dim=12,
)
LLAMA4 = dict(
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=8,
    num_hidden_layers=4,
    attention_chunk_size=8,
    floor_scale=4,
    attn_scale=0.25,
    rope_parameters=common.LLAMA3,
)

# name -> (model type, what, config overrides)
CASES = {
    "gpt_oss_mlp": (
        "gpt_oss",
        "mlp",
        dict(
            num_local_experts=6,
            num_experts_per_tok=3,
            intermediate_size=8,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        ),
    ),
    "llama4_moe": ("llama4_text", "mlp", dict(num_local_experts=4, intermediate_size=8)),
    "llama4_moe_top2": (
        "llama4_text",
        "mlp",
        dict(num_local_experts=4, intermediate_size=8, num_experts_per_tok=2),
    ),
    "deepseek_moe": ("deepseek_v3", "mlp", DEEPSEEK_MOE),
    "deepseek_moe_unnormalised": (
        "deepseek_v3",
        "mlp",
        {**DEEPSEEK_MOE, "norm_topk_prob": False, "n_group": 2, "topk_group": 1},
    ),
    "deepseek_mla": ("deepseek_v3", "attention", {**MLA, "rope_parameters": YARN}),
    "deepseek_mla_plain": (
        "deepseek_v3",
        "attention",
        {**MLA, "q_lora_rank": None, "rope_interleave": False, "attention_bias": True},
    ),
    "llama4_attention_rope": ("llama4_text", "attention", {**LLAMA4, "layer": 0}),
    "llama4_attention_nope": ("llama4_text", "attention", {**LLAMA4, "layer": 3}),
}


def _config(model_type: str, overrides: dict):
    from transformers import AutoConfig

    kwargs = {**COMMON, **{k: v for k, v in overrides.items() if k != "layer"}}
    config = AutoConfig.for_model(model_type, **kwargs)
    config._experts_implementation = "eager"
    return config


def _module(model_type: str, what: str, config, layer: int):
    from transformers.models.deepseek_v3 import modeling_deepseek_v3 as ds
    from transformers.models.gpt_oss import modeling_gpt_oss as go
    from transformers.models.llama4 import modeling_llama4 as l4

    if what == "mlp":
        cls = {
            "gpt_oss": go.GptOssMLP,
            "llama4_text": l4.Llama4TextMoe,
            "deepseek_v3": ds.DeepseekV3MoE,
        }
        return cls[model_type](config)
    cls = {"llama4_text": l4.Llama4TextAttention, "deepseek_v3": ds.DeepseekV3Attention}
    return cls[model_type](config, layer)


def _init(module, model_type, config):
    """transformers' `_init_weights` on every submodule."""
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3PreTrainedModel
    from transformers.models.gpt_oss.modeling_gpt_oss import GptOssPreTrainedModel
    from transformers.models.llama4.modeling_llama4 import Llama4PreTrainedModel

    pretrained = {
        "gpt_oss": GptOssPreTrainedModel,
        "llama4_text": Llama4PreTrainedModel,
        "deepseek_v3": DeepseekV3PreTrainedModel,
    }[model_type]
    holder = pretrained.__new__(pretrained)
    holder.config = config
    for m in module.modules():
        pretrained._init_weights(holder, m)


def run_case(name: str) -> dict[str, np.ndarray]:
    """The case's weights, input and transformers' outputs (see the module docstring)."""
    import torch
    from transformers import AttentionInterface
    from transformers.models.deepseek_v3 import modeling_deepseek_v3 as ds
    from transformers.models.llama4 import modeling_llama4 as l4

    model_type, what, overrides = CASES[name]
    torch.manual_seed(sorted(CASES).index(name))
    config = _config(model_type, overrides)
    module = _module(model_type, what, config, overrides.get("layer", 0))
    _init(module, model_type, config)
    common.perturbed(module)
    with torch.no_grad():
        if model_type == "gpt_oss":
            module.experts.gate_up_proj.mul_(6.0)
            module.experts.gate_up_proj_bias.normal_(0.0, 0.5)
            module.experts.down_proj_bias.normal_(0.0, 0.2)
        if model_type == "deepseek_v3" and what == "mlp":
            module.gate.e_score_correction_bias.normal_(0.0, 0.3)
    x = torch.randn(2, T, config.hidden_size)
    out = {f"w:{k}": v.detach().numpy().copy() for k, v in module.state_dict().items()}
    out["x"] = x.numpy()
    with torch.no_grad():
        if what == "mlp":
            chosen = []
            router = module.router if model_type != "deepseek_v3" else module.gate
            hook = router.register_forward_hook(lambda m, i, o: chosen.append(o))
            clamped = []
            if model_type == "gpt_oss":
                apply_gate = module.experts._apply_gate

                def record(gate_up):
                    g, u = gate_up[..., ::2], gate_up[..., 1::2]
                    clamped.append(float(((g > 7) | (u.abs() > 7)).float().mean()))
                    return apply_gate(gate_up)

                module.experts._apply_gate = record
            y = module(x)
            hook.remove()
            y = y[0] if isinstance(y, tuple) else y
            out["y"] = y.numpy()
            if model_type == "gpt_oss":
                out["experts"] = chosen[0][2].numpy()
                out["clamped"] = np.asarray(np.mean(clamped), np.float32)
            elif model_type == "llama4_text":
                scores = chosen[0][0]
                out["experts"] = torch.topk(scores, config.num_experts_per_tok, dim=1)[1].numpy()
            else:
                out["experts"] = chosen[0][2].numpy()
            return out
        captured = {}

        def capture(module_, query, key, value, attention_mask, scaling, **kwargs):
            captured.update(q=query, k=key, v=value, scaling=scaling)
            b, h, t, _ = query.shape
            return query.new_zeros(b, t, h, value.shape[-1]), None

        AttentionInterface.register("frontier_capture", capture)
        config._attn_implementation = "frontier_capture"
        positions = torch.arange(T)[None].expand(2, T)
        if model_type == "deepseek_v3":
            embeddings = ds.DeepseekV3RotaryEmbedding(config)(x, positions)
        else:
            embeddings = l4.Llama4TextRotaryEmbedding(config)(x, positions)
        module(hidden_states=x, position_embeddings=embeddings, attention_mask=None)
    out.update({k: captured[k].numpy() for k in ("q", "k", "v")})
    out["scaling"] = np.asarray(captured["scaling"], np.float64)
    out["positions"] = positions.numpy().astype(np.int32)
    return out


if __name__ == "__main__":
    common.main(CASES, common.arrays_writer(run_case), OUT)
