"""Nemotron-H and Nemotron 3 (Hugging Face `nemotron_h`, transformers 5.24's
`NemotronHForCausalLM`): a stack of blocks `x + mixer(rms_norm(x))` whose mixer follows the
pattern of `layers_block_type` (the older `hybrid_override_pattern` `M E * -`):

- `linear_attention` (`M`): the Mamba2 layer of `ppl_jax.models.layers.ssd` (gated RMSNorm over
  groups, dt clamped below at `time_step_min`);
- `full_attention` (`*`): grouped-query attention without any position embedding
  (`NemotronHAttention` applies none);
- `mlp` (`-`): `down(relu(up(x))^2)`;
- `moe` (`E`): a mixture of squared-ReLU experts routed by sigmoid scores (`NemotronHTopkRouter`,
  DeepSeek-V3's routing): scores `sigmoid(x @ W)` in float32, the choice made on
  `scores + e_score_correction_bias` within the `topk_group` best of `n_group` expert groups
  (a group's score: the sum of its two best), the chosen scores renormalised
  (`norm_topk_prob`) and multiplied by `routed_scaling_factor`; the experts may work in a
  latent width (`moe_latent_size`: `fc1_latent_proj` before, `fc2_latent_proj` after), and a
  squared-ReLU shared expert is added.

RMSNorms scale by their weight in float32 (`NemotronHRMSNorm`). The multi-token-prediction layers
(`num_nextn_predict_layers`) are not read: they do not score the next token.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
from flax import nnx

from ppl_jax.errors import CheckpointError
from ppl_jax.models.decoders import hybrid, llama_hf
from ppl_jax.models.decoders.stack import run_layers
from ppl_jax.models.family import Family, Layer
from ppl_jax.models.layers import packed, ssd
from ppl_jax.models.layers.core import normal_param, ones_param, rms_norm, zeros_param
from ppl_jax.models.layers.moe.experts import ReluSquared, per_token_shard, weighted_sum

KINDS = ("mamba", "attention", "mlp", "moe")
_HF_KINDS = {"linear_attention": "mamba", "full_attention": "attention", "mlp": "mlp", "moe": "moe"}
_PATTERN = {"M": "linear_attention", "*": "full_attention", "-": "mlp", "E": "moe"}


@dataclasses.dataclass(frozen=True, kw_only=True)
class NemotronHConfig(ssd.SsmFields, hybrid.DescribedConfig):
    """Architecture of a Nemotron-H model (stored as JSON beside each checkpoint).

    Attributes:
      vocab_size, embed_dim, num_layers: the sizes.
      layer_kinds: each layer's mixer, one of `KINDS`.
      num_heads, num_kv_heads, head_dim: the attention layers.
      mlp_dim, mlp_bias: the MLP layers (`intermediate_size`, `mlp_bias`).
      ssm_*: the Mamba2 layers (`ppl_jax.models.layers.ssd.SsmFields`).
      moe_experts, moe_top_k, moe_mlp_dim, moe_shared_mlp_dim, moe_latent_dim (0: none),
        moe_groups, moe_top_groups, moe_scale, moe_norm_topk_prob: the MoE layers
        (`n_routed_experts`, `num_experts_per_tok`, `moe_intermediate_size`,
        `moe_shared_expert_intermediate_size`, `moe_latent_size`, `n_group`, `topk_group`,
        `routed_scaling_factor`, `norm_topk_prob`).
      norm_eps: every RMSNorm's epsilon (`layer_norm_epsilon`).
      tie_embeddings: the output matrix is the embedding's transpose.
      max_positions: `max_position_embeddings` (no position embedding reads it).
      model_type: the Hugging Face model type it was read from.
    """

    FAMILY: ClassVar[str] = "nemotron_h"
    vocab_size: int
    embed_dim: int
    num_layers: int
    layer_kinds: tuple[str, ...]
    num_heads: int = 1
    num_kv_heads: int = 1
    head_dim: int = 1
    mlp_dim: int = 0
    mlp_bias: bool = False
    moe_experts: int = 0
    moe_top_k: int = 0
    moe_mlp_dim: int = 0
    moe_shared_mlp_dim: int = 0
    moe_latent_dim: int = 0
    moe_groups: int = 1
    moe_top_groups: int = 1
    moe_scale: float = 1.0
    moe_norm_topk_prob: bool = True
    norm_eps: float = 1e-5
    tie_embeddings: bool = False
    max_positions: int = 4096
    model_type: str = "nemotron_h"

    def __post_init__(self):
        if len(self.layer_kinds) != self.num_layers or set(self.layer_kinds) - set(KINDS):
            raise CheckpointError(
                f"the layer kinds {list(self.layer_kinds)[:8]} are not {self.num_layers} of "
                f"{', '.join(KINDS)}."
            )
        ssd.mixer_spec(self)
        self.attention_spec()
        if "moe" in self.layer_kinds:
            if not 0 < self.moe_top_k <= self.moe_experts or self.moe_experts % self.moe_groups:
                raise CheckpointError(
                    f"num_experts_per_tok={self.moe_top_k} of n_routed_experts="
                    f"{self.moe_experts} in n_group={self.moe_groups} groups is not a routing."
                )
            if not 0 < self.moe_top_groups <= self.moe_groups:
                raise CheckpointError(
                    f"topk_group={self.moe_top_groups} is not between 1 and n_group="
                    f"{self.moe_groups}."
                )

    def attention_spec(self) -> hybrid.AttentionSpec:
        return hybrid.spec_of(hybrid.AttentionSpec, self)

    def mlp_spec(self, prefix: str = "") -> hybrid.MLPSpec:
        """A dense squared-ReLU MLP's: the `mlp` layers' (`mlp_dim`), or with `prefix`
        `moe_shared_` the MoE layers' shared expert's (`moe_shared_mlp_dim`)."""
        return hybrid.spec_of(
            hybrid.MLPSpec, self, prefix, activation="relu2", gated=False, bias=self.mlp_bias
        )


def from_hf_config(c: dict[str, Any]) -> NemotronHConfig:
    """The architecture of a Hugging Face `nemotron_h` `config.json` (transformers 5.24's
    defaults and older field names: `hybrid_override_pattern`, `mamba_n_groups`, ...).

    Raises:
      CheckpointError: activations other than squared ReLU (MLPs) and SiLU (Mamba2), an unknown
        layer kind, inconsistent sizes. KeyError: a required field is missing.
    """
    types = c.get("layers_block_type") or c.get("layer_types")
    if types is None and c.get("hybrid_override_pattern") is not None:
        pattern = str(c["hybrid_override_pattern"])
        if set(pattern) - set(_PATTERN):
            raise CheckpointError(
                f"hybrid_override_pattern {pattern[:40]!r} has characters other than M E * -."
            )
        types = [_PATTERN[ch] for ch in pattern]
    types = list(types or ["linear_attention", "moe", "full_attention", "mlp"])
    if set(types) - set(_HF_KINDS):
        raise CheckpointError(
            f"layers_block_type names {sorted(set(types) - set(_HF_KINDS))[:3]}; known: "
            f"{', '.join(_HF_KINDS)}."
        )
    for key, default, allowed in (
        ("mlp_hidden_act", "relu2", "relu2"),
        ("mamba_hidden_act", "silu", "silu"),
    ):
        if (c.get(key) or default) != allowed:
            raise CheckpointError(f"{key} {str(c[key])[:40]!r} is not supported ({allowed}).")
    old = lambda new, name, default: c.get(new, c.get(name, default))  # noqa: E731
    low, _ = ssd.dt_limit(None, float(old("time_step_min", "mamba_dt_min", 0.001)))
    latent = c.get("moe_latent_size")
    common = llama_hf.hf_common(
        {**c, "num_hidden_layers": len(types)},  # its layer kinds count the layers
        "layer_norm_epsilon", num_heads=32, head_dim=128, mlp_dim=21504, max_positions=4096,
        norm_eps=1e-5,
    )  # fmt: skip
    return NemotronHConfig(
        **common,
        layer_kinds=tuple(_HF_KINDS[t] for t in types),
        mlp_bias=bool(c.get("mlp_bias", False)),
        ssm_heads=int(c.get("mamba_num_heads", 128)),
        ssm_head_dim=int(c.get("mamba_head_dim", 64)),
        ssm_groups=int(old("n_groups", "mamba_n_groups", 8)),
        ssm_state=int(c.get("ssm_state_size", 128)),
        ssm_conv=int(old("conv_kernel", "mamba_d_conv", 4)),
        ssm_chunk=int(old("chunk_size", "mamba_chunk_size", 128)),
        ssm_dt_min=low,  # NemotronHMamba2Mixer: (time_step_min, inf), not time_step_limit
        ssm_conv_bias=bool(old("use_conv_bias", "mamba_conv_bias", True)),
        ssm_in_bias=bool(c.get("use_bias", False)),
        ssm_out_bias=bool(c.get("use_bias", False)),
        moe_experts=int(c.get("n_routed_experts", c.get("num_local_experts", 8))),
        moe_top_k=int(c.get("num_experts_per_tok", 2)),
        moe_mlp_dim=int(c.get("moe_intermediate_size", 7688)),
        moe_shared_mlp_dim=int(c.get("moe_shared_expert_intermediate_size", 7688)),
        moe_latent_dim=int(latent) if latent else 0,
        moe_groups=int(c.get("n_group", 1)),
        moe_top_groups=int(c.get("topk_group", 1)),
        moe_scale=float(c.get("routed_scaling_factor", 1.0)),
        moe_norm_topk_prob=bool(c.get("norm_topk_prob", True)),
    )


def route(
    x: jax.Array,
    router: jax.Array,
    bias: jax.Array,
    *,
    top_k: int,
    groups: int,
    top_groups: int,
    norm_topk_prob: bool,
    scale: float,
) -> tuple[jax.Array, jax.Array]:
    """Sigmoid routing with a correction bias, limited to the best groups of experts
    (transformers' `NemotronHTopkRouter`, DeepSeek-V3's `noaux_tc`).

    Args:
      x: `[tokens, embed]`; router: `[embed, experts]`; bias: `[experts]`
        (`e_score_correction_bias`); the rest as `NemotronHConfig`'s `moe_*` fields.

    Returns:
      (weights `[tokens, top_k] float32`, experts `[tokens, top_k] int32`): the chosen experts'
      sigmoid scores (without the bias), renormalised if `norm_topk_prob`, times `scale`.
    """
    logits = jnp.dot(x.astype(jnp.float32), router.astype(jnp.float32))
    scores = jax.nn.sigmoid(logits)
    choice = scores + bias.astype(jnp.float32)
    tokens, experts = choice.shape
    if groups > 1:
        grouped = choice.reshape(tokens, groups, experts // groups)
        group_scores = jnp.sum(jax.lax.top_k(grouped, 2)[0], axis=-1)  # [tokens, groups]
        _, best = jax.lax.top_k(group_scores, top_groups)
        keep = jnp.zeros((tokens, groups), bool).at[jnp.arange(tokens)[:, None], best].set(True)
        choice = jnp.where(jnp.repeat(keep, experts // groups, axis=1), choice, -jnp.inf)
    _, chosen = jax.lax.top_k(choice, top_k)
    weights = jnp.take_along_axis(scores, chosen, axis=-1)
    if norm_topk_prob:
        weights = weights / (jnp.sum(weights, axis=-1, keepdims=True) + 1e-20)
    return weights * scale, chosen.astype(jnp.int32)


class MoE(nnx.Module):
    """Params: `router [embed, experts]` (float32, as transformers keeps it), `bias [experts]`
    (`e_score_correction_bias`), `up [experts, width, mlp]`, `down [experts, mlp, width]`
    (width: the latent width, or embed), with a latent width `latent_in [embed, latent]`,
    `latent_out [latent, embed]`; the shared expert `shared` (`hybrid.MLP`, squared ReLU)."""

    def __init__(self, cfg: NemotronHConfig, rngs: nnx.Rngs, dtype: jnp.dtype):
        d, e, f = cfg.embed_dim, cfg.moe_experts, cfg.moe_mlp_dim
        width = cfg.moe_latent_dim or d
        self.cfg = cfg
        self.router = normal_param(rngs, (d, e), ("embed", "experts"), d**-0.5, jnp.float32)
        self.bias = zeros_param((e,), ("experts",), jnp.float32)
        self.up = normal_param(rngs, (e, width, f), ("experts", "embed", "mlp"), width**-0.5, dtype)
        self.down = normal_param(rngs, (e, f, width), ("experts", "mlp", "embed"), f**-0.5, dtype)
        if cfg.moe_latent_dim:
            self.latent_in = normal_param(rngs, (d, width), ("embed", "mlp"), d**-0.5, dtype)
            self.latent_out = normal_param(rngs, (width, d), ("mlp", "embed"), width**-0.5, dtype)
        self.shared = hybrid.MLP(cfg.mlp_spec("moe_shared_"), rngs, dtype)

    def __call__(self, x: jax.Array) -> jax.Array:
        """`[B, T, embed]` -> `[B, T, embed]` in `x.dtype`: each token's chosen experts only,
        dropless and grouped (`experts.weighted_sum`), routed per `data`/`context` shard
        (`experts.per_token_shard`), plus the shared expert."""
        latent = (self.latent_in[...], self.latent_out[...]) if self.cfg.moe_latent_dim else ()
        arrays = (self.router[...], self.bias[...], self.up[...], self.down[...], *latent)
        return per_token_shard(self._routed, x, *arrays) + self.shared(x)

    def _routed(self, x, router, bias, up, down, *latent):
        cfg = self.cfg
        shape = x.shape
        flat = x.reshape(-1, shape[-1])
        weights, chosen = route(
            flat,
            router,
            bias,
            top_k=cfg.moe_top_k,
            groups=cfg.moe_groups,
            top_groups=cfg.moe_top_groups,
            norm_topk_prob=cfg.moe_norm_topk_prob,
            scale=cfg.moe_scale,
        )
        h = flat @ latent[0] if latent else flat
        out = weighted_sum(h, weights, chosen, (up, down), mlp=ReluSquared()).astype(x.dtype)
        if latent:
            out = out @ latent[1]
        return out.reshape(shape)


class Block(nnx.Module):
    def __init__(
        self, cfg: NemotronHConfig, kind: str, rngs: nnx.Rngs, dtype: jnp.dtype, attention: str
    ):
        self.kind, self.eps = kind, cfg.norm_eps
        self.norm = ones_param((cfg.embed_dim,), ("embed",), dtype)
        if kind == "mamba":
            self.mixer = ssd.Mamba2Mixer(ssd.mixer_spec(cfg), rngs, dtype)
        elif kind == "attention":
            self.mixer = hybrid.Attention(cfg.attention_spec(), rngs, dtype, attention)
        elif kind == "mlp":
            self.mixer = hybrid.MLP(cfg.mlp_spec(), rngs, dtype)
        else:
            self.mixer = MoE(cfg, rngs, dtype)

    def __call__(self, x: jax.Array, positions: jax.Array, segment_ids: jax.Array) -> jax.Array:
        h = rms_norm(x, self.norm[...], self.eps)
        if self.kind == "mamba":
            return x + self.mixer(h, segment_ids)
        if self.kind == "attention":
            return x + self.mixer(h, positions, segment_ids)
        return x + self.mixer(h)


class NemotronH(nnx.Module):
    """The language model. `__call__(tokens, positions, segment_ids)` gives final hidden states
    `[B, T, embed]` in the weights' dtype; `unembedding()` the `[embed, vocab]` output matrix."""

    def __init__(
        self, cfg: NemotronHConfig, rngs: nnx.Rngs, dtype: jnp.dtype = jnp.float32, attention="xla"
    ):
        self.cfg = cfg
        d = cfg.embed_dim
        self.embedding = normal_param(rngs, (cfg.vocab_size, d), ("vocab", "embed"), d**-0.5, dtype)
        self.layers = nnx.List(
            [Block(cfg, kind, rngs, dtype, attention) for kind in cfg.layer_kinds]
        )
        self.final_norm = ones_param((d,), ("embed",), dtype)
        if not cfg.tie_embeddings:
            self.lm_head = normal_param(
                rngs, (d, cfg.vocab_size), ("embed", "vocab"), d**-0.5, dtype
            )

    def __call__(self, tokens: jax.Array, positions: jax.Array, segment_ids: jax.Array):
        x = packed.take(self.embedding, tokens)
        x = run_layers(self.layers, x, positions, segment_ids)
        return rms_norm(x, self.final_norm[...], self.cfg.norm_eps)

    def unembedding(self) -> jax.Array:
        return self.embedding[...].T if self.cfg.tie_embeddings else self.lm_head[...]


