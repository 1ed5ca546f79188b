"""OLMo 2 and OLMo 3 (Hugging Face `olmo2`, `olmo3`): the Llama decoder without pre-norms, with an
RMSNorm after attention and after the MLP (`h = x + norm(attn(x))`, `y = h + norm(mlp(h))`) and
QK-norm over the whole q and k projections (weights `[heads * head_dim]`, before the split into
heads). OLMo 3 adds a sliding window on the layers `layer_types` names (by default three of every
four, the fourth full) and `rope_parameters` per layer type (e.g. yarn on the full layers). As
transformers 5.23's `modeling_olmo2` and `modeling_olmo3`.
"""

from __future__ import annotations

from typing import Any

from ppl_jax.models import llama_hf
from ppl_jax.models.llama import LlamaConfig
from ppl_jax.models.mixture import LIMITS, MixtureLlama, layer_kinds
from ppl_jax.models.registry import Family


def read_config(c: dict[str, Any]) -> LlamaConfig:
    """The architecture of an `olmo2` or `olmo3` `config.json`.

    Raises:
      CheckpointError: an activation other than silu, an unsupported rope scaling, bad
        `layer_types`. KeyError: a required field is missing.
    """
    llama_hf.check_activation(c, "hidden_act", "silu", ("silu",))
    layers = int(c["num_hidden_layers"])
    sliding = {}
    if c["model_type"] == "olmo3":
        default = [
            "full_attention" if (i + 1) % 4 == 0 else "sliding_attention" for i in range(layers)
        ]
        sliding = llama_hf.hf_sliding({"sliding_window": 4096, **c}, layers, default)
    bias = bool(c.get("attention_bias", False))
    return llama_hf.hf_config(
        c, qkv_bias=bias, o_bias=bias, qk_norm="projection", norm_layout="post", **sliding
    )


FAMILY = Family(
    name="olmo",
    config=LlamaConfig,
    module=MixtureLlama,
    hf_readers={"olmo2": read_config, "olmo3": read_config},
    hf_rules=llama_hf.rules,
    hf_prefixes=llama_hf.PREFIXES,
    layers=layer_kinds,
    limits=LIMITS,
)
