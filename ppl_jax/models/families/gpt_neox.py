"""GPT-NeoX and Pythia (Hugging Face `gpt_neox`; `ppl_jax.models.gpt_neox`): its `config.json`
(transformers' defaults: `rotary_pct` 0.25, `rotary_emb_base` 10000, parallel residual, biases,
exact GELU) and its weights as transformers 5.23's `modeling_gpt_neox` stores them: the fused
`query_key_value` laid out per head (`[heads, 3, head_dim]` rows: h0's q, k, v, then h1's, ...)
split into q, k and v of `[embed, heads, head_dim]`, names with or without the `gpt_neox.` head,
the untied output `embed_out`, and the mask and rotary buffers of old checkpoints left unused.
"""

from __future__ import annotations

from typing import Any

from ppl_jax.errors import CheckpointError
from ppl_jax.models.gpt_neox import GPTNeoX, GPTNeoXConfig
from ppl_jax.models.registry import Family

_LAYER = r"layers\.(?P<l>\d+)\."


def read_config(c: dict[str, Any]) -> GPTNeoXConfig:
    """The architecture of a Hugging Face `gpt_neox` `config.json` (transformers' defaults:
    `rotary_pct` 0.25, `rotary_emb_base` 10000, parallel residual, biases, exact GELU).

    Raises:
      CheckpointError: an unsupported activation or rope scaling. KeyError: a required
        field is missing.
    """
    d, heads = int(c["hidden_size"]), int(c["num_attention_heads"])
    rope = {**(c.get("rope_scaling") or {}), **(c.get("rope_parameters") or {})}
    kind = rope.get("rope_type", rope.get("type")) or "default"
    if kind != "default":
        raise CheckpointError(
            f"GPT-NeoX rope_type {str(kind)[:40]!r} is not supported (only default)."
        )
    partial = float(rope.get("partial_rotary_factor", c.get("rotary_pct", 0.25)))
    return GPTNeoXConfig(
        vocab_size=int(c["vocab_size"]),
        embed_dim=d,
        num_layers=int(c["num_hidden_layers"]),
        num_heads=heads,
        mlp_dim=int(c["intermediate_size"]),
        max_positions=int(c["max_position_embeddings"]),
        rotary_dim=int(d // heads * partial),
        rope_theta=float(rope.get("rope_theta", c.get("rotary_emb_base", 10000.0))),
        norm_eps=float(c.get("layer_norm_eps", 1e-5)),
        parallel_residual=bool(c.get("use_parallel_residual", True)),
        bias=bool(c.get("attention_bias", True)),
        activation=c.get("hidden_act") or "gelu",
        tie_embeddings=bool(c.get("tie_word_embeddings", False)),
    )


def rules(d: dict[str, Any]) -> list[dict[str, Any]]:
    """The mapping rules of a GPT-NeoX description's weights (names without `gpt_neox.`)."""
    qkv = [f"layers/{{l}}/attn/{p}" for p in "qkv"]
    rows = ["num_heads", 3, "head_dim"]
    split = {"axis": 1, "squeeze": True}
    linear = {"transpose": [1, 0]}
    out = [
        {"from": r"embed_in\.weight", "to": "embedding"},
        {"from": r"final_layer_norm\.weight", "to": "final_norm"},
        {"from": r"final_layer_norm\.bias", "to": "final_norm_bias"},
        {"from": r"embed_out\.weight", "to": None} if d["tie_embeddings"] else
        {"from": r"embed_out\.weight", "to": "lm_head", **linear},
        {"from": _LAYER + r"attention\.(?:masked_bias|bias|rotary_emb\.inv_freq)", "to": None},
        {"from": _LAYER + r"attention\.query_key_value\.weight", "to": qkv,
         "view": [*rows, "embed_dim"], "split": split, "transpose": [2, 0, 1]},
        {"from": _LAYER + r"attention\.dense\.weight", "to": "layers/{l}/attn/o", **linear,
         "reshape": ["num_heads", "head_dim", "embed_dim"]},
        {"from": _LAYER + r"mlp\.dense_h_to_4h\.weight", "to": "layers/{l}/fc", **linear},
        {"from": _LAYER + r"mlp\.dense_h_to_4h\.bias", "to": "layers/{l}/fc_bias"},
        {"from": _LAYER + r"mlp\.dense_4h_to_h\.weight", "to": "layers/{l}/proj", **linear},
        {"from": _LAYER + r"mlp\.dense_4h_to_h\.bias", "to": "layers/{l}/proj_bias"},
    ]  # fmt: skip
    if d["bias"]:
        out.append({"from": _LAYER + r"attention\.query_key_value\.bias",
                    "to": [n + "_bias" for n in qkv], "view": rows, "split": split})  # fmt: skip
        out.append({"from": _LAYER + r"attention\.dense\.bias", "to": "layers/{l}/attn/o_bias"})
    for ours, theirs in (
        ("attn_norm", "input_layernorm"),
        ("mlp_norm", "post_attention_layernorm"),
    ):
        out.append({"from": _LAYER + theirs + r"\.weight", "to": "layers/{l}/" + ours})
        out.append({"from": _LAYER + theirs + r"\.bias", "to": "layers/{l}/" + ours + "_bias"})
    return out


FAMILY = Family(
    name="gpt_neox",
    config=GPTNeoXConfig,
    module=GPTNeoX,
    hf_readers={"gpt_neox": read_config},
    hf_rules=rules,
    hf_prefixes=("gpt_neox.",),
)
