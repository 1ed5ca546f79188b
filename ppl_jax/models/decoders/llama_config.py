"""The architecture of a Llama-family decoder (`LlamaConfig`), stored as JSON beside each
checkpoint; the module is `ppl_jax.models.decoders.llama`, whose docstring lists what each field
turns on."""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

from ppl_jax.errors import CheckpointError
from ppl_jax.models.layers import rope as rope_lib

ROPE_TYPES = rope_lib.ROPE_TYPES
QK_NORMS = ("none", "head", "projection")
NORM_LAYOUTS = ("pre", "post", "sandwich")
# Hugging Face `ACT2FN` names of the gated MLP's activation (`ppl_jax.models.layers.core`).
GATED_ACTIVATIONS = ("silu", "swish", "gelu_pytorch_tanh", "gelu_new", "gelu")


@dataclasses.dataclass(frozen=True)
class LlamaConfig:
    """Architecture of a Llama-family decoder (stored as JSON beside each checkpoint).

    Fields after `tie_embeddings` were added for Hugging Face checkpoints; their defaults give the
    original architecture, so descriptions stored before them still load.

    Attributes:
      qkv_bias: biases on the q, k and v projections (Qwen2; Llama `attention_bias`).
      o_bias: a bias on the output projection (Llama `attention_bias`).
      mlp_bias: biases on the gate, up and down projections (Llama `mlp_bias`).
      rope_type: one of `ppl_jax.models.layers.rope.ROPE_TYPES`.
      rope_factor, rope_low_freq_factor, rope_high_freq_factor, rope_original_max_positions,
        rope_beta_fast, rope_beta_slow, rope_truncate, rope_short_factor, rope_long_factor:
        the scaling's parameters (Hugging Face `rope_parameters` names: `factor`,
        `low_freq_factor`, `high_freq_factor`, `original_max_position_embeddings`, ...).
      rope_attention_factor: cos and sin are multiplied by it (yarn, longrope).
      rotary_dim: the rotated dims of each head (0: all; `partial_rotary_factor`).
      sliding_window: a query at position p attends to keys at positions > p - sliding_window
        (Hugging Face `sliding_window_overlay`), on the layers in `sliding_layers`.
      sliding_layers: indices of the layers that use the window.
      sliding_rope: `rope_*` fields that differ on the sliding layers (`rope_parameters` per
        layer type), as sorted `(name, value)` pairs.
      model_type: the Hugging Face model type it was read from (informative).
      qk_norm: `none`, `head` (RMSNorm of each head of q and k, weights `[head_dim]`) or
        `projection` (RMSNorm over all heads of q, and of k, weights `[heads, head_dim]`).
      norm_layout: `pre` (Llama), `post` (OLMo 2: `x + norm(f(x))`, no pre-norm) or `sandwich`
        (Gemma: `x + norm(f(norm(x)))`).
      norm_offset: RMSNorm scales by `offset + w` in float32 (Gemma: 1).
      activation: the gated MLP's activation, one of `GATED_ACTIVATIONS`.
      embed_scale: the embedding is multiplied by `sqrt(embed_dim)` rounded to the weight dtype.
      query_scale: the attention logits' scale (None: `head_dim ** -0.5`).
      attn_softcap, final_softcap: `c * tanh(x / c)` on attention scores and on the logits.
      moe_layers: the layers whose MLP is a mixture of experts
        (`ppl_jax.models.decoders.llama_moe`), with `moe_experts` experts of width `moe_mlp_dim`,
        `moe_top_k` per token, `moe_norm_topk_prob`, and a shared expert of width
        `moe_shared_mlp_dim` (0: none).
    """

    vocab_size: int
    embed_dim: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    mlp_dim: int
    max_positions: int
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    tie_embeddings: bool = True
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    rope_type: str = "default"
    rope_factor: float = 1.0
    rope_low_freq_factor: float = 1.0
    rope_high_freq_factor: float = 4.0
    rope_original_max_positions: int = 8192
    sliding_window: int | None = None
    sliding_layers: tuple[int, ...] = ()
    rope_beta_fast: float = 32.0
    rope_beta_slow: float = 1.0
    rope_truncate: bool = True
    rope_attention_factor: float = 1.0
    rope_short_factor: tuple[float, ...] = ()
    rope_long_factor: tuple[float, ...] = ()
    rotary_dim: int = 0
    sliding_rope: tuple[tuple[str, Any], ...] = ()
    model_type: str = "llama"
    qk_norm: str = "none"
    norm_layout: str = "pre"
    norm_offset: float = 0.0
    activation: str = "silu"
    embed_scale: bool = False
    query_scale: float | None = None
    attn_softcap: float | None = None
    final_softcap: float | None = None
    moe_layers: tuple[int, ...] = ()
    moe_experts: int = 0
    moe_mlp_dim: int = 0
    moe_top_k: int = 0
    moe_norm_topk_prob: bool = True
    moe_shared_mlp_dim: int = 0
    rope_angles: str = (
        "float32"  # `ppl_jax.models.layers.rope.ANGLES`: transformers' float32, or exact
    )

    # The description's `family`: a subclass (a family with fields of its own) names its own.
    FAMILY: ClassVar[str] = "llama"

    def __post_init__(self):
        for name, value, allowed in (
            ("rope_type", self.rope_type, ROPE_TYPES),
            ("qk_norm", self.qk_norm, QK_NORMS),
            ("norm_layout", self.norm_layout, NORM_LAYOUTS),
            ("activation", self.activation, GATED_ACTIVATIONS),
            ("rope_angles", self.rope_angles, rope_lib.ANGLES),
        ):
            if value not in allowed:
                raise CheckpointError(
                    f"{name} {str(value)[:40]!r} is not supported (supported: {', '.join(allowed)})."
                )
        if self.num_heads % self.num_kv_heads:
            raise CheckpointError(
                f"num_heads={self.num_heads} is not a multiple of num_kv_heads={self.num_kv_heads}."
            )
        if self.sliding_layers and not self.sliding_window:
            raise CheckpointError("sliding_layers are given without a sliding_window.")
        if self.rotary_dim % 2 or self.rotary_dim > self.head_dim:
            raise CheckpointError(
                f"rotary_dim={self.rotary_dim} is not an even number of dims up to head_dim."
            )

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        for name, value in d.items():
            if isinstance(value, tuple) and name != "sliding_rope":
                d[name] = list(value)
        d["sliding_rope"] = {
            k: list(v) if isinstance(v, tuple) else v for k, v in self.sliding_rope
        }
        if d["rope_angles"] == "float32":  # the default: descriptions (and fingerprints) as before
            del d["rope_angles"]
        return {"family": self.FAMILY, **d}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> LlamaConfig:
        """The config of a description (`to_dict`'s form; lists as tuples).

        Raises:
          CheckpointError: another family, or keys this config does not have.
        """
        fields = {f.name: f for f in dataclasses.fields(cls)}
        unknown = set(d) - set(fields) - {"family"}
        if d.get("family", "llama") != cls.FAMILY or unknown:
            raise CheckpointError(
                f"the stored architecture (family {str(d.get('family'))[:40]!r}) is not a "
                f"{cls.FAMILY} description (unknown keys: {sorted(unknown)[:5]})."
            )
        kwargs = {k: v for k, v in d.items() if k in fields}
        for name, value in kwargs.items():
            if isinstance(value, list):
                kwargs[name] = tuple(value)
        kwargs["sliding_layers"] = tuple(int(i) for i in kwargs.get("sliding_layers", ()))
        kwargs["sliding_rope"] = sorted_items(kwargs.get("sliding_rope") or {})
        return cls(**kwargs)

    def layer_window(self, layer: int) -> int | None:
        """Layer `layer`'s sliding window (`sliding_window` on the sliding layers), or None."""
        return self.sliding_window if layer in self.sliding_layers else None

    def layer_rope(self, layer: int) -> LlamaConfig:
        """The config whose `rope_*` fields are those of layer `layer` (`sliding_rope` applied
        on the sliding layers)."""
        if layer in self.sliding_layers and self.sliding_rope:
            return dataclasses.replace(self, **dict(self.sliding_rope))
        return self


def sorted_items(d: dict[str, Any]) -> tuple[tuple[str, Any], ...]:
    """`d` as sorted `(name, value)` pairs, lists as tuples (hashable, for `sliding_rope`)."""
    return tuple(sorted((k, tuple(v) if isinstance(v, list) else v) for k, v in d.items()))
