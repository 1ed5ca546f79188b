"""The Llama decoder with mixture-of-experts MLPs: the layers of `LlamaConfig.moe_layers` run
`ppl_jax.models.layers.moe.dropless.MoeMLP` (dropless, grouped; routing in float32) and the others
the dense MLP. The Hugging Face mixtures (`mixtral`, `qwen2_moe`, `qwen3_moe`, `olmoe`) are read by
`ppl_jax.models.families.mixture`.

`MixtureLlama` is the module of the `llama` description family: without `moe_layers` it is
exactly `ppl_jax.models.decoders.llama.Llama`.
"""

from __future__ import annotations

import jax.numpy as jnp
from flax import nnx

from ppl_jax.models.decoders.llama import Llama, LlamaConfig
from ppl_jax.models.family import Layer, Limit
from ppl_jax.models.layers.moe.dropless import MoeMLP, MoeSpec

# What every family built on `MixtureLlama` refuses: nothing so far. Its mixture-of-experts
# layers route per (data, context) shard (`ppl_jax.models.layers.moe.dropless.moe_mlp`), so they run
# under a context axis too; a family adds its own limits to these.
LIMITS: tuple[Limit, ...] = ()


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

    def make_mlp(self, cfg: LlamaConfig, layer: int, rngs: nnx.Rngs, dtype: jnp.dtype):
        if layer in cfg.moe_layers:
            return MoeMLP(spec(cfg), rngs, dtype)
        return super().make_mlp(cfg, layer, rngs, dtype)


def layer_kinds(cfg: LlamaConfig) -> tuple[Layer, ...]:
    """Attention on every layer (`sliding` where windowed), a MoE MLP on `moe_layers`."""
    return tuple(
        Layer(
            "attention",
            "moe" if i in cfg.moe_layers else "dense",
            "sliding" if i in cfg.sliding_layers else "",
        )
        for i in range(cfg.num_layers)
    )
