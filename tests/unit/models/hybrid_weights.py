"""transformers' weights of the hybrid families as ppl_jax params, written out by hand from the
`modeling_*` files (the test side's own reading of the layouts): each function takes `get`,
the stored tensor of a name relative to the layer (`in_proj.weight`), and returns the layer's
params as NumPy arrays under ppl_jax's names."""

from __future__ import annotations

import json
import os

import numpy as np
from safetensors import safe_open

from ppl_jax.models import mamba2, ssd


def linear(get, name, *out_dims):
    """An `nn.Linear` weight `[out, in]` as `[in, *out_dims]`."""
    w = get(f"{name}.weight")
    return w.T.reshape((w.shape[1],) + tuple(out_dims))


def gdn(get, spec, layout: str) -> dict[str, np.ndarray]:
    """A Gated DeltaNet layer (`Qwen3_5GatedDeltaNet` for layout `qwen3_5`,
    `Qwen3NextGatedDeltaNet` for `qwen3_next`)."""
    hk, dk, hv, dv = spec.key_heads, spec.key_dim, spec.value_heads, spec.value_dim
    d, r, kd = spec.embed_dim, hv // hk, hk * dk
    if layout != "qwen3_next":
        qkv = get("in_proj_qkv.weight")
        q, k, v = qkv[:kd], qkv[kd : 2 * kd], qkv[2 * kd :]
        z, b, a = get("in_proj_z.weight"), get("in_proj_b.weight"), get("in_proj_a.weight")
    else:  # per key head: q, k, r value heads, r gates; then r betas, r decay inputs
        qkvz = get("in_proj_qkvz.weight").reshape(hk, 2 * dk + 2 * r * dv, d)
        q, k = qkvz[:, :dk].reshape(kd, d), qkvz[:, dk : 2 * dk].reshape(kd, d)
        v = qkvz[:, 2 * dk : 2 * dk + r * dv].reshape(hv * dv, d)
        z = qkvz[:, 2 * dk + r * dv :].reshape(hv * dv, d)
        ba = get("in_proj_ba.weight").reshape(hk, 2 * r, d)
        b, a = ba[:, :r].reshape(hv, d), ba[:, r:].reshape(hv, d)
    conv = get("conv1d.weight")[:, 0, :].T  # [K, channels q | k | v]
    kern = conv.shape[0]
    return {
        "q": q.T.reshape(d, hk, dk),
        "k": k.T.reshape(d, hk, dk),
        "v": v.T.reshape(d, hv, dv),
        "z": z.T.reshape(d, hv, dv),
        "b": b.T,
        "a": a.T,
        "conv_q": conv[:, :kd].reshape(kern, hk, dk),
        "conv_k": conv[:, kd : 2 * kd].reshape(kern, hk, dk),
        "conv_v": conv[:, 2 * kd :].reshape(kern, hv, dv),
        "dt_bias": get("dt_bias"),
        "a_log": get("A_log"),
        "norm": get("norm.weight"),
        "out": get("out_proj.weight").T.reshape(hv, dv, d),
    }


def mamba(get, spec: ssd.Mamba2Spec) -> dict[str, np.ndarray]:
    """A Mamba2 layer (`Mamba2Mixer`, `NemotronHMamba2Mixer`, `FalconH1Mixer`)."""
    h, p, g, n, d = spec.heads, spec.head_dim, spec.groups, spec.state_dim, spec.embed_dim
    inner, gn = h * p, g * n
    cuts = np.cumsum([0, inner, inner, gn, gn, h])
    w = get("in_proj.weight")  # [z | x | B | C | dt, embed]
    parts = [w[cuts[i] : cuts[i + 1]].T for i in range(5)]
    conv = get("conv1d.weight")[:, 0, :].T  # [K, x | B | C]
    kern = conv.shape[0]
    out = {
        "z": parts[0].reshape(d, h, p),
        "x": parts[1].reshape(d, h, p),
        "b": parts[2].reshape(d, g, n),
        "c": parts[3].reshape(d, g, n),
        "dt": parts[4],
        "conv_x": conv[:, :inner].reshape(kern, h, p),
        "conv_b": conv[:, inner : inner + gn].reshape(kern, g, n),
        "conv_c": conv[:, inner + gn :].reshape(kern, g, n),
        "dt_bias": get("dt_bias"),
        "a_log": get("A_log"),
        "d": get("D"),
        "out": get("out_proj.weight").T.reshape(h, p, d),
    }
    if spec.conv_bias:
        bias = get("conv1d.bias")
        out.update(
            conv_x_bias=bias[:inner].reshape(h, p),
            conv_b_bias=bias[inner : inner + gn].reshape(g, n),
            conv_c_bias=bias[inner + gn :].reshape(g, n),
        )
    if spec.in_bias:
        b = get("in_proj.bias")
        for i, (name, shape) in enumerate(
            (("z", (h, p)), ("x", (h, p)), ("b", (g, n)), ("c", (g, n)), ("dt", (h,)))
        ):
            out[f"{name}_bias"] = b[cuts[i] : cuts[i + 1]].reshape(shape)
    if spec.out_bias:
        out["out_bias"] = get("out_proj.bias")
    if spec.norm != "none":
        out["norm"] = get("norm.weight").reshape(h, p)
    return out


