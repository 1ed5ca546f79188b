"""Hugging Face `config.json` files of the Llama-like families, read into `LlamaConfig`.

The fields every such config shares (sizes, `rms_norm_eps`, `tie_word_embeddings`), the rotary
settings (`rope_parameters` of transformers 5, one dict or one per layer type, or the older
`rope_theta` and `rope_scaling`) and the sliding layers (`sliding_window`, `layer_types`); the
readers of `llama`/`mistral`/`qwen2` here, of the other families in their own modules
(`ppl_jax.models.qwen3`, `olmo`, `gemma`, `phi3`). Defaults are transformers 5.23's.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from ppl_jax.errors import CheckpointError
from ppl_jax.models import rope as rope_lib
from ppl_jax.models.llama import LlamaConfig, sorted_items


def llama(c: dict[str, Any]) -> LlamaConfig:
    """The architecture of a Hugging Face `config.json` of model type llama, mistral or qwen2.

    Defaults are transformers' own (`rms_norm_eps` 1e-6, untied embeddings, `head_dim`
    = hidden / heads).

    Raises:
      CheckpointError: an activation other than silu, an unsupported rope scaling, bad
        `layer_types`. KeyError: a required field is missing.
    """
    model_type = c["model_type"]
    check_activation(c, "hidden_act", "silu", ("silu",))
    attention_bias = model_type == "llama" and bool(c.get("attention_bias", False))
    return hf_config(
        c,
        qkv_bias=attention_bias or model_type == "qwen2",
        o_bias=attention_bias,
        mlp_bias=model_type == "llama" and bool(c.get("mlp_bias", False)),
        **hf_sliding(c, model_type, int(c["num_hidden_layers"])),
    )


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


def hf_config(c: dict[str, Any], **fields: Any) -> LlamaConfig:
    """A `LlamaConfig` from the fields every Llama-like Hugging Face config shares (sizes,
    `rms_norm_eps`, `tie_word_embeddings`, the rotary settings of `hf_rope`), with `fields`
    (a family's own) on top.

    Raises:
      CheckpointError: see `hf_rope`. KeyError: a required field is missing.
    """
    heads, layers = int(c["num_attention_heads"]), int(c["num_hidden_layers"])
    head_dim = int(c.get("head_dim") or int(c["hidden_size"]) // heads)
    base = dict(
        model_type=str(c["model_type"]),
        vocab_size=int(c["vocab_size"]),
        embed_dim=int(c["hidden_size"]),
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=int(c.get("num_key_value_heads") or heads),
        head_dim=head_dim,
        mlp_dim=int(c["intermediate_size"]),
        max_positions=int(c["max_position_embeddings"]),
        norm_eps=float(c.get("rms_norm_eps", 1e-6)),
        tie_embeddings=bool(c.get("tie_word_embeddings", False)),
    )
    base.update(fields)
    base.update(hf_rope(c, head_dim, base["max_positions"], base.get("sliding_layers", ())))
    return LlamaConfig(**base)


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
    c: dict[str, Any], model_type: str, num_layers: int, default_types=None
) -> dict[str, Any]:
    """Mistral: the window on every layer; Qwen2: only with `use_sliding_window`, on the layers
    that `layer_types` names (or from `max_window_layers` on, transformers' Qwen2Config rule);
    other families: the layers `layer_types` (or `default_types`, the family's default) names."""
    window = c.get("sliding_window")
    if model_type == "llama" or (
        model_type in ("qwen2", "qwen3") and not c.get("use_sliding_window")
    ):
        window = None
    if not window:
        return {}
    types = c.get("layer_types")
    if types is None and model_type in ("qwen2", "qwen3"):
        first = int(c.get("max_window_layers", 28))
        types = ["sliding_attention" if i >= first else "full_attention" for i in range(num_layers)]
    types = types or default_types or ["sliding_attention"] * num_layers
    if len(types) != num_layers or set(types) - {"sliding_attention", "full_attention"}:
        raise CheckpointError(
            f"layer_types are not {num_layers} of full_attention and sliding_attention."
        )
    layers = tuple(i for i, t in enumerate(types) if t == "sliding_attention")
    return {"sliding_window": int(window), "sliding_layers": layers} if layers else {}
