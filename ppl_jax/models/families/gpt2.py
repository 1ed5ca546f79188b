"""GPT-2 (Hugging Face `gpt2`; `ppl_jax.models.gpt2`): its `config.json` (transformers' defaults)
and its weights as transformers 5.23's `modeling_gpt2` stores them: `Conv1D` weights `[in, out]`,
the fused `c_attn` (`[embed, 3 * embed]`: q, then k, then v) split into q, k and v of
`[embed, heads, head_dim]`, names with or without the `transformer.` head, and the causal-mask
buffers of old checkpoints (`attn.bias`, `attn.masked_bias`) left unused. From GGUF (llama.cpp's
architecture `gpt2`): the `Conv1D` weights stored transposed (`[out, in]`), `c_attn` fused as
`attn_qkv`.
"""

from __future__ import annotations

from typing import Any

from ppl_jax.models import gguf_names
from ppl_jax.models.gguf_names import GGUFArchitecture, GGUFHeader
from ppl_jax.models.gpt2 import GPT2, GPT2Config
from ppl_jax.models.registry import Family

_LAYER = r"h\.(?P<l>\d+)\."


def read_config(c: dict[str, Any]) -> GPT2Config:
    """The architecture of a `gpt2` `config.json`.

    Raises:
      CheckpointError: an unsupported activation. KeyError: a required field is missing.
    """
    d = int(c["n_embd"])
    return GPT2Config(
        vocab_size=int(c["vocab_size"]),
        embed_dim=d,
        num_layers=int(c["n_layer"]),
        num_heads=int(c["n_head"]),
        mlp_dim=int(c.get("n_inner") or 4 * d),
        max_positions=int(c.get("n_positions") or c["n_ctx"]),
        norm_eps=float(c.get("layer_norm_epsilon", 1e-5)),
        activation=c.get("activation_function", "gelu_new"),
        scale_attn_weights=bool(c.get("scale_attn_weights", True)),
        scale_attn_by_inverse_layer_idx=bool(c.get("scale_attn_by_inverse_layer_idx", False)),
        tie_embeddings=bool(c.get("tie_word_embeddings", True)),
    )


def rules(d: dict[str, Any]) -> list[dict[str, Any]]:
    """The mapping rules of a GPT-2 description's weights (names without `transformer.`)."""
    qkv = [f"layers/{{l}}/attn/{p}" for p in "qkv"]
    out = [
        {"from": r"wte\.weight", "to": "embedding"},
        {"from": r"wpe\.weight", "to": "position_embedding"},
        {"from": r"ln_f\.weight", "to": "final_norm"},
        {"from": r"ln_f\.bias", "to": "final_norm_bias"},
        {"from": r"lm_head\.weight", "to": None} if d["tie_embeddings"] else
        {"from": r"lm_head\.weight", "to": "lm_head", "transpose": [1, 0]},
        {"from": _LAYER + r"attn\.(?:masked_)?bias", "to": None},  # causal-mask buffers
        {"from": _LAYER + r"attn\.c_attn\.weight", "to": qkv, "split": {"axis": 1},
         "reshape": ["embed_dim", "num_heads", -1]},
        {"from": _LAYER + r"attn\.c_attn\.bias", "to": [n + "_bias" for n in qkv],
         "split": {"axis": 0}, "reshape": ["num_heads", -1]},
        {"from": _LAYER + r"attn\.c_proj\.weight", "to": "layers/{l}/attn/o",
         "reshape": ["num_heads", -1, "embed_dim"]},
        {"from": _LAYER + r"attn\.c_proj\.bias", "to": "layers/{l}/attn/o_bias"},
        {"from": _LAYER + r"mlp\.c_fc\.weight", "to": "layers/{l}/mlp/fc"},
        {"from": _LAYER + r"mlp\.c_fc\.bias", "to": "layers/{l}/mlp/fc_bias"},
        {"from": _LAYER + r"mlp\.c_proj\.weight", "to": "layers/{l}/mlp/proj"},
        {"from": _LAYER + r"mlp\.c_proj\.bias", "to": "layers/{l}/mlp/proj_bias"},
    ]  # fmt: skip
    for ours, theirs in (("attn_norm", "ln_1"), ("mlp_norm", "ln_2")):
        out.append({"from": _LAYER + theirs + r"\.weight", "to": "layers/{l}/" + ours})
        out.append({"from": _LAYER + theirs + r"\.bias", "to": "layers/{l}/" + ours + "_bias"})
    return out


