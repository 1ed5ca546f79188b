"""GPT-OSS (Hugging Face `gpt_oss`; OpenAI 2025, "gpt-oss-120b & gpt-oss-20b Model Card"), as
transformers 5.24's `modeling_gpt_oss` computes it:

- grouped-query attention with biases on q, k, v and o (`attention_bias`, default true) and
  learned attention sinks: one logit per query head that joins each row's softmax and is then
  dropped (`eager_attention_forward`'s `sinks`; `ppl_jax.models.layers.attention.attend(sinks=)`);
- a sliding window (`sliding_window`, 128) on the layers `layer_types` names `sliding_attention`
  (by default the even layers: 0, 2, ...), full attention on the others;
- rotary embedding of the two halves of each head with YaRN (by default factor 32 past 4,096
  positions, `rope_theta` 150,000, no truncation; cos and sin times YaRN's factor);
- on every layer a routed block (`ppl_jax.models.layers.moe.routing`, `softmax_of_chosen`): router
  logits with a bias, the `num_experts_per_tok` largest, softmax over those; experts with biases and
  the clamped SwiGLU (`swiglu_alpha` 1.702, `swiglu_limit` 7; gate and up columns interleaved in the
  stored `gate_up_proj`); untied embeddings.

The published checkpoints' MXFP4 experts (`quantization_config` `mxfp4`: `*_blocks` and
`*_scales`) are dequantized where they are read (`ppl_jax.checkpoints.quantized.parts`).
cuDNN adds the sinks after its partial attention (`ppl_jax.models.layers.split_merge.with_sinks`),
its window on its sliding layers. Verified under a context axis
(tests/slow/test_frontier_context.py). From GGUF (llama.cpp's architecture `gpt-oss`): gate and
up stored apart, the norm after attention (`post_attention_norm`) as the MLP's.
"""

from __future__ import annotations

import dataclasses
import numbers
from typing import Any, ClassVar

import jax.numpy as jnp
from flax import nnx

from ppl_jax.errors import CheckpointError, quoted
from ppl_jax.models import gguf_names
from ppl_jax.models.decoders import llama_hf
from ppl_jax.models.decoders.llama import Attention, Llama, LlamaConfig
from ppl_jax.models.family import Family, Layer
from ppl_jax.models.gguf_names import GGUFArchitecture, GGUFHeader
from ppl_jax.models.layers.core import zeros_param
from ppl_jax.models.layers.moe import routing

# transformers 5.24's GptOssConfig rope_parameters when a config gives none.
DEFAULT_ROPE = {
    "rope_type": "yarn",
    "factor": 32.0,
    "beta_fast": 32.0,
    "beta_slow": 1.0,
    "truncate": False,
    "original_max_position_embeddings": 4096,
}


@dataclasses.dataclass(frozen=True)
class GptOssConfig(LlamaConfig):
    """`LlamaConfig` with sinks and the clamped SwiGLU's constants.

    Attributes:
      attn_sinks: learned attention sinks on every layer (the description key
        `ppl_jax.models.layers.attention.resolve_for` reads).
      swiglu_alpha, swiglu_limit: the experts' `sigmoid(alpha * g)` and clamp.
    """

    attn_sinks: bool = True
    swiglu_alpha: float = 1.702
    swiglu_limit: float = 7.0

    FAMILY: ClassVar[str] = "gpt_oss"


class SinkAttention(Attention):
    """Llama's attention with a learned sink logit per query head, `sinks [heads]`."""

    def __init__(self, cfg, rngs, dtype, window=None, attention="xla"):
        super().__init__(cfg, rngs, dtype, window, attention)
        self.sinks = zeros_param((cfg.num_heads,), ("heads",), dtype)

    def attend_options(self) -> dict[str, Any]:
        return {"sinks": self.sinks[...]}


def routed_spec(cfg: GptOssConfig) -> routing.RoutedSpec:
    """The `RoutedSpec` of every layer."""
    return routing.RoutedSpec(
        "softmax_of_chosen",
        cfg.embed_dim,
        cfg.moe_mlp_dim,
        cfg.moe_experts,
        cfg.moe_top_k,
        alpha=cfg.swiglu_alpha,
        limit=cfg.swiglu_limit,
    )


class GptOss(Llama):
    """The Llama decoder whose layers attend with sinks (`SinkAttention`) and hold a routed
    block (`routing.RoutedMLP`)."""

    def make_attention(
        self, cfg: GptOssConfig, layer: int, rngs: nnx.Rngs, dtype: jnp.dtype, attention: str
    ) -> nnx.Module:
        if not cfg.attn_sinks:
            return super().make_attention(cfg, layer, rngs, dtype, attention)
        window = cfg.layer_window(layer)
        return SinkAttention(cfg, rngs, dtype, window, attention)

    def make_mlp(self, cfg: GptOssConfig, layer: int, rngs: nnx.Rngs, dtype: jnp.dtype):
        if layer in cfg.moe_layers:
            return routing.RoutedMLP(routed_spec(cfg), rngs, dtype)
        return super().make_mlp(cfg, layer, rngs, dtype)


