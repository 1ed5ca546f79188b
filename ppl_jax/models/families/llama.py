"""Llama, Mistral and Qwen2 (Hugging Face `llama`, `mistral`, `qwen2`): the Llama decoder of
`ppl_jax.models.decoders.llama` (with the mixture-of-experts layers of
`ppl_jax.models.decoders.llama_moe` where a description has them), and the owner of its description
family `llama`, which the Llama-like families (Qwen3, OLMo, Gemma, Phi-3, the mixtures) build too.

- Llama: optional `attention_bias` (q, k, v and output) and `mlp_bias`; no sliding window.
- Mistral: a sliding window on every layer (`sliding_window`).
- Qwen2: q/k/v biases; a window only with `use_sliding_window`, on the layers `layer_types`
  names (or from `max_window_layers` on).

From GGUF (llama.cpp's architectures `llama`, which Mistral is converted as too, without its
window, and `qwen2`): Llama's biases when the file has them, and its q and k rows un-permuted.

Defaults are transformers 5.23's (`rms_norm_eps` 1e-6, untied embeddings, `head_dim` = hidden /
heads).
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
    """The architecture of a `llama`, `mistral` or `qwen2` `config.json`.

    Raises:
      CheckpointError: an activation other than silu, an unsupported rope scaling, bad
        `layer_types`. KeyError: a required field is missing.
    """
    model_type = c["model_type"]
    llama_hf.check_activation(c, "hidden_act", "silu", ("silu",))
    attention_bias = model_type == "llama" and bool(c.get("attention_bias", False))
    layers = int(c["num_hidden_layers"])
    sliding = {}
    if model_type == "mistral":
        sliding = llama_hf.hf_sliding(c, layers)
    elif model_type == "qwen2":
        sliding = llama_hf.hf_sliding(c, layers, needs_flag=True, max_window_layers=True)
    return llama_hf.hf_config(
        c,
        qkv_bias=attention_bias or model_type == "qwen2",
        o_bias=attention_bias,
        mlp_bias=model_type == "llama" and bool(c.get("mlp_bias", False)),
        **sliding,
    )


def gguf_config(h: GGUFHeader, c: dict[str, Any]) -> dict[str, Any]:
    """A `llama` GGUF file's biases: q, k, v and output (`attention_bias`), the MLP's
    (`mlp_bias`), as the file has them."""
    c["attention_bias"] = "blk.0.attn_q.bias" in h.tensors
    c["mlp_bias"] = "blk.0.ffn_down.bias" in h.tensors
    return c


def gguf_rules(d: dict[str, Any]) -> list[dict[str, Any]]:
    """The Llama-like GGUF rules, with the q and k rows that llama.cpp's converter permutes per
    head into interleaved pairs (`LlamaModel.permute`) turned back into halves."""
    return gguf_names.llama_rules(d, rope_pairs=True)


FAMILY = Family(
    name="llama",
    config=LlamaConfig,
    module=MixtureLlama,
    hf_readers={"llama": read_config, "mistral": read_config, "qwen2": read_config},
    hf_rules=llama_hf.rules,
    hf_prefixes=llama_hf.PREFIXES,
    gguf={
        "llama": GGUFArchitecture("llama", gguf_rules, gguf_config),
        "qwen2": GGUFArchitecture("qwen2", gguf_names.llama_rules),
    },
    layers=layer_kinds,
    limits=LIMITS,
)
