"""SmolLM3 (Hugging Face `smollm3`; Hugging Face TB 2025): the Llama decoder with no rotary
embedding on the layers that `no_rope_layers` marks 0 ("NoPE" layers: by default every fourth,
`no_rope_layer_interval` 4), so those layers attend by content and causality alone, and an
optional sliding window on the layers `layer_types` names (by default the NoPE layers, when
`use_sliding_window` and `sliding_window` are set). Biases on q, k, v and o with
`attention_bias`, on the MLP with `mlp_bias`; tied embeddings and `rope_theta` 2,000,000 by
default. As transformers 5.24's `modeling_smollm3` and `configuration_smollm3`.

Refused: `layer_types` naming sliding layers while `use_sliding_window` is false (transformers'
eager and SDPA attention then window those layers by their mask, its flash attention does not:
no single answer to match).
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import jax.numpy as jnp
from flax import nnx

from ppl_jax.errors import CheckpointError
from ppl_jax.models.decoders import llama_hf
from ppl_jax.models.decoders.llama import Attention, LlamaConfig
from ppl_jax.models.decoders.llama_moe import MixtureLlama
from ppl_jax.models.family import Family, Layer


@dataclasses.dataclass(frozen=True)
class SmolLM3Config(LlamaConfig):
    """`LlamaConfig` with `nope_layers`: the layers without rotary embedding."""

    nope_layers: tuple[int, ...] = ()

    FAMILY: ClassVar[str] = "smollm3"


class SmolLM3(MixtureLlama):
    """The Llama decoder whose `nope_layers` attend without rotary embedding."""

    def make_attention(
        self, cfg: SmolLM3Config, layer: int, rngs: nnx.Rngs, dtype: jnp.dtype, attention: str
    ) -> nnx.Module:
        window = cfg.layer_window(layer)
        return Attention(
            cfg.layer_rope(layer),
            rngs,
            dtype,
            window,
            attention,
            rotary=layer not in cfg.nope_layers,
        )


def read_config(c: dict[str, Any]) -> SmolLM3Config:
    """The architecture of a `smollm3` `config.json` (transformers 5.24's defaults).

    Raises:
      CheckpointError: an activation other than silu, `no_rope_layers` that are not 0s and 1s
        for every layer, bad `layer_types`, sliding layers without `use_sliding_window`, an
        unsupported rope scaling. KeyError: a required field is missing.
    """
    llama_hf.check_activation(c, "hidden_act", "silu", ("silu",))
    n = int(c["num_hidden_layers"])
    interval = c.get("no_rope_layer_interval", 4)
    rope = c.get("no_rope_layers")
    if rope is None and isinstance(interval, int) and interval > 0:
        rope = [int((i + 1) % interval != 0) for i in range(n)]
    if not isinstance(rope, list) or len(rope) < n or any(r not in (0, 1) for r in rope[:n]):
        raise CheckpointError(
            f"no_rope_layers must mark each of the {n} layers 1 (rotary) or 0 (none), or "
            f"no_rope_layer_interval be a whole number of at least 1."
        )
    nope = tuple(i for i in range(n) if not rope[i])
    window = c.get("sliding_window") if c.get("use_sliding_window") else None
    types = c.get("layer_types")
    if types is None:
        types = [
            "sliding_attention" if window and i in nope else "full_attention" for i in range(n)
        ]
    if isinstance(types, list) and "sliding_attention" in types and not window:
        raise CheckpointError(
            "layer_types name sliding layers but use_sliding_window is false or sliding_window "
            "unset; transformers' attention implementations disagree on such layers (its eager "
            "attention windows them, flash attention does not). Set use_sliding_window."
        )
    sliding = llama_hf.hf_sliding({**c, "layer_types": types}, n) if window else {}
    bias = bool(c.get("attention_bias", False))
    return llama_hf.hf_config(
        {"rope_theta": 2000000.0, **c},
        config=SmolLM3Config,
        tie_embeddings=bool(c.get("tie_word_embeddings", True)),
        qkv_bias=bias,
        o_bias=bias,
        mlp_bias=bool(c.get("mlp_bias", False)),
        nope_layers=nope,
        **sliding,
    )


def layer_kinds(cfg: SmolLM3Config) -> tuple[Layer, ...]:
    """Attention and a dense MLP on every layer; `nope` and `sliding` noted."""
    notes = (
        " ".join(
            n
            for n, on in (("nope", i in cfg.nope_layers), ("sliding", i in cfg.sliding_layers))
            if on
        )
        for i in range(cfg.num_layers)
    )
    return tuple(Layer("attention", "dense", note) for note in notes)


FAMILY = Family(
    name="smollm3",
    config=SmolLM3Config,
    module=SmolLM3,
    hf_sizes={"no_rope_layer_interval": ("max_positions", 1)},
    hf_readers={"smollm3": read_config},
    hf_rules=llama_hf.rules,
    hf_prefixes=llama_hf.PREFIXES,
    layers=layer_kinds,
)
