"""Gemma 2 and Gemma 3 (Hugging Face `gemma2`, `gemma3_text`, and the text tower of `gemma3`):
the Llama decoder with RMSNorm `x̂·(1 + w)` in float32, the embedding times `sqrt(hidden)`
rounded to the weight dtype, a GELU-tanh gated MLP, four norms per block (input,
post-attention, pre-feedforward, post-feedforward), the attention scale
`query_pre_attn_scalar ** -0.5`, optional soft-caps `c·tanh(x / c)` on the attention scores
(`attn_logit_softcapping`, Gemma 2: 50) and on the logits (`final_logit_softcapping`, Gemma 2:
30), and local (sliding) and global layers by `layer_types` (Gemma 2: alternating; Gemma 3: five
local to one global). Gemma 3 adds a `(1 + w)` RMSNorm on each head of q and k and its own
`rope_parameters` per layer type (local θ 10k, global θ 1M, linear ×8 on 4B and larger). As
transformers 5.23's `modeling_gemma2` and `modeling_gemma3`.

The text tower of a multimodal `gemma3` checkpoint is read through its nested `text_config`
(`ppl_jax.checkpoints.formats.safetensors`). Refused: Gemma 3's `use_bidirectional_attention` (an
encoder, not a causal language model); cuDNN attention where the scores are soft-capped (Gemma 2).

From GGUF (llama.cpp's architectures `gemma2`, `gemma3`): norms stored as `1 + w`; what the file
leaves out is what llama.cpp runs it with: the attention scale `head_dim ** -0.5` except on the
27B models (`(hidden / heads) ** -0.5`, by their layer count), Gemma 3's one global layer in six
and local rotary base 10,000 unless the file says otherwise.
"""

from __future__ import annotations

from typing import Any

from ppl_jax.errors import CheckpointError
from ppl_jax.models import gguf_names
from ppl_jax.models.decoders import llama_hf
from ppl_jax.models.decoders.llama import LlamaConfig
from ppl_jax.models.decoders.llama_moe import LIMITS, MixtureLlama, layer_kinds
from ppl_jax.models.family import Family, Limit
from ppl_jax.models.gguf_names import GGUFArchitecture, GGUFHeader

ACTIVATIONS = ("gelu_pytorch_tanh", "gelu_new", "gelu")
# GGUF architecture -> the layer count of its 27B model, whose attention scale llama.cpp takes as
# (hidden / heads) ** -0.5.
_GGUF_27B = {"gemma2": 46, "gemma3": 62}


def read_config(c: dict[str, Any]) -> LlamaConfig:
    """The architecture of a `gemma2` or `gemma3_text` `config.json` (the text config of a
    `gemma3` one). Defaults are transformers 5.23's (Gemma 2's soft-caps 50 and 30, head_dim
    256, `query_pre_attn_scalar` 256, tied embeddings).

    Raises:
      CheckpointError: bidirectional attention, an unsupported activation or rope scaling, bad
        `layer_types`. KeyError: a required field is missing.
    """
    gemma2 = c["model_type"] == "gemma2"
    if c.get("use_bidirectional_attention"):
        raise CheckpointError(
            "use_bidirectional_attention makes this Gemma an encoder, not a causal language "
            "model; ppl_jax scores causal models only."
        )
    act = llama_hf.check_activation(c, "hidden_activation", "gelu_pytorch_tanh", ACTIVATIONS)
    layers = int(c["num_hidden_layers"])
    pattern = 2 if gemma2 else int(c.get("sliding_window_pattern") or 6)
    default = [
        "sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(layers)
    ]
    sliding = llama_hf.hf_sliding({"sliding_window": 4096, **c}, layers, default)
    caps = {"attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0} if gemma2 else {}
    attn_cap = c.get("attn_logit_softcapping", caps.get("attn_logit_softcapping"))
    final_cap = c.get("final_logit_softcapping", caps.get("final_logit_softcapping"))
    bias = bool(c.get("attention_bias", False))
    return llama_hf.hf_config(
        {"head_dim": 256, **c},
        tie_embeddings=bool(c.get("tie_word_embeddings", True)),
        qkv_bias=bias,
        o_bias=bias,
        qk_norm="none" if gemma2 else "head",
        norm_layout="sandwich",
        norm_offset=1.0,
        activation=act,
        embed_scale=True,
        query_scale=float(c.get("query_pre_attn_scalar", 256)) ** -0.5,
        attn_softcap=None if attn_cap is None else float(attn_cap),
        final_softcap=None if final_cap is None else float(final_cap),
        **sliding,
    )


def gguf_config(h: GGUFHeader, c: dict[str, Any]) -> dict[str, Any]:
    """A `gemma2` or `gemma3` GGUF file's fields that llama.cpp fixes or reads apart (see the
    module docstring): the attention scale, GELU-tanh, the soft-caps (Gemma 3: none unless the
    file gives them), the sliding layers of `attention.sliding_window_pattern` (a list, or one
    global layer in every n: Gemma 2 two, Gemma 3 six; none without a window), Gemma 3's local
    rotary base (`rope.freq_base_swa`)."""
    gemma2 = h.arch == "gemma2"
    hidden, heads, layers = c["hidden_size"], c["num_attention_heads"], c["num_hidden_layers"]
    big = layers == _GGUF_27B[h.arch]
    c["query_pre_attn_scalar"] = hidden // heads if big else c["head_dim"]
    c["hidden_activation"] = "gelu_pytorch_tanh"
    for key in ("attn_logit_softcapping", "final_logit_softcapping"):
        value = h.key(key, None)
        if not gemma2 or value is not None:
            c[key] = value
    window = h.key("attention.sliding_window", 0)
    pattern = h.key("attention.sliding_window_pattern", 2 if gemma2 else 6)
    if isinstance(pattern, list):
        types = gguf_names.layer_types(pattern)
    else:
        pattern = int(pattern)
        types = ["sliding_attention" if pattern and i % pattern < pattern - 1 else
                 "full_attention" for i in range(layers)]  # fmt: skip
    if not window:
        types = ["full_attention"] * layers
    c.update(sliding_window=window or None, layer_types=types)
    if not gemma2:
        local = float(h.key("rope.freq_base_swa", 10000.0))
        c["rope_parameters"] = {
            "full_attention": dict(c["rope_parameters"]),
            "sliding_attention": {"rope_type": "default", "rope_theta": local},
        }
    return c


def gguf_rules(d: dict[str, Any]) -> list[dict[str, Any]]:
    """The Llama-like GGUF rules with every norm stored as `1 + w` (`offset: -1`)."""
    return gguf_names.llama_rules(d, offset=-1.0)


FAMILY = Family(
    name="gemma",
    config=LlamaConfig,
    module=MixtureLlama,
    hf_sizes={
        "sliding_window_pattern": ("max_positions", 0),  # 0: the default, 6
    },
    hf_readers={"gemma2": read_config, "gemma3_text": read_config},
    hf_rules=llama_hf.rules,
    hf_prefixes=llama_hf.PREFIXES,
    gguf={
        "gemma2": GGUFArchitecture("gemma2", gguf_rules, gguf_config),
        "gemma3": GGUFArchitecture("gemma3_text", gguf_rules, gguf_config),
    },
    layers=layer_kinds,
    limits=LIMITS
    + (
        Limit(
            "cudnn",
            "cuDNN attention cannot soft-cap attention scores (attn_logit_softcapping)",
            lambda cfg: cfg.attn_softcap is not None,
        ),
    ),
)
