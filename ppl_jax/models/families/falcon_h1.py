"""Falcon-H1 (Hugging Face `falcon_h1`, transformers 5.24's `FalconH1ForCausalLM`): in every
layer, attention and a Mamba2 layer (`ppl_jax.models.layers.ssd`) side by side on the same normed
input, then a SwiGLU MLP, with the µP multipliers of its config:

    h = rms_norm(x)
    x = x + ssm(h * ssm_in) * ssm_out + attention(h * attention_in) * attention_out
    x = x + mlp(rms_norm(x))          mlp = down(silu(gate(x) * g) * up(x)) * d

The embedding is multiplied by `embedding_multiplier`, the logits by `lm_head_multiplier`, the
keys by `key_multiplier` (before the rotation), and the Mamba2 input projection's parts z, x, B,
C, dt by the five `ssm_multipliers` (transformers' `mup_vector`). The Mamba2 output is
`rms_norm(y) * silu(z)` per group (`mamba_rms_norm`, `mamba_norm_before_gate`; the other order,
or no norm at all: `y * silu(z)`). RMSNorms scale by their weight after casting back
(`FalconH1RMSNorm`).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
from flax import nnx

from ppl_jax.errors import CheckpointError
from ppl_jax.models.decoders import hybrid, llama_hf
from ppl_jax.models.decoders.stack import run_layers
from ppl_jax.models.family import Family, Layer
from ppl_jax.models.layers import packed, ssd
from ppl_jax.models.layers import rope as rope_lib
from ppl_jax.models.layers.core import normal_param, ones_param


@dataclasses.dataclass(frozen=True, kw_only=True)
class FalconH1Config(ssd.SsmFields, hybrid.DescribedConfig):
    """Architecture of a Falcon-H1 model (stored as JSON beside each checkpoint).

    Attributes:
      vocab_size, embed_dim, num_layers, num_heads, num_kv_heads, head_dim, mlp_dim: the sizes.
      rope: the `rope_*` fields of the attention
        (`ppl_jax.models.decoders.hybrid.AttentionSpec.rope`).
      max_positions: `max_position_embeddings`.
      attention_bias, mlp_bias: biases of the attention's and the MLP's projections.
      ssm_*: every layer's Mamba2 layer (`ppl_jax.models.layers.ssd.SsmFields`).
      embedding_scale, lm_head_scale, key_scale, attention_in_scale, attention_out_scale,
        ssm_in_scale, ssm_out_scale, mlp_gate_scale, mlp_down_scale: the multipliers
        (`embedding_multiplier`, ..., `mlp_multipliers`).
      norm_eps: the RMSNorms' epsilon (`rms_norm_eps`, also the Mamba2 layer's norm).
      tie_embeddings: the output matrix is the embedding's transpose.
      model_type: the Hugging Face model type it was read from.
    """

    FAMILY: ClassVar[str] = "falcon_h1"
    vocab_size: int
    embed_dim: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    mlp_dim: int
    rope: tuple[tuple[str, Any], ...] = (("rope_theta", 10000.0), ("rope_type", "default"))
    max_positions: int = 8192
    attention_bias: bool = False
    mlp_bias: bool = False
    embedding_scale: float = 1.0
    lm_head_scale: float = 1.0
    key_scale: float = 1.0
    attention_in_scale: float = 1.0
    attention_out_scale: float = 1.0
    ssm_in_scale: float = 1.0
    ssm_out_scale: float = 1.0
    mlp_gate_scale: float = 1.0
    mlp_down_scale: float = 1.0
    norm_eps: float = 1e-5
    tie_embeddings: bool = False
    model_type: str = "falcon_h1"

    def __post_init__(self):
        ssd.mixer_spec(self)
        self.attention_spec()

    def attention_spec(self) -> hybrid.AttentionSpec:
        return hybrid.spec_of(hybrid.AttentionSpec, self, bias=self.attention_bias)

    def mlp_spec(self) -> hybrid.MLPSpec:
        return hybrid.spec_of(
            hybrid.MLPSpec,
            self,
            bias=self.mlp_bias,
            gate_scale=self.mlp_gate_scale,
            down_scale=self.mlp_down_scale,
        )


def from_hf_config(c: dict[str, Any]) -> FalconH1Config:
    """The architecture of a Hugging Face `falcon_h1` `config.json` (transformers 5.24's
    defaults for missing fields).

    Raises:
      CheckpointError: an activation other than silu, an unsupported rope scaling, inconsistent
        Mamba2 sizes, multipliers that are not numbers. KeyError: a required field is missing.
    """
    if (c.get("hidden_act") or "silu") != "silu":
        raise CheckpointError(f"hidden_act {str(c['hidden_act'])[:40]!r} is not supported (silu).")
    common = llama_hf.hf_common(c, max_positions=8192, norm_eps=1e-5)
    d, head_dim, max_positions = common["embed_dim"], common["head_dim"], common["max_positions"]
    inner = int(c.get("mamba_d_ssm") or int(c.get("mamba_expand", 2)) * d)
    ssm_heads = int(c.get("mamba_n_heads", 128))
    ssm_head_dim = c.get("mamba_d_head", "auto")
    ssm_head_dim = inner // ssm_heads if ssm_head_dim == "auto" else int(ssm_head_dim)
    if ssm_head_dim * ssm_heads != inner:
        raise CheckpointError(
            f"mamba_n_heads={ssm_heads} heads of mamba_d_head={ssm_head_dim} do not make the "
            f"Mamba2 width {inner} (transformers refuses such a config too)."
        )
    rope = rope_lib.from_hf(_rope(c), c, head_dim, max_positions)
    norm = "none"
    if c.get("mamba_rms_norm", False):
        norm = "gated_first_norm" if c.get("mamba_norm_before_gate", True) else "gated"
    low, high = ssd.dt_limit(c.get("time_step_limit"))
    try:
        gate_scale, down_scale = (float(v) for v in (c.get("mlp_multipliers") or (1.0, 1.0)))
        ssm_scales = tuple(float(v) for v in (c.get("ssm_multipliers") or (1.0,) * 5))
        scale = lambda name: float(c.get(name, 1.0) or 1.0)  # noqa: E731
        scales = dict(
            embedding_scale=scale("embedding_multiplier"),
            lm_head_scale=scale("lm_head_multiplier"),
            key_scale=scale("key_multiplier"),
            attention_in_scale=scale("attention_in_multiplier"),
            attention_out_scale=scale("attention_out_multiplier"),
            ssm_in_scale=scale("ssm_in_multiplier"),
            ssm_out_scale=scale("ssm_out_multiplier"),
        )
    except (TypeError, ValueError):
        raise CheckpointError(
            "the Falcon-H1 multipliers (mlp_multipliers: 2 numbers, ssm_multipliers: 5, the "
            "others one each) are not numbers."
        ) from None
    if len(ssm_scales) != 5:
        raise CheckpointError(f"ssm_multipliers has {len(ssm_scales)} values, not 5.")
    return FalconH1Config(
        **common,
        rope=tuple(sorted(rope.items())),
        attention_bias=bool(c.get("attention_bias", False)),
        mlp_bias=bool(c.get("mlp_bias", False)),
        ssm_heads=ssm_heads,
        ssm_head_dim=ssm_head_dim,
        ssm_groups=int(c.get("mamba_n_groups", 1)),
        ssm_state=int(c.get("mamba_d_state", 256)),
        ssm_conv=int(c.get("mamba_d_conv", 4)),
        ssm_chunk=int(c.get("mamba_chunk_size", 256)),
        ssm_dt_min=low,
        ssm_dt_max=None if math.isinf(high) else high,
        ssm_conv_bias=bool(c.get("mamba_conv_bias", True)),
        ssm_in_bias=bool(c.get("mamba_proj_bias", False)),
        ssm_out_bias=bool(c.get("projectors_bias", False)),
        ssm_norm=norm,
        ssm_scales=ssm_scales,
        mlp_gate_scale=gate_scale,
        mlp_down_scale=down_scale,
        **scales,
    )


def _rope(c: dict[str, Any]) -> dict[str, Any]:
    """The `rope_parameters` of a config (or the older `rope_theta` and `rope_scaling`)."""
    rope = {**(c.get("rope_scaling") or {}), **(c.get("rope_parameters") or {})}
    rope.setdefault("rope_theta", c.get("rope_theta", 10000.0))
    return rope


def _scaled(x: jax.Array, scale: float) -> jax.Array:
    return x if scale == 1.0 else x * jnp.asarray(scale, x.dtype)


class Block(nnx.Module):
    def __init__(self, cfg: FalconH1Config, rngs: nnx.Rngs, dtype: jnp.dtype, attention: str):
        self.cfg = cfg
        self.input_norm = ones_param((cfg.embed_dim,), ("embed",), dtype)
        self.ssm = ssd.Mamba2Mixer(ssd.mixer_spec(cfg), rngs, dtype)
        self.attn = hybrid.Attention(cfg.attention_spec(), rngs, dtype, attention)
        self.mlp_norm = ones_param((cfg.embed_dim,), ("embed",), dtype)
        self.mlp = hybrid.MLP(cfg.mlp_spec(), rngs, dtype)

    def __call__(self, x: jax.Array, positions: jax.Array, segment_ids: jax.Array) -> jax.Array:
        cfg = self.cfg
        h = hybrid.norm_then_cast(x, self.input_norm[...], cfg.norm_eps)
        ssm = _scaled(self.ssm(_scaled(h, cfg.ssm_in_scale), segment_ids), cfg.ssm_out_scale)
        attn = self.attn(_scaled(h, cfg.attention_in_scale), positions, segment_ids)
        x = x + (ssm + _scaled(attn, cfg.attention_out_scale))
        return x + self.mlp(hybrid.norm_then_cast(x, self.mlp_norm[...], cfg.norm_eps))


class FalconH1(nnx.Module):
    """The language model. `__call__(tokens, positions, segment_ids)` gives final hidden states
    `[B, T, embed]`; `unembedding()` the `[embed, vocab]` output matrix times
    `lm_head_multiplier`."""

    def __init__(
        self, cfg: FalconH1Config, rngs: nnx.Rngs, dtype: jnp.dtype = jnp.float32, attention="xla"
    ):
        self.cfg = cfg
        d = cfg.embed_dim
        self.embedding = normal_param(rngs, (cfg.vocab_size, d), ("vocab", "embed"), d**-0.5, dtype)
        self.layers = nnx.List([Block(cfg, rngs, dtype, attention) for _ in range(cfg.num_layers)])
        self.final_norm = ones_param((d,), ("embed",), dtype)
        if not cfg.tie_embeddings:
            self.lm_head = normal_param(
                rngs, (d, cfg.vocab_size), ("embed", "vocab"), d**-0.5, dtype
            )

    def __call__(self, tokens: jax.Array, positions: jax.Array, segment_ids: jax.Array):
        x = _scaled(packed.take(self.embedding, tokens), self.cfg.embedding_scale)
        x = run_layers(self.layers, x, positions, segment_ids)
        return hybrid.norm_then_cast(x, self.final_norm[...], self.cfg.norm_eps)

    def unembedding(self) -> jax.Array:
        w = self.embedding[...].T if self.cfg.tie_embeddings else self.lm_head[...]
        return _scaled(w, self.cfg.lm_head_scale)


LAYER = r"layers\.(?P<l>\d+)\."


def rules(d: dict[str, Any]) -> list[dict[str, Any]]:
    """The mapping rules of a `falcon_h1` directory's weights (names without `model.`)."""
    return [
        *hybrid.embedding_rules(d, r"embed_tokens\.weight", r"final_layernorm\.weight"),
        {"from": LAYER + r"input_layernorm\.weight", "to": "layers/{l}/input_norm"},
        {"from": LAYER + r"pre_ff_layernorm\.weight", "to": "layers/{l}/mlp_norm"},
        *ssd.hf_rules(LAYER + r"mamba\.", "layers/{l}/ssm/"),
        *hybrid.attention_rules(LAYER + r"self_attn\.", "layers/{l}/attn/"),
        *hybrid.mlp_rules(LAYER + r"feed_forward\.", "layers/{l}/mlp/"),
    ]


FAMILY = Family(
    name="falcon_h1",
    config=FalconH1Config,
    module=FalconH1,
    hf_sizes={
        "mamba_chunk_size": ("ssm_chunk", 1),
        "mamba_d_conv": ("ssm_conv", 1),
        "mamba_n_heads": ("ssm_heads", 1),
        **dict.fromkeys(("mamba_d_head", "mamba_d_ssm"), ("ssm_head_dim", 1)),
        **dict.fromkeys(("mamba_n_groups", "mamba_expand"), ("ssm_groups", 1)),
        "mamba_d_state": ("ssm_state", 1),
    },
    hf_readers={"falcon_h1": from_hf_config},
    hf_rules=rules,
    hf_prefixes=("model.",),
    layers=lambda cfg: tuple(
        Layer("attention", "dense", "state_space") for _ in range(cfg.num_layers)
    ),  # fmt: skip
)