def read_config(c: dict[str, Any]) -> GptOssConfig:
    """The architecture of a `gpt_oss` `config.json` (transformers 5.24's defaults).

    Raises:
      CheckpointError: an activation other than silu, an unsupported rope scaling, bad
        `layer_types`. KeyError: a required field is missing.
    """
    llama_hf.check_activation(c, "hidden_act", "silu", ("silu",))
    n = int(c["num_hidden_layers"])
    alternate = ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(n)]
    bias = bool(c.get("attention_bias", True))
    experts = int(c.get("num_local_experts", 128))
    rope = c.get("rope_parameters") or c.get("rope_scaling") or DEFAULT_ROPE
    return llama_hf.hf_config(
        {"rope_theta": 150000.0, "rms_norm_eps": 1e-5, **c, "rope_parameters": rope},
        config=GptOssConfig,
        qkv_bias=bias,
        o_bias=bias,
        moe_layers=tuple(range(n)),
        moe_experts=experts,
        moe_mlp_dim=int(c["intermediate_size"]),
        moe_top_k=int(c.get("num_experts_per_tok", 4)),
        swiglu_alpha=float(c.get("swiglu_alpha", 1.702)),
        swiglu_limit=float(c.get("swiglu_limit", 7.0)),
        **llama_hf.hf_sliding({"sliding_window": 128, **c}, n, alternate),
    )


def rules(d: dict[str, Any]) -> list[dict[str, Any]]:
    """The Llama rules (embeddings, norms, attention with biases) with each layer's sinks,
    router and experts (gate and up interleaved in `gate_up_proj`, split here)."""
    layer = llama_hf.LAYER
    interleaved = ["moe_experts", "embed_dim", "moe_mlp_dim", 2]
    return [
        {"from": layer + r"self_attn\.sinks", "to": "layers/{l}/attn/sinks"},
        {"from": layer + r"mlp\.router\.weight", "to": "layers/{l}/mlp/router",
         "transpose": [1, 0]},
        {"from": layer + r"mlp\.router\.bias", "to": "layers/{l}/mlp/router_bias"},
        {"from": layer + r"mlp\.experts\.gate_up_proj", "view": interleaved,
         "to": ["layers/{l}/mlp/gate", "layers/{l}/mlp/up"], "split": {"axis": 3, "squeeze": True}},
        {"from": layer + r"mlp\.experts\.gate_up_proj_bias", "view": interleaved[::2] + [2],
         "to": ["layers/{l}/mlp/gate_bias", "layers/{l}/mlp/up_bias"],
         "split": {"axis": 2, "squeeze": True}},
        {"from": layer + r"mlp\.experts\.down_proj", "to": "layers/{l}/mlp/down"},
        {"from": layer + r"mlp\.experts\.down_proj_bias", "to": "layers/{l}/mlp/down_bias"},
    ] + llama_hf.rules(d)  # fmt: skip


def gguf_config(h: GGUFHeader, c: dict[str, Any]) -> dict[str, Any]:
    """A `gpt-oss` GGUF file's window (128 unless it gives one; a window below 1 is refused),
    biases, the experts' width as
    `intermediate_size`, and YaRN without truncation, as the original's config (OpenAI's
    YaRN)."""
    window = h.key("attention.sliding_window", 128)
    if isinstance(window, bool) or not isinstance(window, numbers.Integral) or window < 1:
        raise CheckpointError(
            f"{h.path!r}: {h.arch}.attention.sliding_window={quoted(window, 20)} is no window "
            f"for GPT-OSS's sliding layers (llama.cpp would let them attend to no key); "
            f"re-convert the model with its window (128 for the released models)."
        )
    c.update(sliding_window=window,
             attention_bias="blk.0.attn_q.bias" in h.tensors,
             intermediate_size=h.key("expert_feed_forward_length"))  # fmt: skip
    if c["rope_parameters"].get("rope_type") == "yarn":
        c["rope_parameters"]["truncate"] = False
    return c


def gguf_rules(d: dict[str, Any]) -> list[dict[str, Any]]:
    """The Llama-like GGUF rules with GPT-OSS's norms: `attn_norm` before attention and
    `post_attention_norm` before the MLP."""
    norms = {"attn_norm": "attn_norm", "post_attention_norm": "mlp_norm"}
    return gguf_names.llama_rules(d, norms=norms)


def layer_kinds(cfg: GptOssConfig) -> tuple[Layer, ...]:
    """Attention with sinks on every layer (`sliding` where windowed), a routed block."""
    return tuple(
        Layer(
            "attention",
            "moe" if i in cfg.moe_layers else "dense",
            " ".join(["sinks"] * cfg.attn_sinks + ["sliding"] * (i in cfg.sliding_layers)),
        )
        for i in range(cfg.num_layers)
    )


FAMILY = Family(
    name="gpt_oss",
    config=GptOssConfig,
    module=GptOss,
    hf_sizes=dict.fromkeys(("num_local_experts", "num_experts_per_tok"), ("moe_experts", 0)),
    hf_readers={"gpt_oss": read_config},
    hf_rules=rules,
    hf_prefixes=llama_hf.PREFIXES,
    gguf={"gpt-oss": GGUFArchitecture("gpt_oss", gguf_rules, gguf_config)},
    layers=layer_kinds,
)