class Stored:
    """The tensors of a transformers directory (`model.safetensors`) and its `config.json`."""

    def __init__(self, path: str):
        with open(os.path.join(path, "config.json"), encoding="utf-8") as f:
            self.config = json.load(f)
        with safe_open(os.path.join(path, "model.safetensors"), "np") as f:
            self.tensors = {k: f.get_tensor(k) for k in f.keys()}
        self.used: set[str] = set()

    def under(self, prefix: str):
        def get(name):
            self.used.add(prefix + name)
            return self.tensors[prefix + name]

        return get

    def unused(self) -> set[str]:
        return set(self.tensors) - self.used


def mamba2_params(stored: Stored, cfg) -> dict:
    """A `mamba2` directory as `ppl_jax.models.mamba2.Mamba2` params."""
    get = stored.under("backbone.")
    params = {
        "embedding": get("embeddings.weight"),
        "final_norm": get("norm_f.weight"),
        "layers": {
            str(i): {
                "norm": get(f"layers.{i}.norm.weight"),
                "mixer": mamba(stored.under(f"backbone.layers.{i}.mixer."), mamba2.mixer_spec(cfg)),
            }
            for i in range(cfg.num_layers)
        },
    }
    if not cfg.tie_embeddings:
        params["lm_head"] = stored.under("")("lm_head.weight").T
    return params


def attention(get, spec) -> dict[str, np.ndarray]:
    """An attention layer (`hybrid.Attention`): q, k, v, o projections, Qwen3.5's query-and-gate
    `q_proj` (each head's query then its gate), QK-norms, biases."""
    h, kv, hd = spec.num_heads, spec.num_kv_heads, spec.head_dim
    out = {}
    if spec.output_gate:
        qg = get("q_proj.weight").reshape(h, 2, hd, -1)
        out["q"], out["gate"] = qg[:, 0].transpose(2, 0, 1), qg[:, 1].transpose(2, 0, 1)
    else:
        out["q"] = linear(get, "q_proj", h, hd)
    out["k"], out["v"] = linear(get, "k_proj", kv, hd), linear(get, "v_proj", kv, hd)
    out["o"] = get("o_proj.weight").T.reshape(h, hd, -1)
    if spec.qk_norm:
        out["q_norm"], out["k_norm"] = get("q_norm.weight"), get("k_norm.weight")
    if spec.bias:
        for p, heads in (("q", h), ("k", kv), ("v", kv)):
            out[f"{p}_bias"] = get(f"{p}_proj.bias").reshape(heads, hd)
        out["o_bias"] = get("o_proj.bias")
    return out


def mlp(get, spec, names=("gate_proj", "up_proj", "down_proj")) -> dict[str, np.ndarray]:
    """A dense MLP (`hybrid.MLP`): `gate`, `up`, `down` transposed (and biases)."""
    out = {}
    for ours, theirs in zip(("gate", "up", "down"), names, strict=True):
        if ours == "gate" and not spec.gated:
            continue
        out[ours] = get(f"{theirs}.weight").T
        if spec.bias:
            out[f"{ours}_bias"] = get(f"{theirs}.bias")
    return out


def falcon_h1_params(stored: Stored, cfg) -> dict:
    """A `falcon_h1` directory as `ppl_jax.models.falcon_h1.FalconH1` params."""
    get = stored.under("model.")
    params = {
        "embedding": get("embed_tokens.weight"),
        "final_norm": get("final_layernorm.weight"),
        "layers": {},
    }
    for i in range(cfg.num_layers):
        layer = f"model.layers.{i}."
        params["layers"][str(i)] = {
            "input_norm": get(f"layers.{i}.input_layernorm.weight"),
            "mlp_norm": get(f"layers.{i}.pre_ff_layernorm.weight"),
            "ssm": mamba(stored.under(layer + "mamba."), mamba2.mixer_spec(cfg)),
            "attn": attention(stored.under(layer + "self_attn."), cfg.attention_spec()),
            "mlp": mlp(stored.under(layer + "feed_forward."), cfg.mlp_spec()),
        }
    if not cfg.tie_embeddings:
        params["lm_head"] = stored.under("")("lm_head.weight").T
    return params


