"""Qwen3 (Hugging Face `qwen3`): the Llama decoder with an RMSNorm on each head of q and k
(`q_norm`/`k_norm`, weights `[head_dim]`, after the projection and before RoPE), a `head_dim`
independent of the hidden size, optional q/k/v/o biases (`attention_bias`) and Qwen2's optional
sliding window (`use_sliding_window`, `max_window_layers`, `layer_types`). As transformers 5.23's
`modeling_qwen3`. From GGUF: llama.cpp's architecture `qwen3`.
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
    """The architecture of a `qwen3` `config.json`.

    Raises:
      CheckpointError: an activation other than silu, an unsupported rope scaling, bad
        `layer_types`. KeyError: a required field is missing.
    """
    llama_hf.check_activation(c, "hidden_act", "silu", ("silu",))
    bias = bool(c.get("attention_bias", False))
    sliding = llama_hf.hf_sliding(
        c, int(c["num_hidden_layers"]), needs_flag=True, max_window_layers=True
    )
    return llama_hf.hf_config(c, qkv_bias=bias, o_bias=bias, qk_norm="head", **sliding)


def gguf_config(h: GGUFHeader, c: dict[str, Any]) -> dict[str, Any]:
    """A `qwen3` GGUF file's q, k, v and output biases (`attention_bias`), as it has them."""
    c["attention_bias"] = "blk.0.attn_q.bias" in h.tensors
    return c


FAMILY = Family(
    name="qwen3",
    config=LlamaConfig,
    module=MixtureLlama,
    hf_readers={"qwen3": read_config},
    hf_rules=llama_hf.rules,
    hf_prefixes=llama_hf.PREFIXES,
    gguf={"qwen3": GGUFArchitecture("qwen3", gguf_names.llama_rules, gguf_config)},
    layers=layer_kinds,
    limits=LIMITS,
)
