"""DeepSeek-V3 (Hugging Face `deepseek_v3`; DeepSeek-AI 2024, "DeepSeek-V3 Technical Report"), as
transformers 5.24's `modeling_deepseek_v3` computes it:

- multi-head latent attention on every layer (`ppl_jax.models.layers.mla`: `q_lora_rank` (or one
  query projection when null), `kv_lora_rank`, rotary and non-rotary head dims `qk_rope_head_dim`
  and `qk_nope_head_dim`, values of `v_head_dim`; rotation of adjacent pairs with
  `rope_interleave`);
- the softmax scale `qk_head_dim ** -0.5`, times YaRN's `mscale(factor, mscale_all_dim) ** 2`
  (`mla.softmax_scale`), and YaRN's cos/sin factor `mscale / mscale_all_dim`
  (`ppl_jax.models.layers.rope`);
- dense SwiGLU MLPs (`intermediate_size`) on the first `first_k_dense_replace` layers, then
  routed blocks (`ppl_jax.models.layers.moe.routing`, `grouped_sigmoid`): `n_routed_experts` experts
  of `moe_intermediate_size`, sigmoid scores plus the correction bias `e_score_correction_bias` for
  the choice, `n_group` groups of which the best `topk_group` stay, `num_experts_per_tok` chosen,
  their scores renormalised (`norm_topk_prob`) and times `routed_scaling_factor`; a shared expert of
  `n_shared_experts * moe_intermediate_size`;
- the multi-token-prediction layers (`num_nextn_predict_layers`, stored as
  `model.layers.{num_hidden_layers + i}.*`) are not part of the causal LM and are left unread.

The description is a `LlamaConfig` whose `head_dim` is the rotary head dim (transformers'
`head_dim`), `num_kv_heads` the heads (MLA has no key-value groups) and `query_scale` the
softmax scale; the fields of its own are below.

The published checkpoints' FP8 weights (`quantization_config` `fp8`: float8_e4m3fn with
`weight_scale_inv` per 128 x 128 block) are dequantized where they are read
(`ppl_jax.checkpoints.quantized.parts`). cuDNN attention pads the values to the keys'
width (`ppl_jax.models.layers.split_merge.equal_widths`). Verified under a context axis (tests/slow/test_frontier_context.py).
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import jax.numpy as jnp
from flax import nnx

from ppl_jax.errors import CheckpointError
from ppl_jax.models.decoders import hybrid, llama_hf
from ppl_jax.models.decoders.llama import Llama, LlamaConfig
from ppl_jax.models.family import Family, Layer
from ppl_jax.models.layers import mla
from ppl_jax.models.layers.moe import routing

# Upper bounds of the latent sizes (DeepSeek-V3: 1536, 512, 128, 64, 128), far above them.
_MAX_LATENT = 1 << 16


@dataclasses.dataclass(frozen=True)
class DeepseekV3Config(LlamaConfig):
    """`LlamaConfig` (`head_dim`: the rotary head dim) with MLA's and the router's fields.

    Attributes:
      q_lora_rank: the query bottleneck (0: one query projection).
      kv_lora_rank, qk_nope_head_dim, v_head_dim: the key-value latent, the non-rotary query and
        key head dim, the value head dim.
      rope_interleave: rotate adjacent pairs (else the two halves).
      attention_bias: biases on `q_a`, `kv_a` and `o`.
      moe_groups, moe_top_groups, moe_scaling: `n_group`, `topk_group`,
        `routed_scaling_factor`.
      mtp_layers: the multi-token-prediction layers stored after the decoder's (unread).
    """

    q_lora_rank: int = 0
    kv_lora_rank: int = 512
    qk_nope_head_dim: int = 128
    v_head_dim: int = 128
    rope_interleave: bool = True
    attention_bias: bool = False
    moe_groups: int = 1
    moe_top_groups: int = 1
    moe_scaling: float = 1.0
    mtp_layers: int = 0

    FAMILY: ClassVar[str] = "deepseek_v3"

    def __post_init__(self):
        super().__post_init__()
        for name in ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "v_head_dim"):
            value = getattr(self, name)
            low = 0 if name == "q_lora_rank" else 1
            if (
                isinstance(value, bool)
                or not isinstance(value, int)
                or not low <= value <= _MAX_LATENT
            ):
                raise CheckpointError(
                    f"{name}={str(value)[:20]} is not a size ppl_jax builds (a whole number "
                    f"from {low} to {_MAX_LATENT:,})."
                )
        if not 0 <= self.mtp_layers <= 64:
            raise CheckpointError(f"num_nextn_predict_layers={self.mtp_layers} is not 0 to 64.")


def mla_spec(cfg: DeepseekV3Config) -> mla.MlaSpec:
    """The `MlaSpec` of every layer."""
    return hybrid.spec_of(
        mla.MlaSpec,
        cfg,
        qk_nope_dim=cfg.qk_nope_head_dim,
        qk_rope_dim=cfg.head_dim,
        v_dim=cfg.v_head_dim,
        bias=cfg.attention_bias,
        interleave=cfg.rope_interleave,
        softmax_scale=cfg.query_scale,
    )


def routed_spec(cfg: DeepseekV3Config) -> routing.RoutedSpec:
    """The `RoutedSpec` of the routed layers."""
    return hybrid.spec_of(
        routing.RoutedSpec, cfg, "moe_", router="grouped_sigmoid", num_experts=cfg.moe_experts
    )


class DeepseekV3(Llama):
    """The Llama decoder (pre-norms, dense SwiGLU) whose every layer attends by MLA
    (`mla.LatentAttention`) and whose `moe_layers` hold a routed block (`routing.RoutedMLP`)."""

    def make_attention(
        self, cfg: DeepseekV3Config, layer: int, rngs: nnx.Rngs, dtype: jnp.dtype, attention: str
    ) -> nnx.Module:
        return mla.LatentAttention(mla_spec(cfg), cfg, rngs, dtype, attention)

    def make_mlp(self, cfg: DeepseekV3Config, layer: int, rngs: nnx.Rngs, dtype: jnp.dtype):
        if layer in cfg.moe_layers:
            return routing.RoutedMLP(routed_spec(cfg), rngs, dtype)
        return super().make_mlp(cfg, layer, rngs, dtype)


def read_config(c: dict[str, Any]) -> DeepseekV3Config:
    """The architecture of a `deepseek_v3` `config.json` (transformers 5.24's defaults).

    Raises:
      CheckpointError: an activation other than silu, an unsupported rope scaling, sizes or
        groups that do not fit. KeyError: a required field is missing.
    """
    llama_hf.check_activation(c, "hidden_act", "silu", ("silu",))
    layers, heads = int(c["num_hidden_layers"]), int(c["num_attention_heads"])
    rope_dim = int(c.get("qk_rope_head_dim", 64))
    nope = int(c.get("qk_nope_head_dim", 128))
    experts = int(c.get("n_routed_experts", c.get("num_local_experts", 256)) or 0)
    first_dense = int(c.get("first_k_dense_replace", 3) or 0)
    moe_dim = int(c.get("moe_intermediate_size", 2048))
    rope = {**(c.get("rope_scaling") or {}), **(c.get("rope_parameters") or {})}
    q_lora = c.get("q_lora_rank", 1536)
    return llama_hf.hf_config(
        {**c, "head_dim": rope_dim, "num_key_value_heads": heads},
        config=DeepseekV3Config,
        q_lora_rank=int(q_lora or 0),
        kv_lora_rank=int(c.get("kv_lora_rank", 512)),
        qk_nope_head_dim=nope,
        v_head_dim=int(c.get("v_head_dim") or 128),
        rope_interleave=bool(c.get("rope_interleave", True)),
        attention_bias=bool(c.get("attention_bias", False)),
        query_scale=mla.softmax_scale(nope + rope_dim, rope),
        moe_layers=tuple(range(first_dense, layers)) if experts else (),
        moe_experts=experts,
        moe_mlp_dim=moe_dim,
        moe_top_k=int(c.get("num_experts_per_tok") or 8),
        moe_norm_topk_prob=bool(c.get("norm_topk_prob", True)),
        moe_shared_mlp_dim=moe_dim * int(c.get("n_shared_experts") or 0),
        moe_groups=int(c.get("n_group") or 1),
        moe_top_groups=int(c.get("topk_group") or 1),
        moe_scaling=float(c.get("routed_scaling_factor", 2.5)),
        mtp_layers=int(c.get("num_nextn_predict_layers", c.get("num_mtp_layers", 0)) or 0),
    )


def rules(d: dict[str, Any]) -> list[dict[str, Any]]:
    """The Llama rules (embeddings, norms, dense MLPs) after MLA's projections, the routed
    blocks' router, correction bias, experts (one tensor each, stacked) and shared expert, and
    the multi-token-prediction layers left unread."""
    n, linear = d["num_layers"], {"transpose": [1, 0]}
    mtp = "|".join(str(n + i) for i in range(d.get("mtp_layers", 0)))
    out: list[dict[str, Any]] = [{"from": rf"layers\.({mtp})\..+", "to": None}] if mtp else []
    attn, to = llama_hf.LAYER + r"self_attn\.", "layers/{l}/attn/"
    heads = {"transpose": [1, 0], "reshape": [-1, "num_heads", "qk_nope_head_dim + head_dim"]}
    out += [
        {"from": attn + r"q_a_proj\.weight", "to": to + "q_a", **linear},
        {"from": attn + r"q_a_proj\.bias", "to": to + "q_a_bias"},
        {"from": attn + r"q_a_layernorm\.weight", "to": to + "q_a_norm"},
        {"from": attn + r"q_b_proj\.weight", "to": to + "q_b", **heads},
        {"from": attn + r"q_proj\.weight", "to": to + "q", **heads},
        {"from": attn + r"kv_a_proj_with_mqa\.weight", "to": to + "kv_a", **linear},
        {"from": attn + r"kv_a_proj_with_mqa\.bias", "to": to + "kv_a_bias"},
        {"from": attn + r"kv_a_layernorm\.weight", "to": to + "kv_a_norm"},
        {"from": attn + r"kv_b_proj\.weight", "to": to + "kv_b", "transpose": [1, 0],
         "reshape": ["kv_lora_rank", "num_heads", "qk_nope_head_dim + v_head_dim"]},
        {"from": attn + r"o_proj\.weight", "to": to + "o", "transpose": [1, 0],
         "reshape": ["num_heads", "v_head_dim", "embed_dim"]},
        {"from": attn + r"o_proj\.bias", "to": to + "o_bias"},
    ]  # fmt: skip
    moe, to = llama_hf.LAYER + r"mlp\.", "layers/{l}/mlp/"
    out += [
        {"from": moe + r"gate\.weight", "to": to + "router", **linear},
        {"from": moe + r"gate\.e_score_correction_bias", "to": to + "router_bias"},
        {"from": moe + r"experts\.(?P<e>\d+)\.(?P<p>gate|up|down)_proj\.weight", "to": to + "{p}",
         "stack": {"axis": 0, "index": "e"}, **linear},
        {"from": moe + r"shared_experts\.(?P<p>gate|up|down)_proj\.weight",
         "to": to + "shared_{p}", **linear},
    ]  # fmt: skip
    return out + llama_hf.rules(d)


def layer_kinds(cfg: DeepseekV3Config) -> tuple[Layer, ...]:
    """Latent attention on every layer; a routed block on `moe_layers`, else a dense MLP."""
    return tuple(
        Layer("attention", "moe" if i in cfg.moe_layers else "dense", "latent")
        for i in range(cfg.num_layers)
    )


FAMILY = Family(
    name="deepseek_v3",
    config=DeepseekV3Config,
    module=DeepseekV3,
    hf_sizes={
        **dict.fromkeys(("first_k_dense_replace", "num_nextn_predict_layers"), ("num_layers", 0)),
        **dict.fromkeys(
            ("n_routed_experts", "num_local_experts", "n_shared_experts", "num_experts_per_tok"),
            ("moe_experts", 0),
        ),
        "moe_intermediate_size": ("moe_mlp_dim", 1),
        "kv_lora_rank": ("kv_lora_rank", 1),
        "q_lora_rank": ("q_lora_rank", 0),
        **dict.fromkeys(("qk_rope_head_dim", "qk_nope_head_dim"), ("head_dim", 0)),
        "v_head_dim": ("v_head_dim", 0),
        **dict.fromkeys(("n_group", "topk_group"), ("moe_groups", 1)),
    },
    hf_readers={"deepseek_v3": read_config},
    hf_rules=rules,
    hf_prefixes=llama_hf.PREFIXES,
    layers=layer_kinds,
)
