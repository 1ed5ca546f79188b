"""Writes tests/golden/scans/*.npz: transformers' own state-carrying layers (their PyTorch
fallbacks, float32) on random weights.

    python tests/golden/make_scan_golden.py
    python tests/golden/make_scan_golden.py --only mamba2 --out /tmp/scans

For each case of `CASES` one file (a few KB) with the layer's weights under transformers' own
parameter names (`in_proj_qkv.weight`, `conv1d.weight`, `A_log`, ...; Qwen3-Next's interleaved
`in_proj_qkvz.weight` and `in_proj_ba.weight`; Mamba2's fused `in_proj.weight`), the config
fields that shape it (`config/<name>`), the input `x [2, T, hidden]` and the layer's output `y`.
Weights are drawn with NumPy (seed per case), not by transformers' initialisation, so that the
decays, steps and norms are far from their initial values. T (70) spans two of the gated delta
rule's chunks of 64 and nine of the Mamba2 cases' chunks of 8.

- `qwen3_5`: `Qwen3_5GatedDeltaNet` (2 key heads of 8, 4 value heads of 6: grouped values).
- `qwen3_next`: `Qwen3NextGatedDeltaNet` (the same shape, its per-key-head interleaved
  projections).
- `mamba2`: `Mamba2Mixer` (8 heads of 4 in 2 groups, state 6, conv 4, chunks of 8, a dt clamp).
- `nemotron_h`: `NemotronHMamba2Mixer` (dt clamped below at `time_step_min`, no conv bias).
- `falcon_h1`: `FalconH1Mixer` with its multipliers and the gated norm applied first.
- `falcon_h1_plain`: `FalconH1Mixer` without the gated norm (`y * silu(z)`).

tests/slow/test_scan_layers.py compares ppl_jax's layers with these files;
tests/reference/test_scans_live.py reruns `run_case` with the installed transformers.
"""

from __future__ import annotations

import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

OUT = os.path.join(common.HERE, "scans")
HIDDEN, T = 16, 70

GDN = {
    **common.GDN,
    "linear_value_head_dim": 6,
    "hidden_size": HIDDEN,
    "rms_norm_eps": 1e-6,
    "num_hidden_layers": 1,
    "layer_types": ["linear_attention"],
}
MAMBA = dict(**common.MAMBA, hidden_size=HIDDEN)
FALCON = dict(
    **common.FALCON_MAMBA,
    hidden_size=HIDDEN,
    mamba_d_state=6,
    num_hidden_layers=1,
    num_attention_heads=4,
    num_key_value_heads=2,
    rms_norm_eps=1e-5,
)
CASES = {
    "qwen3_5": ("qwen3_5", GDN),
    "qwen3_next": ("qwen3_next", GDN),
    "mamba2": (
        "mamba2",
        dict(
            **MAMBA,
            expand=2,
            num_heads=8,
            head_dim=4,
            state_size=6,
            num_hidden_layers=1,
            layer_norm_epsilon=1e-5,
            time_step_limit=(0.0, 1.5),
        ),
    ),
    "nemotron_h": (
        "nemotron_h",
        dict(
            **MAMBA,
            mamba_num_heads=8,
            mamba_head_dim=4,
            ssm_state_size=6,
            layers_block_type=["linear_attention"],
            layer_norm_epsilon=1e-5,
            time_step_min=0.2,
            use_conv_bias=False,
        ),
    ),
    "falcon_h1": (
        "falcon_h1",
        dict(
            **FALCON,
            mamba_rms_norm=True,
            mamba_norm_before_gate=True,
            ssm_multipliers=common.SSM_MULTIPLIERS,
            ssm_in_multiplier=0.7,
        ),
    ),
    "falcon_h1_plain": ("falcon_h1", dict(**FALCON, mamba_rms_norm=False)),
}


def _draw(rng, name: str, shape: tuple[int, ...]) -> np.ndarray:
    """A value for the parameter `name`: decays and steps in the ranges trained models have,
    norms near 1, projections of unit gain."""
    if name.endswith("A_log"):
        return np.log(rng.uniform(0.5, 6.0, shape))
    if name.endswith("dt_bias"):
        return rng.uniform(-2.5, 0.5, shape)
    if name.endswith(".D") or name == "D":
        return rng.normal(1.0, 0.5, shape)
    if name.startswith("norm."):
        return rng.normal(1.0, 0.3, shape)
    if name.startswith("conv1d."):
        return rng.normal(0.0, 0.5, shape)
    fan_in = shape[-1] if len(shape) > 1 else 1
    return rng.normal(0.0, fan_in**-0.5, shape)


def _layer(model_type: str, fields: dict):
    from transformers import FalconH1Config, Mamba2Config, NemotronHConfig, Qwen3NextConfig
    from transformers.models.falcon_h1.modeling_falcon_h1 import (
        FalconH1Mixer,
        compute_mup_vector,
    )
    from transformers.models.mamba2.modeling_mamba2 import Mamba2Mixer
    from transformers.models.nemotron_h.modeling_nemotron_h import NemotronHMamba2Mixer
    from transformers.models.qwen3_5.configuration_qwen3_5 import Qwen3_5TextConfig
    from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5GatedDeltaNet
    from transformers.models.qwen3_next.modeling_qwen3_next import Qwen3NextGatedDeltaNet

    if model_type == "qwen3_5":
        return Qwen3_5GatedDeltaNet(Qwen3_5TextConfig(**fields), 0)
    if model_type == "qwen3_next":
        return Qwen3NextGatedDeltaNet(Qwen3NextConfig(**fields), 0)
    if model_type == "mamba2":
        return Mamba2Mixer(Mamba2Config(**fields), 0)
    if model_type == "nemotron_h":
        return NemotronHMamba2Mixer(NemotronHConfig(**fields), 0)
    config = FalconH1Config(**fields)
    layer = FalconH1Mixer(config, 0)
    layer.register_buffer("mup_vector", compute_mup_vector(config), persistent=False)
    return layer


def config_arrays(name: str) -> dict[str, np.ndarray]:
    """The case's config fields as `config/<field>` arrays (lists as arrays)."""
    _, fields = CASES[name]
    return {
        f"config/{k}": np.asarray(v)
        for k, v in fields.items()
        if not isinstance(v, list) or all(isinstance(e, (int, float)) for e in v)
    }


def run_case(name: str) -> dict[str, np.ndarray]:
    """The case's weights (transformers' names), config, input `x` and transformers' output
    `y`, float32."""
    import torch

    model_type, fields = CASES[name]
    torch.manual_seed(0)
    layer = _layer(model_type, fields).eval()
    rng = np.random.default_rng(sorted(CASES).index(name))
    weights = {}
    with torch.no_grad():
        for pname, p in layer.named_parameters():
            value = _draw(rng, pname, tuple(p.shape)).astype(np.float32)
            p.copy_(torch.from_numpy(value))
            weights[pname] = value
        x = rng.standard_normal((2, T, HIDDEN)).astype(np.float32)
        y = layer(torch.from_numpy(x))
    return {**weights, **config_arrays(name), "x": x, "y": y.numpy()}


if __name__ == "__main__":
    common.main(CASES, common.arrays_writer(run_case, compressed=True), OUT)
