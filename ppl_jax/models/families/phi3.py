"""Phi-3 and Phi-4 (Hugging Face `phi3`): the Llama decoder whose checkpoints fuse q, k and v
into `qkv_proj` (the q rows, then k, then v) and gate and up into `gate_up_proj` (gate, then up;
split on reading by this family's rules), with `longrope` scaling (short or long factors by the
window's length against `original_max_position_embeddings`, which Phi-3 stores beside
`rope_parameters` and which wins), `partial_rotary_factor` (Phi-4-mini) and an optional sliding
window on every layer. As transformers 5.23's `modeling_phi3`.

From GGUF (llama.cpp's architecture `phi3`): q, k and v fused in `attn_qkv` (read by the
Llama-like GGUF rules), gate and up in `ffn_up`; `longrope` from the factor tensors
`rope_factors_long` and `rope_factors_short`.
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
    """The architecture of a `phi3` `config.json`.

    Raises:
      CheckpointError: an activation other than silu, an unsupported rope scaling. KeyError: a
        required field is missing.
    """
    llama_hf.check_activation(c, "hidden_act", "silu", ("silu",))
    return llama_hf.hf_config(c, **llama_hf.hf_sliding(c, int(c["num_hidden_layers"])))


def rules(d: dict[str, Any]) -> list[dict[str, Any]]:
    """The Llama rules with the fused `qkv_proj` (rows q, k, v) and `gate_up_proj` split."""
    q, kv = d["num_heads"] * d["head_dim"], d["num_kv_heads"] * d["head_dim"]
    fused = [
        {
            "from": llama_hf.LAYER + r"self_attn\.qkv_proj\.weight",
            "to": [f"layers/{{l}}/attn/{p}" for p in "qkv"],
            "split": {"axis": 0, "sizes": [q, kv, kv]},
            **llama_hf.HEADS_IN,
        },
        {
            "from": llama_hf.LAYER + r"mlp\.gate_up_proj\.weight",
            "to": ["layers/{l}/mlp/gate", "layers/{l}/mlp/up"],
            "split": {"axis": 0},
            "transpose": [1, 0],
        },
    ]
    return llama_hf.rules(d) + fused


def gguf_config(h: GGUFHeader, c: dict[str, Any]) -> dict[str, Any]:
    """A `phi3` GGUF file's window (none when it gives none) and its `longrope` scaling, the
    factors stored as the tensors `rope_factors_long` and `rope_factors_short`."""
    c.update(sliding_window=h.key("attention.sliding_window", 0) or None)
    if "rope_factors_long.weight" in h.tensors:
        c["rope_parameters"] = {
            "rope_type": "longrope", "rope_theta": c["rope_parameters"]["rope_theta"],
            "long_factor": h.rows("rope_factors_long.weight").tolist(),
            "short_factor": h.rows("rope_factors_short.weight").tolist(),
        }  # fmt: skip
        c["original_max_position_embeddings"] = h.key("rope.scaling.original_context_length")
    return c


def gguf_rules(d: dict[str, Any]) -> list[dict[str, Any]]:
    """The Llama-like GGUF rules with `ffn_up` (gate, then up) split."""
    fused = {
        "from": gguf_names.LAYER + r"ffn_up\.weight",
        "to": ["layers/{l}/mlp/gate", "layers/{l}/mlp/up"],
        "split": {"axis": 0},
        "transpose": [1, 0],
    }
    return [fused] + gguf_names.llama_rules(d)


FAMILY = Family(
    name="phi3",
    config=LlamaConfig,
    module=MixtureLlama,
    hf_readers={"phi3": read_config},
    hf_rules=rules,
    hf_prefixes=llama_hf.PREFIXES,
    gguf={"phi3": GGUFArchitecture("phi3", gguf_rules, gguf_config)},
    layers=layer_kinds,
    limits=LIMITS,
)
