"""The bounds of an architecture's numbers, checked before anything is built: a description's
sizes (`MAX_SIZES`, `ppl_jax.models.registry.check_sizes`), a Hugging Face `config.json`'s sizes
by their own names (`COMMON_HF_SIZES` and the family's `hf_sizes`, `check_hf_sizes`, before a
family's reader builds anything sized by them), and the finiteness of every number (`check_finite`).

The bounds are the largest published models' sizes with room (vocabularies of 262k, 126 layers,
widths of 16k-25k, 384 experts, contexts of 10M tokens), so that a config claiming a billion
layers or experts is one sentence in milliseconds, not minutes of building and gigabytes; the
least value is 1 for every size, chunk, kernel, interval and step that a model divides by or
loops over, 0 where 0 means "none" or "the default".
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from ppl_jax.errors import CheckpointError, quoted

# Upper bounds of a description's sizes, each far above the largest published models'.
MAX_SIZES = {
    "vocab_size": 1 << 23,
    "num_layers": 1024,
    "embed_dim": 1 << 18,
    "mlp_dim": 1 << 20,
    "num_heads": 4096,
    "num_kv_heads": 4096,
    "head_dim": 1 << 14,
    "max_positions": 1 << 28,
    "moe_experts": 1 << 14,
    "moe_mlp_dim": 1 << 20,
    "moe_top_k": 1 << 14,
    "moe_shared_mlp_dim": 1 << 20,
    "rotary_dim": 1 << 14,
    "sliding_window": 1 << 28,
    # the 2025-26 families' own: state-space and linear-attention layers (heads, widths, a
    # convolution's kernel, a scan's chunk: its [chunk, chunk] blocks are built per head),
    # chunked attention, latent attention, grouped routing, multi-token prediction
    "ssm_heads": 1 << 14,
    "ssm_head_dim": 1 << 14,
    "ssm_groups": 1 << 14,
    "ssm_state": 1 << 14,
    "ssm_conv": 1 << 10,
    "ssm_chunk": 1 << 14,
    "gdn_key_heads": 1 << 14,
    "gdn_key_dim": 1 << 14,
    "gdn_value_heads": 1 << 14,
    "gdn_value_dim": 1 << 14,
    "gdn_conv": 1 << 10,
    "gdn_chunk": 1 << 14,
    "attn_chunk": 1 << 28,
    "kv_lora_rank": 1 << 18,
    "q_lora_rank": 1 << 18,
    "qk_nope_head_dim": 1 << 14,
    "v_head_dim": 1 << 14,
    "moe_groups": 1 << 14,
    "moe_top_groups": 1 << 14,
    "moe_latent_dim": 1 << 18,
    "mtp_layers": 1024,
}
# Sizes that may be 0 (none: no window, no rotary part, no experts, no low-rank query, ...).
MAY_BE_ZERO = frozenset({
    "sliding_window", "rotary_dim", "moe_experts", "moe_mlp_dim", "moe_top_k",
    "moe_shared_mlp_dim", "q_lora_rank", "qk_nope_head_dim", "moe_latent_dim", "mtp_layers",
})  # fmt: skip
# The sizes that every Hugging Face config.json names alike (`llama_hf.HF_COMMON`, the Llama-like
# families' windows and rotary scaling), checked before a family's reader builds anything sized by
# them (a list over the layers) or divides by them: name -> (the `MAX_SIZES` bound, the least).
# Each family adds its own keys (`Family.hf_sizes`, in the same form). Chunks, kernels, intervals
# and steps are at least 1; a 0 that means "none" or "the default" (no sliding window, key-value
# heads = heads) may be 0.
COMMON_HF_SIZES = {
    "num_hidden_layers": ("num_layers", 1),
    "vocab_size": ("vocab_size", 1),
    "hidden_size": ("embed_dim", 1),
    "intermediate_size": ("mlp_dim", 1),
    "num_attention_heads": ("num_heads", 1),
    "num_key_value_heads": ("num_kv_heads", 0),
    "head_dim": ("head_dim", 0),
    **dict.fromkeys(("max_position_embeddings", "original_max_position_embeddings"),
                    ("max_positions", 1)),
    "sliding_window": ("sliding_window", 0),
}  # fmt: skip
# Words a config.json may give instead of a size (derived by the family's reader).
HF_SIZE_WORDS = {"mamba_d_head": ("auto",)}
# Fractions of a width (of the head dimension that rotates): in (0, 1].
HF_FRACTIONS = ("partial_rotary_factor", "rotary_pct")
# Numbers a model takes a root of or divides by (Gemma's query scale is its -1/2 power): > 0.
HF_POSITIVE = ("query_pre_attn_scalar",)


def check_finite(tree: Any, what: str = "", prefix: str = "", depth: int = 0) -> None:
    """Every number in `tree` (a config or description: dicts and lists, searched to a depth of
    8) is finite: JSON readers accept `NaN` and `Infinity`, which no size, scale or limit of a
    model means.

    Raises:
      CheckpointError: the first one that is not, named by its dotted key after `what`.
    """
    items = tree.items() if isinstance(tree, dict) else enumerate(tree)
    for key, value in items:
        name = f"{prefix}{key}" if isinstance(tree, dict) else f"{prefix[:-1]}[{key}]"
        if isinstance(value, float) and not math.isfinite(value):
            raise CheckpointError(
                f"{what}{name}={value} is not a finite number; fix the config (a NaN or an "
                f"infinity there would make every score NaN, or meaningless)."
            )
        if isinstance(value, dict | list) and depth < 8:
            check_finite(value, what, f"{name}.", depth + 1)


def check_hf_sizes(
    config: dict[str, Any], sizes: Mapping[str, tuple[str, int]], prefix: str = ""
) -> None:
    """A Hugging Face `config.json`'s sizes (`sizes`: `COMMON_HF_SIZES` and its family's own,
    `Family.hf_sizes`: layers, widths, heads, experts, and the 2025-26 families' chunks, kernels,
    intervals and steps; key -> (its `MAX_SIZES` bound, the least value)) are whole numbers within
    their bound, and its numbers finite (`check_finite`): checked before the family's
    reader builds anything sized by them (OLMo 3's `layer_types` over every layer), so that an
    absurd or zero size is one sentence naming the key, in milliseconds. A nested `text_config`
    (a multimodal checkpoint's language model) is checked the same way.

    Raises:
      CheckpointError: the first key out of bounds (or not finite), named.
    """
    if not prefix:
        check_finite(config)
    for key, (bound_of, least) in sizes.items():
        value = config.get(key)
        if value is None or value in HF_SIZE_WORDS.get(key, ()):
            continue
        bound = MAX_SIZES[bound_of]
        whole = (
            isinstance(value, int | float) and not isinstance(value, bool) and value == int(value)
        )
        if not whole or not least <= value <= bound:
            raise CheckpointError(
                f"{prefix}{key}={quoted(value, 40)} is not a whole number from {least} to "
                f"{bound:,}; fix the config (its sizes are checked before anything is built)."
            )
    for keys, upper, what in ((HF_FRACTIONS, 1, "a fraction in (0, 1]"),
                              (HF_POSITIVE, math.inf, "a number above 0")):  # fmt: skip
        for key in keys:
            value = config.get(key)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)
                                      or not 0 < value <= upper):  # fmt: skip
                raise CheckpointError(
                    f"{prefix}{key}={quoted(value, 40)} is not {what}; fix the config."
                )
    for key, value in config.items():
        if (key.endswith(("_eps", "_epsilon")) and isinstance(value, int | float)
                and not isinstance(value, bool) and value < 0):  # fmt: skip
            raise CheckpointError(f"{prefix}{key}={value} is negative; fix the config.")
    if isinstance(config.get("text_config"), dict) and not prefix:
        check_hf_sizes(config["text_config"], sizes, "text_config.")
