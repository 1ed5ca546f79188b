"""The Llama decoder with mixture-of-experts MLPs: Hugging Face `mixtral`, `qwen2_moe`,
`qwen3_moe` and `olmoe` (transformers 5.23), the layers of `LlamaConfig.moe_layers` running
`ppl_jax.models.moe.MoeMLP` (dropless, grouped; routing in float32) and the others the dense MLP.

- Mixtral: Mistral's attention (optional window), softmax top-2 renormalised, every layer sparse.
- Qwen2-MoE: Qwen2's attention (q/k/v biases), a shared expert scaled by
  `sigmoid(shared_expert_gate(x))`, sparse layers by `mlp_only_layers`/`decoder_sparse_step`.
- Qwen3-MoE: Qwen3's attention (per-head QK-norm), the same choice of sparse layers.
- OLMoE: pre-norms with QK-norm over the whole projection, every layer sparse; `clip_qkv` is
  refused (not implemented).

`MixtureLlama` is the registry's module for the `llama` family: without `moe_layers` it is
exactly `ppl_jax.models.llama.Llama`.
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
from flax import nnx

from ppl_jax.errors import CheckpointError
from ppl_jax.models import hf_config
from ppl_jax.models.llama import Llama, LlamaConfig
from ppl_jax.models.moe import MoeMLP, MoeSpec, sparse_layers


def spec(cfg: LlamaConfig) -> MoeSpec:
    """The `MoeSpec` of a config's sparse layers."""
    return MoeSpec(
        embed_dim=cfg.embed_dim,
        mlp_dim=cfg.moe_mlp_dim,
        num_experts=cfg.moe_experts,
        top_k=cfg.moe_top_k,
        norm_topk_prob=cfg.moe_norm_topk_prob,
        shared_mlp_dim=cfg.moe_shared_mlp_dim,
    )


class MixtureLlama(Llama):
    """`Llama` whose `moe_layers` hold a `MoeMLP` in place of the dense MLP."""

    def __init__(
        self,
        cfg: LlamaConfig,
        rngs: nnx.Rngs,
        dtype: jnp.dtype = jnp.float32,
        attention: str = "xla",
    ):
        super().__init__(cfg, rngs, dtype, attention)
        for i in cfg.moe_layers:
            self.layers[i].mlp = MoeMLP(spec(cfg), rngs, dtype)


def from_hf_config(c: dict[str, Any]) -> LlamaConfig:
    """The architecture of a `mixtral`, `qwen2_moe`, `qwen3_moe` or `olmoe` `config.json`.

    Raises:
      CheckpointError: an activation other than silu, OLMoE's `clip_qkv`, an unsupported rope
        scaling, bad `layer_types`. KeyError: a required field is missing.
    """
    model_type = c["model_type"]
    hf_config.check_activation(c, "hidden_act", "silu", ("silu",))
    if c.get("clip_qkv") is not None:
        raise CheckpointError("clip_qkv is not supported (OLMoE's clamp of q, k and v).")
    if "num_experts" not in c and "num_local_experts" in c and model_type != "mixtral":
        # transformers 5 writes Qwen3-MoE's (attribute-mapped) num_experts as num_local_experts
        c = {**c, "num_experts": c["num_local_experts"]}
    moe = MoeSpec.from_hf_config(c)
    layers = int(c["num_hidden_layers"])
    fields: dict[str, Any] = {}
    if model_type == "mixtral":
        fields.update(hf_config.hf_sliding(c, "mistral", layers))
    elif model_type in ("qwen2_moe", "qwen3_moe"):
        fields.update(hf_config.hf_sliding(c, "qwen2", layers))
        bias = bool(c.get("attention_bias", False))
        if model_type == "qwen2_moe":
            fields.update(qkv_bias=bool(c.get("qkv_bias", True)))
        else:
            fields.update(qkv_bias=bias, o_bias=bias, qk_norm="head")
    else:  # olmoe
        bias = bool(c.get("attention_bias", False))
        fields.update(qkv_bias=bias, o_bias=bias, qk_norm="projection")
    return hf_config.hf_config(
        c,
        moe_layers=sparse_layers(c),
        moe_experts=moe.num_experts,
        moe_mlp_dim=moe.mlp_dim,
        moe_top_k=moe.top_k,
        moe_norm_topk_prob=moe.norm_topk_prob,
        moe_shared_mlp_dim=moe.shared_mlp_dim,
        **fields,
    )
