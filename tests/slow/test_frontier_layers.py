"""The layers of GPT-OSS, Llama 4 and DeepSeek-V3 against transformers' own torch modules
(`GptOssMLP`, `Llama4TextMoe`, `DeepseekV3MoE`, `DeepseekV3Attention`, `Llama4TextAttention`) on
the weights stored in tests/golden/frontier_layers/ by tests/golden/make_frontier_layers_golden.py
(tests/reference/test_frontier_layers_live.py reruns them live): the routed MLP blocks
(`ppl_jax.models.layers.moe.routing`, on `ppl_jax.models.layers.moe.experts`), the latent
attention's projections (`ppl_jax.models.layers.mla`), and Llama 4's rotation of pairs, L2 QK-norm
and temperature tuning (`ppl_jax.models.layers.qk`). Each feature turned off moves the result past
the tolerance."""

from __future__ import annotations

import dataclasses
import functools
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from ppl_jax.models.decoders.llama import LlamaConfig
from ppl_jax.models.layers import mla, qk
from ppl_jax.models.layers import rope as rope_lib
from ppl_jax.models.layers.moe import experts, routing

import helpers

GOLDEN = os.path.join(helpers.GOLDEN, "frontier_layers")


@functools.cache
def golden(name: str) -> dict[str, np.ndarray]:
    with np.load(os.path.join(GOLDEN, f"{name}.npz")) as z:
        return {k: z[k] for k in z.files}


