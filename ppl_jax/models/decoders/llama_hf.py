"""What the Llama-like families of `ppl_jax.models.families` (Llama, Qwen3, OLMo, Gemma, Phi-3,
the mixtures of experts and the others built on `ppl_jax.models.decoders.llama`) share on the
Hugging Face side: their `config.json` fields read into `LlamaConfig`, and the mapping rules of
their weights.

The config fields every such family shares (sizes, `rms_norm_eps`, `tie_word_embeddings`:
`hf_common`, which the hybrids' readers extend too), the rotary settings (`rope_parameters` of
transformers 5, one dict or one per layer type, or the older `rope_theta` and `rope_scaling`)
and the sliding layers (`sliding_window`, `layer_types`). Defaults are transformers 5.23's.

The weights (`rules`): names as transformers 5.23's `modeling_llama` and its relatives store them
(`nn.Linear` keeps `[out, in]`), with the text model's prefix removed (`PREFIXES`: `model.`, or
`model.language_model.`/`language_model.model.` for a multimodal checkpoint's text tower); each
projection is transposed and split into heads (`[embed, heads, head_dim]`), so that a device's
block of heads is read as its own rows.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from ppl_jax.errors import CheckpointError, quoted
from ppl_jax.models.decoders.llama import LlamaConfig, sorted_items
from ppl_jax.models.layers import rope as rope_lib


def check_activation(c: dict[str, Any], key: str, default: str, allowed) -> str:
    """`c[key]` (or `default`), if it is one of `allowed`.

    Raises:
      CheckpointError: another activation.
    """
    act = c.get(key) or default
    if act not in allowed:
        raise CheckpointError(
            f"{key} {str(act)[:40]!r} is not supported (supported: {', '.join(allowed)})."
        )
    return act


# The description's fields that every Hugging Face config names alike -> their config.json keys.
HF_COMMON = {
    "vocab_size": "vocab_size",
    "embed_dim": "hidden_size",
    "num_layers": "num_hidden_layers",
    "num_heads": "num_attention_heads",
    "mlp_dim": "intermediate_size",
    "max_positions": "max_position_embeddings",
    "norm_eps": "rms_norm_eps",
    "tie_embeddings": "tie_word_embeddings",
}


def hf_common(c: dict[str, Any], norm_key: str = "rms_norm_eps", **defaults: Any) -> dict[str, Any]:
    """The description's fields of the keys every Hugging Face config names alike (`HF_COMMON`;
    the norms' epsilon under `norm_key`), plus `num_kv_heads` (`num_key_value_heads`, else the
    heads) and `head_dim` (`head_dim`, else `defaults["head_dim"]`, else `embed_dim //
    num_heads`): what each family's reader extends with its own.

    Args:
      c: the `config.json` dict.
      norm_key: the key of the norms' epsilon (`rms_norm_eps`; `layer_norm_epsilon`).
      defaults: a field's value where the config lacks its key (a family's transformers
        defaults); `norm_eps` is 1e-6 and `tie_embeddings` False unless given; any other field
        without a default is required.

    Raises:
      KeyError: a required key is missing.
    """
    keys = {**HF_COMMON, "norm_eps": norm_key}
    defaults = {"norm_eps": 1e-6, "tie_embeddings": False, **defaults}
    kinds = {"norm_eps": float, "tie_embeddings": bool}
    out = {
        field: kinds.get(field, int)(
            c[key] if key in c or field not in defaults else defaults[field]
        )
        for field, key in keys.items()
    }
    out["num_kv_heads"] = int(c.get("num_key_value_heads") or out["num_heads"])
    out["head_dim"] = int(
        c.get("head_dim") or defaults.get("head_dim") or out["embed_dim"] // out["num_heads"]
    )
    return out


def hf_config(c: dict[str, Any], config: type = LlamaConfig, **fields: Any) -> LlamaConfig:
    """A `LlamaConfig` (or the subclass `config`) from the fields every Llama-like Hugging Face
    config shares (sizes, `rms_norm_eps`, `tie_word_embeddings`, the rotary settings of
    `hf_rope`), with `fields` (a family's own) on top.

    Raises:
      CheckpointError: see `hf_rope`. KeyError: a required field is missing.
    """
    common = hf_common(c)
    base = {"model_type": str(c["model_type"]), **common, **fields}
    base.update(
        hf_rope(c, common["head_dim"], base["max_positions"], base.get("sliding_layers", ()))
    )
    return config(**base)


def hf_rope(
    c: dict[str, Any], head_dim: int, max_positions: int, sliding_layers=()
) -> dict[str, Any]:
    """The rotary fields of a config: `rope_parameters` (transformers 5, one dict or one per
    layer type: `full_attention` gives the global fields, `sliding_attention` the
    `sliding_rope` overrides) or `rope_theta` and `rope_scaling` (older configs).

    Raises:
      CheckpointError: an unsupported scaling, or a per-layer-type form without
        `full_attention`.
    """
    rope = {**(c.get("rope_scaling") or {}), **(c.get("rope_parameters") or {})}
    try:
        if rope and all(isinstance(v, dict) or v is None for v in rope.values()):
            if set(rope) - {"full_attention", "sliding_attention"}:
                raise ValueError(
                    f"rope_parameters per layer type name {sorted(rope)[:4]}; only "
                    f"full_attention and sliding_attention are known"
                )
            full = rope_lib.from_hf(rope.get("full_attention") or {}, c, head_dim, max_positions)
            local = rope.get("sliding_attention")
            if local is None or not sliding_layers:
                return full
            local = rope_lib.from_hf(local, c, head_dim, max_positions)
            defaults = {f.name: f.default for f in dataclasses.fields(LlamaConfig)}
            merged = {**{k: defaults[k] for k in full}, **local}
            differs = {k: v for k, v in merged.items() if full.get(k, defaults[k]) != v}
            return {**full, "sliding_rope": sorted_items(differs)}
        return rope_lib.from_hf(rope, c, head_dim, max_positions)
    except ValueError as e:
        raise CheckpointError(f"{e}.") from None


def hf_sliding(
    c: dict[str, Any],
    num_layers: int,
    default_types=None,
    *,
    needs_flag: bool = False,
    max_window_layers: bool = False,
) -> dict[str, Any]:
    """The sliding layers of a config: `sliding_window` on the layers `layer_types` names (or
    `default_types`, the family's default; else every layer). `needs_flag`: only with
    `use_sliding_window` (Qwen2's rule); `max_window_layers`: without `layer_types`, the window
    from layer `max_window_layers` on (transformers' Qwen2Config rule). A null `sliding_window`
    with no layer named sliding is full attention (Mistral's and Phi-3's null), as is any window
    on layers all `full_attention`.

    Raises:
      CheckpointError: `layer_types` that are not one per layer of the two known types; a
        `sliding_window` of null or 0 while some layer slides (`layer_types`, the family's
        default, or every layer for 0): transformers refuses null there (its sliding mask needs
        a window) and with 0 lets those layers attend to no key, neither of which is full
        attention.
    """
    window = c.get("sliding_window")
    if needs_flag and not c.get("use_sliding_window"):
        return {}  # transformers sets no window then (Qwen2Config)
    types = c.get("layer_types")
    if window is None and types is None and default_types is None:
        return {}  # Mistral's, Phi-3's null: full attention
    if types is None and max_window_layers and window is not None:
        first = int(c.get("max_window_layers", 28))
        types = ["sliding_attention" if i >= first else "full_attention" for i in range(num_layers)]
    named = types or default_types
    if named is not None and (
        not isinstance(named, list)
        or len(named) != num_layers
        or set(named) - {"sliding_attention", "full_attention"}
    ):
        raise CheckpointError(
            f"layer_types are not {num_layers} of full_attention and sliding_attention."
        )
    types = named or ["sliding_attention"] * num_layers
    layers = tuple(i for i, t in enumerate(types) if t == "sliding_attention")
    if not window:
        if layers:
            sliding = ", ".join(map(str, layers[:4])) + (", ..." if len(layers) > 4 else "")
            raise CheckpointError(
                f"sliding_window={'null' if window is None else quoted(window, 20)} on the "
                f"sliding layers ({sliding}) is no window: "
                f"transformers {'refuses null' if window is None else 'lets them attend to no key'}"
                f" there; set sliding_window to the model's window, or layer_types to "
                f"full_attention."
            )
        return {}
    return {"sliding_window": int(window), "sliding_layers": layers} if layers else {}


# ------------------------------------------------------------------------------------ weights

# The heads of stored names that the rules do not see: the text model's (a multimodal
# checkpoint's text tower, older and newer spellings), longest first.
PREFIXES = ("model.language_model.", "language_model.model.", "language_model.", "model.")
LAYER = r"layers\.(?P<l>\d+)\."
# Stored norm names per `norm_layout`: ppl_jax name -> Hugging Face module.
NORMS = {
    "pre": {"attn_norm": "input_layernorm", "mlp_norm": "post_attention_layernorm"},
    "post": {
        "post_attn_norm": "post_attention_layernorm",
        "post_mlp_norm": "post_feedforward_layernorm",
    },
    "sandwich": {
        "attn_norm": "input_layernorm",
        "post_attn_norm": "post_attention_layernorm",
        "mlp_norm": "pre_feedforward_layernorm",
        "post_mlp_norm": "post_feedforward_layernorm",
    },
}
# An `nn.Linear` weight `[heads * head_dim, embed]` as ppl_jax's `[embed, heads, head_dim]`.
HEADS_IN = {"transpose": [1, 0], "reshape": ["embed_dim", -1, "head_dim"]}


def rules(d: dict[str, Any]) -> list[dict[str, Any]]:
    """The mapping rules (`ppl_jax.checkpoints.mapping.language`) of a Llama-like description's
    Hugging Face weights, names without `PREFIXES`: embeddings, norms (by `norm_layout`), attention
    (biases, QK-norms by `qk_norm`) and dense MLPs (biases by `mlp_bias`). A family with other
    weights (fused projections, experts) replaces or adds rules."""
    tied = d["tie_embeddings"]
    out: list[dict[str, Any]] = [
        {"from": r"embed_tokens\.weight", "to": "embedding"},
        {"from": r"norm\.weight", "to": "final_norm"},
        {"from": r"lm_head\.weight", "to": None} if tied else
        {"from": r"lm_head\.weight", "to": "lm_head", "transpose": [1, 0]},
        {"from": LAYER + r"self_attn\.rotary_emb\.inv_freq", "to": None},  # old buffers
    ]  # fmt: skip
    for ours, theirs in NORMS[d.get("norm_layout", "pre")].items():
        out.append({"from": LAYER + theirs + r"\.weight", "to": "layers/{l}/" + ours})
    attn = LAYER + r"self_attn\."
    out.append(
        {"from": attn + r"(?P<p>[qkv])_proj\.weight", "to": "layers/{l}/attn/{p}", **HEADS_IN}
    )
    if d.get("qkv_bias"):
        out.append({"from": attn + r"(?P<p>[qkv])_proj\.bias", "to": "layers/{l}/attn/{p}_bias",
                    "reshape": [-1, "head_dim"]})  # fmt: skip
    if d.get("qk_norm") in ("head", "projection"):
        norm = {"from": attn + r"(?P<p>[qk])_norm\.weight", "to": "layers/{l}/attn/{p}_norm"}
        if d["qk_norm"] == "projection":
            norm["reshape"] = [-1, "head_dim"]
        out.append(norm)
    out.append({"from": attn + r"o_proj\.weight", "to": "layers/{l}/attn/o", "transpose": [1, 0],
                "reshape": ["num_heads", "head_dim", "embed_dim"]})  # fmt: skip
    if d.get("o_bias"):
        out.append({"from": attn + r"o_proj\.bias", "to": "layers/{l}/attn/o_bias"})
    mlp = LAYER + r"mlp\.(?P<p>gate|up|down)_proj\."
    out.append({"from": mlp + "weight", "to": "layers/{l}/mlp/{p}", "transpose": [1, 0]})
    if d.get("mlp_bias"):
        out.append({"from": mlp + "bias", "to": "layers/{l}/mlp/{p}_bias"})
    return out
