"""OLMo 2 and OLMo 3 (Hugging Face `olmo2`, `olmo3`): the Llama decoder without pre-norms, with an
RMSNorm after attention and after the MLP (`h = x + norm(attn(x))`, `y = h + norm(mlp(h))`) and
QK-norm over the whole q and k projections (weights `[heads * head_dim]`, before the split into
heads). OLMo 3 adds a sliding window on the layers `layer_types` names (by default three of every
four, the fourth full) and `rope_parameters` per layer type (e.g. yarn on the full layers). As
transformers 5.23's `modeling_olmo2` and `modeling_olmo3`. From GGUF: llama.cpp's architecture
`olmo2`, which OLMo 3 is converted as too (with a window).
"""

from __future__ import annotations

from typing import Any

from ppl_jax.models import gguf_names
from ppl_jax.models.decoders import llama_hf
from ppl_jax.models.decoders.llama import LlamaConfig
from ppl_jax.models.decoders.llama_moe import LIMITS, MixtureLlama, layer_kinds
from ppl_jax.models.family import Family
from ppl_jax.models.gguf_names import GGUFArchitecture, GGUFHeader


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


def gguf_config(h: GGUFHeader, c: dict[str, Any]) -> dict[str, Any]:
    """An `olmo2` GGUF file's biases, as it has them; with a window it is OLMo 3 (`olmo3`),
    whose sliding layers are those of `attention.sliding_window_pattern` when it is a list."""
    c["attention_bias"] = "blk.0.attn_q.bias" in h.tensors
    window = h.key("attention.sliding_window", 0)
    if window:
        pattern = h.key("attention.sliding_window_pattern", None)
        c.update(model_type="olmo3", sliding_window=window)
        if isinstance(pattern, list):
            c["layer_types"] = gguf_names.layer_types(pattern)
    return c


FAMILY = Family(
    name="olmo",
    config=LlamaConfig,
    module=MixtureLlama,
    hf_readers={"olmo2": read_config, "olmo3": read_config},
    hf_rules=llama_hf.rules,
    hf_prefixes=llama_hf.PREFIXES,
    gguf={"olmo2": GGUFArchitecture("olmo2", gguf_names.llama_rules, gguf_config)},
    layers=layer_kinds,
    limits=LIMITS,
)