def rel_diff(a, b) -> float:
    """max |a - b| / max |b|."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.max(np.abs(a - b)) / np.max(np.abs(b)))


def routed_params(name: str) -> tuple[routing.RoutedSpec, dict[str, np.ndarray]]:
    """A routed MLP case's spec and `RoutedMLP` params from transformers' weights."""
    w = {k[2:]: v for k, v in golden(name).items() if k.startswith("w:")}
    if name.startswith("gpt_oss"):
        gate_up, bias = w["experts.gate_up_proj"], w["experts.gate_up_proj_bias"]  # interleaved
        e, d, f = gate_up.shape[0], gate_up.shape[1], gate_up.shape[2] // 2
        spec = routing.RoutedSpec("softmax_of_chosen", d, f, e, top_k=3)
        return spec, {
            "router": w["router.weight"].T,
            "router_bias": w["router.bias"],
            "gate": gate_up[..., ::2],
            "up": gate_up[..., 1::2],
            "down": w["experts.down_proj"],
            "gate_bias": bias[..., ::2],
            "up_bias": bias[..., 1::2],
            "down_bias": w["experts.down_proj_bias"],
        }
    if name.startswith("llama4"):
        gate_up = w["experts.gate_up_proj"]  # [e, d, 2f], gate then up
        e, d, f = gate_up.shape[0], gate_up.shape[1], gate_up.shape[2] // 2
        s = w["shared_expert.gate_proj.weight"].shape[0]
        top_k = 2 if name.endswith("top2") else 1
        spec = routing.RoutedSpec("sigmoid_of_chosen", d, f, e, top_k, shared_mlp_dim=s)
        p = {"router": w["router.weight"].T, "gate": gate_up[..., :f], "up": gate_up[..., f:]}
        p["down"] = w["experts.down_proj"]
        prefix = "shared_expert"
    else:
        gate_up = w["experts.gate_up_proj"]  # [e, 2f, d], gate then up
        e, f, d = gate_up.shape[0], gate_up.shape[1] // 2, gate_up.shape[2]
        s = w["shared_experts.gate_proj.weight"].shape[0]
        normalised = not name.endswith("unnormalised")
        spec = routing.RoutedSpec(
            "grouped_sigmoid", d, f, e, top_k=3, shared_mlp_dim=s, scaling=2.5,
            groups=4 if normalised else 2, top_groups=2 if normalised else 1,
            norm_topk_prob=normalised,
        )  # fmt: skip
        p = {
            "router": w["gate.weight"].T,
            "router_bias": w["gate.e_score_correction_bias"],
            "gate": gate_up[:, :f].transpose(0, 2, 1),
            "up": gate_up[:, f:].transpose(0, 2, 1),
            "down": w["experts.down_proj"].transpose(0, 2, 1),
        }
        prefix = "shared_experts"
    for ours, theirs in (("gate", "gate_proj"), ("up", "up_proj"), ("down", "down_proj")):
        p[f"shared_{ours}"] = w[f"{prefix}.{theirs}.weight"].T
    return spec, p


def routed_module(spec: routing.RoutedSpec, params: dict, dtype=jnp.float32) -> routing.RoutedMLP:
    module = routing.RoutedMLP(spec, nnx.Rngs(0), dtype)
    for name, value in params.items():
        param = getattr(module, name)
        param[...] = jnp.asarray(value, param[...].dtype)
    return module


ROUTED = [
    "gpt_oss_mlp",
    "llama4_moe",
    "llama4_moe_top2",
    "deepseek_moe",
    "deepseek_moe_unnormalised",
]


def chosen_experts(spec: routing.RoutedSpec, params: dict, x: np.ndarray) -> np.ndarray:
    x = jnp.asarray(x.reshape(-1, x.shape[-1]))
    if spec.router == "softmax_of_chosen":
        return routing.softmax_of_chosen(x, params["router"], params["router_bias"], spec.top_k)[1]
    if spec.router == "sigmoid_of_chosen":
        return routing.sigmoid_of_chosen(x, params["router"], spec.top_k)[1]
    return routing.grouped_sigmoid(
        x, params["router"], params["router_bias"], top_k=spec.top_k, groups=spec.groups,
        top_groups=spec.top_groups, norm_topk_prob=spec.norm_topk_prob, scaling=spec.scaling,
    )[1]  # fmt: skip


@pytest.mark.parametrize("name", ROUTED)
def test_routed_block_equals_transformers(name):
    g = golden(name)
    spec, params = routed_params(name)
    y = routed_module(spec, params)(jnp.asarray(g["x"]))
    assert y.shape == g["x"].shape and y.dtype == jnp.float32
    assert (
        rel_diff(np.asarray(y).reshape(-1, spec.embed_dim), g["y"].reshape(-1, spec.embed_dim))
        < 1e-6
    )
    chosen = np.asarray(chosen_experts(spec, params, g["x"]))
    assert [set(r) for r in chosen.tolist()] == [set(r) for r in g["experts"].tolist()]


def test_gpt_oss_experts_reach_the_clamp():
    assert golden("gpt_oss_mlp")["clamped"] > 0.1


# Each routing feature turned off: (case, spec change, param change).
TURNED_OFF = [
    ("gpt_oss_mlp", {"limit": 1e9}, {}),
    ("gpt_oss_mlp", {"alpha": 1.0}, {}),
    ("deepseek_moe", {"top_groups": 4}, {}),
    ("deepseek_moe", {"scaling": 1.0}, {}),
    ("deepseek_moe", {"norm_topk_prob": False}, {}),
    ("deepseek_moe", {}, {"router_bias": 0}),
]


@pytest.mark.parametrize("name,spec_change,param_change", TURNED_OFF)
def test_each_routing_feature_changes_the_output(name, spec_change, param_change):
    g = golden(name)
    spec, params = routed_params(name)
    spec = dataclasses.replace(spec, **spec_change)
    params = {
        **params,
        **{k: np.zeros_like(params.get(k, params["router"][0])) for k in param_change},
    }
    y = routed_module(spec, params)(jnp.asarray(g["x"]))
    assert rel_diff(np.asarray(y).reshape(g["y"].shape), g["y"]) > 1e-2


def test_llama4_scales_the_experts_input_not_output():
    g = golden("llama4_moe")
    spec, p = routed_params("llama4_moe")
    x = jnp.asarray(g["x"]).reshape(-1, spec.embed_dim)
    weights, chosen = routing.sigmoid_of_chosen(x, p["router"], 1)
    params = tuple(jnp.asarray(p[n]) for n in ("gate", "up", "down"))
    shared = experts.swiglu(x, p["shared_gate"], p["shared_up"], p["shared_down"])
    for scale_input, close in ((True, True), (False, False)):
        y = experts.weighted_sum(x, weights, chosen, params, scale_input=scale_input) + shared
        assert (rel_diff(y, g["y"]) < 1e-6) == close


@pytest.mark.slow
@pytest.mark.parametrize("name", ROUTED)
def test_routed_block_in_bfloat16_is_close(name):
    g = golden(name)
    spec, params = routed_params(name)
    y = routed_module(spec, params, jnp.bfloat16)(jnp.asarray(g["x"], jnp.bfloat16))
    assert y.dtype == jnp.bfloat16
    assert rel_diff(np.asarray(y, np.float32).reshape(g["y"].shape), g["y"]) < 5e-2


@pytest.mark.parametrize("scale_input", [False, True])
def test_cpu_tiles_equal_ragged_dot_for_clamped_experts(scale_input):
    """The CPU path equals `jax.lax.ragged_dot`'s (TPU/GPU) for GPT-OSS's biased, clamped
    experts and for inputs scaled by their weights (Llama 4), empty experts included."""
    sizes, tile, d, f = [5, 0, 9, 1, 0, 17], 4, 16, 8
    rng = np.random.default_rng(3)
    draw = lambda *s, scale=1.0: jnp.asarray(rng.standard_normal(s) * scale, jnp.float32)  # noqa: E731
    e = len(sizes)
    params = (draw(e, d, f, scale=2), draw(e, d, f, scale=2), draw(e, f, d), draw(e, f),
              draw(e, f), draw(e, d))  # fmt: skip
    mlp = experts.ClampedSwiGLU()
    rows = sum(sizes)
    xs = draw(rows, d)
    gs = jnp.asarray(sizes, jnp.int32)
    weight = draw(rows) ** 2
    token = jnp.arange(rows, dtype=jnp.int32)  # each row its own token
    tiled = jax.jit(experts._tiled_sum, static_argnums=(5, 6, 7))(
        xs, token, weight, params, gs, tile, mlp, scale_input
    )
    row_expert = jnp.repeat(jnp.arange(e), gs, total_repeat_length=rows)
    scaled = xs * weight[:, None] if scale_input else xs
    ragged = mlp.ragged(scaled, gs, row_expert, *params)
    ragged = ragged if scale_input else ragged * weight[:, None]
    assert rel_diff(tiled, ragged) < 1e-6
    clamped = (np.asarray(xs @ params[0][0]) > mlp.limit).any()
    assert clamped


def rope_view(rope: dict, head_dim: int) -> LlamaConfig:
    """A `LlamaConfig` that carries only a rotary scaling of `head_dim` dims."""
    fields = rope_lib.from_hf(rope, {}, head_dim, 64)
    return LlamaConfig(1, 1, 1, 1, 1, head_dim, 1, 64, **fields)


MLA_ROPE = {
    "deepseek_mla": {
        "rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
        "original_max_position_embeddings": 16, "mscale": 1.0, "mscale_all_dim": 0.8,
    },
    "deepseek_mla_plain": {"rope_type": "default", "rope_theta": 10000.0},
}  # fmt: skip


def mla_module(name: str, **spec_change) -> mla.LatentAttention:
    w = {k[2:]: v for k, v in golden(name).items() if k.startswith("w:")}
    h, nope, rope_dim, v_dim, d = 4, 8, 8, 12, 32
    lora = "q_a_proj.weight" in w
    spec = mla.MlaSpec(
        embed_dim=d, num_heads=h, q_lora_rank=16 if lora else 0, kv_lora_rank=16,
        qk_nope_dim=nope, qk_rope_dim=rope_dim, v_dim=v_dim, bias="o_proj.bias" in w,
        interleave=lora, softmax_scale=mla.softmax_scale(nope + rope_dim, MLA_ROPE[name]),
    )  # fmt: skip
    spec = dataclasses.replace(spec, **spec_change)
    module = mla.LatentAttention(spec, rope_view(MLA_ROPE[name], rope_dim), nnx.Rngs(0))
    p = {
        "kv_a": w["kv_a_proj_with_mqa.weight"].T,
        "kv_a_norm": w["kv_a_layernorm.weight"],
        "kv_b": w["kv_b_proj.weight"].T.reshape(16, h, nope + v_dim),
        "o": w["o_proj.weight"].T.reshape(h, v_dim, d),
    }
    if lora:
        p.update(q_a=w["q_a_proj.weight"].T, q_a_norm=w["q_a_layernorm.weight"])
        p["q_b"] = w["q_b_proj.weight"].T.reshape(16, h, nope + rope_dim)
    else:
        p["q"] = w["q_proj.weight"].T.reshape(d, h, nope + rope_dim)
    if spec.bias:
        p.update(kv_a_bias=w["kv_a_proj_with_mqa.bias"], o_bias=w["o_proj.bias"])
    for name_, value in p.items():
        getattr(module, name_)[...] = jnp.asarray(value)
    return module


def heads_last(a: np.ndarray) -> np.ndarray:
    """transformers' `[B, heads, T, dim]` as ppl_jax's `[B, T, heads, dim]`."""
    return a.transpose(0, 2, 1, 3)


@pytest.mark.parametrize("name", list(MLA_ROPE))
def test_latent_attention_projections_equal_transformers(name):
    g = golden(name)
    module = mla_module(name)
    positions = jnp.asarray(g["positions"])
    q, k, v = module.projections(jnp.asarray(g["x"]), positions, jnp.ones_like(positions))
    for ours, theirs in ((q, g["q"]), (k, g["k"]), (v, g["v"])):
        assert ours.shape == heads_last(theirs).shape
        assert rel_diff(ours, heads_last(theirs)) < 5e-6  # as for Llama 4's
    assert module.spec.softmax_scale == pytest.approx(float(g["scaling"]), rel=1e-12)


@pytest.mark.parametrize("change", [{"interleave": False}, {"softmax_scale": None}])
def test_each_latent_attention_feature_changes_the_projections(change):
    g = golden("deepseek_mla")
    if "softmax_scale" in change:  # YaRN's mscale_all_dim
        assert mla.softmax_scale(16, {**MLA_ROPE["deepseek_mla"], "mscale_all_dim": 0}) != float(
            g["scaling"]
        )
        return
    module = mla_module("deepseek_mla", **change)
    positions = jnp.asarray(g["positions"])
    _, k, _ = module.projections(jnp.asarray(g["x"]), positions, jnp.ones_like(positions))
    assert rel_diff(k, heads_last(g["k"])) > 1e-2


LLAMA4_ROPE = {
    "rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
    "high_freq_factor": 4.0, "original_max_position_embeddings": 16,
}  # fmt: skip


def llama4_qk(name: str, *, norm=True, temperature=True, rotate=True):
    """Llama 4's queries and keys from the golden case's weights: projections, then on rotary
    layers the rotation of pairs and the L2 norm, on NoPE layers the temperature."""
    g = golden(name)
    x = jnp.asarray(g["x"])
    q = x @ g["w:q_proj.weight"].T
    k = x @ g["w:k_proj.weight"].T
    q, k = q.reshape(2, 24, 4, 8), k.reshape(2, 24, 2, 8)
    positions = jnp.asarray(g["positions"])
    if name.endswith("rope"):
        if rotate:
            freq = rope_lib.inv_freq(rope_view(LLAMA4_ROPE, 8))
            q, k = qk.rotate_pairs(q, positions, freq), qk.rotate_pairs(k, positions, freq)
        if norm:
            q, k = qk.l2_norm(q, 1e-5), qk.l2_norm(k, 1e-5)
    elif temperature:
        q = q * qk.temperature(positions, 4, 0.25)[..., None, None]
    return q, k


def pairs_split(a: np.ndarray) -> np.ndarray:
    """transformers' Llama 4 heads (pairs interleaved) in `rotate_pairs`' layout: the even dims,
    then the odd ones."""
    return np.concatenate([a[..., 0::2], a[..., 1::2]], axis=-1)


@pytest.mark.parametrize("name", ["llama4_attention_rope", "llama4_attention_nope"])
def test_llama4_queries_and_keys_equal_transformers(name):
    g = golden(name)
    q, k = llama4_qk(name)
    layout = pairs_split if name.endswith("rope") else (lambda a: a)
    # float32 rotations: NumPy's frequencies (float64, rounded) against torch's (float32)
    assert rel_diff(q, layout(heads_last(g["q"]))) < 5e-6
    assert rel_diff(k, layout(heads_last(g["k"]))) < 5e-6
    v = jnp.asarray(g["x"]) @ g["w:v_proj.weight"].T
    assert rel_diff(v.reshape(2, 24, 2, 8), heads_last(g["v"])) < 1e-6


@pytest.mark.parametrize(
    "name,off",
    [
        ("llama4_attention_rope", {"norm": False}),
        ("llama4_attention_rope", {"rotate": False}),
        ("llama4_attention_nope", {"temperature": False}),
    ],
)
def test_each_llama4_feature_changes_the_queries(name, off):
    g = golden(name)
    q, _ = llama4_qk(name, **off)
    layout = pairs_split if name.endswith("rope") else (lambda a: a)
    assert rel_diff(q, layout(heads_last(g["q"]))) > 1e-2


def test_rotate_pairs_equals_complex_multiplication():
    """`rotate_pairs` is the multiplication of each pair `x0 + i x1` by `exp(i p f)` (Llama 4's
    `torch.view_as_complex` form), in NumPy complex128, with the pairs split as documented."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 5, 3, 8)).astype(np.float32)
    positions = np.asarray([[0, 1, 2, 3, 40], [7, 8, 9, 10, 11]], np.int32)
    freq = np.asarray([1.0, 0.3, 0.01, 1e-4], np.float32)
    z = (x[..., 0::2] + 1j * x[..., 1::2]) * np.exp(1j * positions[..., None, None] * freq)
    expected = np.concatenate([z.real, z.imag], axis=-1) * 1.5
    got = qk.rotate_pairs(jnp.asarray(x), jnp.asarray(positions), freq, attention_factor=1.5)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
