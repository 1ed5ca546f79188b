"""OLMo 2 and OLMo 3 (Hugging Face `olmo2`, `olmo3`): the Llama decoder without pre-norms, with an
RMSNorm after attention and after the MLP (`h = x + norm(attn(x))`, `y = h + norm(mlp(h))`) and
QK-norm over the whole q and k projections (weights `[heads * head_dim]`, before the split into
heads). OLMo 3 adds a sliding window on the layers `layer_types` names (by default three of every
four, the fourth full) and `rope_parameters` per layer type (e.g. yarn on the full layers). As
transformers 5.23's `modeling_olmo2` and `modeling_olmo3`.
"""

from __future__ import annotations

from typing import Any

from ppl_jax.models import hf_config
from ppl_jax.models.llama import LlamaConfig


def from_hf_config(c: dict[str, Any]) -> LlamaConfig:
    """The architecture of an `olmo2` or `olmo3` `config.json`.

    Raises:
      CheckpointError: an activation other than silu, an unsupported rope scaling, bad
        `layer_types`. KeyError: a required field is missing.
    """
    hf_config.check_activation(c, "hidden_act", "silu", ("silu",))
    layers = int(c["num_hidden_layers"])
    sliding = {}
    if c["model_type"] == "olmo3":
        default = [
            "full_attention" if (i + 1) % 4 == 0 else "sliding_attention" for i in range(layers)
        ]
        sliding = hf_config.hf_sliding({"sliding_window": 4096, **c}, "olmo3", layers, default)
    bias = bool(c.get("attention_bias", False))
    return hf_config.hf_config(
        c, qkv_bias=bias, o_bias=bias, qk_norm="projection", norm_layout="post", **sliding
    )