def gguf_config(h: GGUFHeader, c: dict[str, Any]) -> dict[str, Any]:
    """A `gpt2` GGUF file's `config.json`, in GPT-2's own names (`n_embd`, ...), from the sizes
    every architecture shares (`c`) and its MLP width and LayerNorm epsilon."""
    return {
        "model_type": c["model_type"], "vocab_size": c["vocab_size"], "n_embd": c["hidden_size"],
        "n_layer": c["num_hidden_layers"], "n_head": c["num_attention_heads"],
        "n_positions": c["max_position_embeddings"],
        "n_inner": h.key("feed_forward_length", None),
        "layer_norm_epsilon": h.key("attention.layer_norm_epsilon", 1e-5),
        "tie_word_embeddings": c["tie_word_embeddings"],
    }  # fmt: skip


def gguf_rules(d: dict[str, Any]) -> list[dict[str, Any]]:
    """The mapping rules of a `gpt2` GGUF file's tensors: llama.cpp's converter stores the
    `Conv1D` weights transposed (`[out, in]`) and keeps the fused `c_attn` (`attn_qkv`: rows q,
    then k, then v)."""
    layer, qkv = gguf_names.LAYER, [f"layers/{{l}}/attn/{p}" for p in "qkv"]
    out = [
        {"from": r"token_embd\.weight", "to": "embedding"},
        {"from": r"position_embd\.weight", "to": "position_embedding"},
        {"from": r"output_norm\.weight", "to": "final_norm"},
        {"from": r"output_norm\.bias", "to": "final_norm_bias"},
        {"from": r"output\.weight", "to": "lm_head", "transpose": [1, 0]},
        {"from": layer + r"attn_qkv\.weight", "to": qkv, "split": {"axis": 0},
         "transpose": [1, 0], "reshape": ["embed_dim", "num_heads", -1]},
        {"from": layer + r"attn_qkv\.bias", "to": [n + "_bias" for n in qkv],
         "split": {"axis": 0}, "reshape": ["num_heads", -1]},
        {"from": layer + r"attn_output\.weight", "to": "layers/{l}/attn/o",
         "transpose": [1, 0], "reshape": ["num_heads", -1, "embed_dim"]},
        {"from": layer + r"attn_output\.bias", "to": "layers/{l}/attn/o_bias"},
        {"from": layer + r"ffn_up\.weight", "to": "layers/{l}/mlp/fc", "transpose": [1, 0]},
        {"from": layer + r"ffn_up\.bias", "to": "layers/{l}/mlp/fc_bias"},
        {"from": layer + r"ffn_down\.weight", "to": "layers/{l}/mlp/proj",
         "transpose": [1, 0]},
        {"from": layer + r"ffn_down\.bias", "to": "layers/{l}/mlp/proj_bias"},
    ]  # fmt: skip
    for theirs, ours in (("attn_norm", "attn_norm"), ("ffn_norm", "mlp_norm")):
        out.append({"from": layer + theirs + r"\.weight", "to": "layers/{l}/" + ours})
        out.append({"from": layer + theirs + r"\.bias", "to": "layers/{l}/" + ours + "_bias"})
    return out


FAMILY = Family(
    name="gpt2",
    config=GPT2Config,
    module=GPT2,
    hf_readers={"gpt2": read_config},
    hf_rules=rules,
    hf_prefixes=("transformer.",),
    gguf={"gpt2": GGUFArchitecture("gpt2", gguf_rules, gguf_config, llama_like=False)},
)