LAYER = r"layers\.(?P<l>\d+)\.mixer\."
_LAYERS = {
    "mamba": Layer("state_space", "none"),
    "attention": Layer("attention", "none"),
    "mlp": Layer("none", "dense"),
    "moe": Layer("none", "moe"),
}


def rules(d: dict[str, Any]) -> list[dict[str, Any]]:
    """The mapping rules of a `nemotron_h` directory's weights (names without `backbone.`):
    every layer's one mixer under `layers/{l}/mixer/`, the experts' per-expert tensors stacked
    into `[experts, ...]`."""
    to, linear = "layers/{l}/mixer/", {"transpose": [1, 0]}
    return [
        *hybrid.embedding_rules(d, r"embeddings\.weight", r"norm_f\.weight"),
        {"from": r"layers\.(?P<l>\d+)\.norm\.weight", "to": "layers/{l}/norm"},
        *ssd.hf_rules(LAYER, to),
        *hybrid.attention_rules(LAYER, to),
        *hybrid.mlp_rules(LAYER, to),
        {"from": LAYER + r"gate\.weight", "to": to + "router", **linear},
        {"from": LAYER + r"gate\.e_score_correction_bias", "to": to + "bias"},
        {"from": LAYER + r"experts\.(?P<e>\d+)\.(?P<p>up|down)_proj\.weight", "to": to + "{p}",
         "stack": {"axis": 0, "index": "e"}, **linear},
        {"from": LAYER + r"fc1_latent_proj\.weight", "to": to + "latent_in", **linear},
        {"from": LAYER + r"fc2_latent_proj\.weight", "to": to + "latent_out", **linear},
        *hybrid.mlp_rules(LAYER + r"shared_experts\.", to + "shared/"),
    ]  # fmt: skip


