"""Writes tests/golden/moe/*.npz: transformers' own MoE blocks on random weights, float32.

    python tests/golden/make_moe_golden.py
    python tests/golden/make_moe_golden.py --only mixtral --out /tmp/moe

For each case of `CASES` one file (a few KB) with the block's weights in transformers' layout
(`gate.weight [experts, embed]`, `experts.gate_up_proj [experts, 2 * mlp, embed]` (gate rows
first), `experts.down_proj [experts, embed, mlp]`; Qwen2-MoE's `shared_expert.{gate,up,down}_proj`
and `shared_expert_gate.weight [1, embed]`), the input `x [2, 12, embed]`, the block's output `y`
and the router's chosen experts `experts [24, top_k]` (transformers' `*TopKRouter`). Weights are
drawn with NumPy (seed per case), not by transformers' initialisation.

Two cases tie: `tie_inside` gives experts 2 and 5 the same router row and pushes every token
towards it, so the tied pair is the top 2 of every token; `tie_boundary` gives them the same row
without the push, so for some tokens the pair straddles the k-th place, where torch.topk on CPU
picks one of the two by its internal selection order (see `ppl_jax.models.layers.moe.dropless`).

tests/unit/models/test_moe.py compares ppl_jax with these files; tests/reference/test_moe_live.py
reruns `run_case` with the installed transformers.
"""

from __future__ import annotations

import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

OUT = os.path.join(common.HERE, "moe")
EMBED, MLP, SHARED = 16, 24, 20

# name -> (model type, experts, top_k, norm_topk_prob, tie: None, "inside" or "boundary")
CASES = {
    "mixtral": ("mixtral", 8, 2, True, None),
    "qwen2_moe": ("qwen2_moe", 16, 4, False, None),
    "qwen3_moe": ("qwen3_moe", 32, 8, True, None),
    "qwen3_moe_unnormalised": ("qwen3_moe", 32, 8, False, None),
    "olmoe": ("olmoe", 16, 4, False, None),
    "tie_inside": ("mixtral", 8, 2, True, "inside"),
    "tie_boundary": ("qwen3_moe", 8, 3, True, "boundary"),
}


def case_arrays(name: str) -> dict[str, np.ndarray]:
    """The weights and input of a case, float32, in transformers' layout."""
    model_type, experts, _, _, tie = CASES[name]
    rng = np.random.default_rng(sorted(CASES).index(name))
    draw = lambda *shape, s: (rng.standard_normal(shape) * s).astype(np.float32)  # noqa: E731
    a = {
        "router": draw(experts, EMBED, s=0.5),
        "gate_up_proj": draw(experts, 2 * MLP, EMBED, s=EMBED**-0.5),
        "down_proj": draw(experts, EMBED, MLP, s=MLP**-0.5),
        "x": draw(2, 12, EMBED, s=1.0),
    }
    if tie:
        a["router"][5] = a["router"][2]
    if tie == "inside":
        a["router"][2] *= 4.0
        a["router"][5] = a["router"][2]
        direction = a["router"][2] / np.linalg.norm(a["router"][2])
        a["x"] += (4.0 * direction).astype(np.float32)
    if model_type == "qwen2_moe":
        a["shared_gate_proj"] = draw(SHARED, EMBED, s=EMBED**-0.5)
        a["shared_up_proj"] = draw(SHARED, EMBED, s=EMBED**-0.5)
        a["shared_down_proj"] = draw(EMBED, SHARED, s=SHARED**-0.5)
        a["shared_expert_gate"] = draw(1, EMBED, s=EMBED**-0.5)
    return a


def run_case(name: str) -> dict[str, np.ndarray]:
    """`case_arrays` plus transformers' `y` and `experts`, from its `*SparseMoeBlock`."""
    import torch
    from transformers import MixtralConfig, OlmoeConfig, Qwen2MoeConfig, Qwen3MoeConfig
    from transformers.models.mixtral.modeling_mixtral import MixtralSparseMoeBlock
    from transformers.models.olmoe.modeling_olmoe import OlmoeSparseMoeBlock
    from transformers.models.qwen2_moe.modeling_qwen2_moe import Qwen2MoeSparseMoeBlock
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock

    model_type, experts, top_k, norm, _ = CASES[name]
    a = case_arrays(name)
    common = dict(hidden_size=EMBED, num_experts_per_tok=top_k, hidden_act="silu")
    if model_type == "mixtral":
        block = MixtralSparseMoeBlock(
            MixtralConfig(intermediate_size=MLP, num_local_experts=experts, **common)
        )
    elif model_type == "olmoe":
        config = OlmoeConfig(
            intermediate_size=MLP, num_experts=experts, norm_topk_prob=norm, **common
        )
        block = OlmoeSparseMoeBlock(config)
    else:
        config_class, block_class = {
            "qwen2_moe": (Qwen2MoeConfig, Qwen2MoeSparseMoeBlock),
            "qwen3_moe": (Qwen3MoeConfig, Qwen3MoeSparseMoeBlock),
        }[model_type]
        extra = {"shared_expert_intermediate_size": SHARED} if model_type == "qwen2_moe" else {}
        config = config_class(
            moe_intermediate_size=MLP, num_experts=experts, norm_topk_prob=norm, **common, **extra
        )
        block = block_class(config)
    block.eval()
    t = lambda v: torch.from_numpy(np.ascontiguousarray(v))  # noqa: E731
    with torch.no_grad():
        block.gate.weight.copy_(t(a["router"]))
        block.experts.gate_up_proj.copy_(t(a["gate_up_proj"]))
        block.experts.down_proj.copy_(t(a["down_proj"]))
        if model_type == "qwen2_moe":
            block.shared_expert.gate_proj.weight.copy_(t(a["shared_gate_proj"]))
            block.shared_expert.up_proj.weight.copy_(t(a["shared_up_proj"]))
            block.shared_expert.down_proj.weight.copy_(t(a["shared_down_proj"]))
            block.shared_expert_gate.weight.copy_(t(a["shared_expert_gate"]))
        x = t(a["x"])
        y = block(x)
        _, _, chosen = block.gate(x.reshape(-1, EMBED))
    return {
        **a,
        "y": y.numpy(),
        "experts": chosen.numpy().astype(np.int32),
        "top_k": np.int32(top_k),
        "norm_topk_prob": np.bool_(norm),
    }


if __name__ == "__main__":
    common.main(CASES, common.arrays_writer(run_case, compressed=True), OUT)