def softmax_moe(get, spec) -> dict[str, np.ndarray]:
    """A `moe.MoeMLP` of transformers' per-expert tensors (`experts.{e}.*_proj.weight`, as
    transformers 5 saves them), the router `gate.weight`, the shared expert and its gate."""

    def stacked(name):
        return np.stack([get(f"experts.{e}.{name}.weight").T for e in range(spec.num_experts)])

    out = {"router": get("gate.weight").T}
    out.update(gate=stacked("gate_proj"), up=stacked("up_proj"), down=stacked("down_proj"))
    if spec.shared_mlp_dim:
        for ours, theirs in (("gate_proj", "gate_proj"), ("up", "up_proj"), ("down", "down_proj")):
            out[f"shared_{ours}"] = get(f"shared_expert.{theirs}.weight").T
        out["shared_scale"] = get("shared_expert_gate.weight")[0]
    return out


def qwen3_5_params(stored: Stored, cfg) -> dict:
    """A `qwen3_5_text` or `qwen3_next` directory as `ppl_jax.models.qwen3_5.Qwen35` params."""
    from ppl_jax.models import hybrid

    get = stored.under("model.")
    params = {"embedding": get("embed_tokens.weight"), "final_norm": get("norm.weight")}
    layers = {}
    for i in range(cfg.num_layers):
        under = lambda part, i=i: stored.under(f"model.layers.{i}.{part}.")  # noqa: E731
        layer = {
            "attn_norm": get(f"layers.{i}.input_layernorm.weight"),
            "mlp_norm": get(f"layers.{i}.post_attention_layernorm.weight"),
        }
        if i in cfg.linear_layers:
            layer["linear_attn"] = gdn(under("linear_attn"), cfg.gdn_spec(), cfg.model_type)
        else:
            layer["attn"] = attention(under("self_attn"), cfg.attention_spec())
        if i in cfg.moe_layers:
            layer["mlp"] = softmax_moe(under("mlp"), cfg.moe_spec())
        else:
            layer["mlp"] = mlp(under("mlp"), hybrid.MLPSpec(cfg.embed_dim, cfg.mlp_dim))
        layers[str(i)] = layer
    params["layers"] = layers
    if not cfg.tie_embeddings:
        params["lm_head"] = stored.under("")("lm_head.weight").T
    return params


def nemotron_h_params(stored: Stored, cfg) -> dict:
    """A `nemotron_h` directory as `ppl_jax.models.nemotron_h.NemotronH` params."""
    from ppl_jax.models import hybrid

    get = stored.under("backbone.")
    params = {"embedding": get("embeddings.weight"), "final_norm": get("norm_f.weight")}
    layers = {}
    for i, kind in enumerate(cfg.layer_kinds):
        under = stored.under(f"backbone.layers.{i}.mixer.")
        if kind == "mamba":
            mixer = mamba(under, mamba2.mixer_spec(cfg))
        elif kind == "attention":
            mixer = attention(under, cfg.attention_spec())
        elif kind == "mlp":
            spec = hybrid.MLPSpec(cfg.embed_dim, cfg.mlp_dim, "relu2", gated=False)
            mixer = mlp(under, spec)
        else:

            def stacked(name, under=under):
                experts = range(cfg.moe_experts)
                return np.stack([under(f"experts.{e}.{name}.weight").T for e in experts])

            spec = hybrid.MLPSpec(cfg.embed_dim, cfg.moe_shared_mlp_dim, "relu2", gated=False)
            mixer = {
                "router": under("gate.weight").T,
                "bias": under("gate.e_score_correction_bias"),
                "up": stacked("up_proj"),
                "down": stacked("down_proj"),
                "shared": mlp(stored.under(f"backbone.layers.{i}.mixer.shared_experts."), spec),
            }
            if cfg.moe_latent_dim:
                mixer["latent_in"] = under("fc1_latent_proj.weight").T
                mixer["latent_out"] = under("fc2_latent_proj.weight").T
        layers[str(i)] = {"norm": get(f"layers.{i}.norm.weight"), "mixer": mixer}
    params["layers"] = layers
    if not cfg.tie_embeddings:
        params["lm_head"] = stored.under("")("lm_head.weight").T
    return params