FAMILY = Family(
    name="nemotron_h",
    config=NemotronHConfig,
    module=NemotronH,
    hf_sizes={
        **dict.fromkeys(
            ("n_routed_experts", "num_local_experts", "num_experts_per_tok"), ("moe_experts", 0)
        ),
        "moe_intermediate_size": ("moe_mlp_dim", 1),
        "moe_shared_expert_intermediate_size": ("moe_shared_mlp_dim", 1),  # always built
        **dict.fromkeys(("chunk_size", "mamba_chunk_size"), ("ssm_chunk", 1)),
        **dict.fromkeys(("conv_kernel", "mamba_d_conv"), ("ssm_conv", 1)),
        "mamba_num_heads": ("ssm_heads", 1),
        "mamba_head_dim": ("ssm_head_dim", 1),
        **dict.fromkeys(("n_groups", "mamba_n_groups"), ("ssm_groups", 1)),
        "ssm_state_size": ("ssm_state", 1),
        "moe_latent_size": ("moe_latent_dim", 0),
        **dict.fromkeys(("n_group", "topk_group"), ("moe_groups", 1)),
    },
    hf_readers={"nemotron_h": from_hf_config},
    hf_rules=rules,
    hf_prefixes=("backbone.",),
    layers=lambda cfg: tuple(_LAYERS[kind] for kind in cfg.layer_kinds),
)
