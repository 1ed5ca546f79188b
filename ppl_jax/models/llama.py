"""A decoder of the Llama family in Flax NNX: RMSNorm, rotary embeddings, SwiGLU, grouped-query
attention, optionally tied embeddings (Touvron et al. 2023, "LLaMA"; Ainslie et al. 2023, "GQA").

The same module covers the Hugging Face `llama`, `mistral` and `qwen2` model types: optional
q/k/v (and output) projection biases (Qwen2, Llama's `attention_bias`), MLP biases (`mlp_bias`),
a sliding attention window on chosen layers (Mistral, Jiang et al. 2023; Qwen2's
`use_sliding_window`), and the rotary scalings `linear` (Chen et al. 2023, position
interpolation) and `llama3` (Meta's Llama 3.1 frequency-dependent scaling, as in Hugging Face
`modeling_rope_utils._compute_llama3_parameters`).

Every parameter carries its logical axis names in the `logical_axes` metadata of its `nnx.Param`
(`vocab`, `embed`, `heads`, `kv_heads`, `head_dim`, `mlp`); `ppl_jax.runtime.mesh` maps them to mesh axes
with the table in the config. The rotary embedding rotates the two halves of each head
(the Hugging Face `rotate_half` layout), so that Hugging Face Llama weights load unchanged.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from ppl_jax.errors import CheckpointError
from ppl_jax.models.attention import attend

ROPE_TYPES = ("default", "linear", "llama3")


@dataclasses.dataclass(frozen=True)
class LlamaConfig:
    """Architecture of a Llama-family decoder (stored as JSON beside each checkpoint).

    Fields after `tie_embeddings` were added for Hugging Face checkpoints; their defaults give the
    original architecture, so descriptions stored before them still load.

    Attributes:
      qkv_bias: biases on the q, k and v projections (Qwen2; Llama `attention_bias`).
      o_bias: a bias on the output projection (Llama `attention_bias`).
      mlp_bias: biases on the gate, up and down projections (Llama `mlp_bias`).
      rope_type: `default`, `linear` (positions divided by `rope_factor`) or `llama3`.
      rope_factor, rope_low_freq_factor, rope_high_freq_factor, rope_original_max_positions:
        the scaling's parameters (Hugging Face `rope_parameters` names: `factor`,
        `low_freq_factor`, `high_freq_factor`, `original_max_position_embeddings`).
      sliding_window: a query at position p attends to keys at positions > p - sliding_window
        (Hugging Face `sliding_window_overlay`), on the layers in `sliding_layers`.
      sliding_layers: indices of the layers that use the window.
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

    def __post_init__(self):
        if self.rope_type not in ROPE_TYPES:
            raise CheckpointError(
                f"rope_type {self.rope_type!r} is not supported (supported: {', '.join(ROPE_TYPES)})."
            )
        if self.num_heads % self.num_kv_heads:
            raise CheckpointError(
                f"num_heads={self.num_heads} is not a multiple of num_kv_heads={self.num_kv_heads}."
            )
        if self.sliding_layers and not self.sliding_window:
            raise CheckpointError("sliding_layers are given without a sliding_window.")

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["sliding_layers"] = list(self.sliding_layers)
        return {"family": "llama", **d}

    @staticmethod
    def from_dict(d: dict[str, Any]) -> LlamaConfig:
        fields = {f.name for f in dataclasses.fields(LlamaConfig)}
        unknown = set(d) - fields - {"family"}
        if d.get("family", "llama") != "llama" or unknown:
            raise CheckpointError(
                f"the stored architecture {d!r} is not a Llama-family description "
                f"(unknown keys: {sorted(unknown)})."
            )
        kwargs = {k: v for k, v in d.items() if k in fields}
        kwargs["sliding_layers"] = tuple(int(i) for i in kwargs.get("sliding_layers", ()))
        return LlamaConfig(**kwargs)

    @staticmethod
    def from_hf_config(c: dict[str, Any]) -> LlamaConfig:
        """The architecture of a Hugging Face `config.json` of model type llama, mistral or qwen2.

        Defaults are transformers' own (`rms_norm_eps` 1e-6, untied embeddings, `head_dim`
        = hidden / heads). Rotary settings come from `rope_parameters` (transformers 5) or
        `rope_theta` and `rope_scaling` (`rope_type` or `type`; older configs).

        Raises:
          CheckpointError: an activation other than silu, an unsupported rope scaling, bad
            `layer_types`. KeyError: a required field is missing.
        """
        model_type = c["model_type"]
        if c.get("hidden_act", "silu") != "silu":
            raise CheckpointError(f"hidden_act {c['hidden_act']!r} is not supported (only silu).")
        heads, layers = int(c["num_attention_heads"]), int(c["num_hidden_layers"])
        attention_bias = model_type == "llama" and bool(c.get("attention_bias", False))
        return LlamaConfig(
            vocab_size=int(c["vocab_size"]),
            embed_dim=int(c["hidden_size"]),
            num_layers=layers,
            num_heads=heads,
            num_kv_heads=int(c.get("num_key_value_heads") or heads),
            head_dim=int(c.get("head_dim") or c["hidden_size"] // heads),
            mlp_dim=int(c["intermediate_size"]),
            max_positions=int(c["max_position_embeddings"]),
            norm_eps=float(c.get("rms_norm_eps", 1e-6)),
            tie_embeddings=bool(c.get("tie_word_embeddings", False)),
            qkv_bias=attention_bias or model_type == "qwen2",
            o_bias=attention_bias,
            mlp_bias=model_type == "llama" and bool(c.get("mlp_bias", False)),
            **_hf_rope(c),
            **_hf_sliding(c, model_type, layers),
        )


def _hf_rope(c: dict[str, Any]) -> dict[str, Any]:
    rope = {**(c.get("rope_scaling") or {}), **(c.get("rope_parameters") or {})}
    if rope and all(isinstance(v, dict) for v in rope.values()):
        raise CheckpointError("per-layer rope_parameters are not supported.")
    if float(rope.get("partial_rotary_factor", c.get("partial_rotary_factor") or 1.0)) != 1.0:
        raise CheckpointError("a partial_rotary_factor other than 1 is not supported.")
    rope_type = rope.get("rope_type", rope.get("type")) or "default"
    if rope_type not in ROPE_TYPES:
        raise CheckpointError(
            f"rope_type {rope_type!r} is not supported (supported: {', '.join(ROPE_TYPES)})."
        )
    out = {
        "rope_theta": float(rope.get("rope_theta", c.get("rope_theta", 10000.0))),
        "rope_type": rope_type,
    }
    try:
        if rope_type != "default":
            out["rope_factor"] = float(rope["factor"])
        if rope_type == "llama3":
            out.update(
                rope_low_freq_factor=float(rope["low_freq_factor"]),
                rope_high_freq_factor=float(rope["high_freq_factor"]),
                rope_original_max_positions=int(
                    rope.get("original_max_position_embeddings", c["max_position_embeddings"])
                ),
            )
    except KeyError as e:
        raise CheckpointError(f"the {rope_type} rope scaling lacks {e}.") from None
    return out


def _hf_sliding(c: dict[str, Any], model_type: str, num_layers: int) -> dict[str, Any]:
    """Mistral: the window on every layer; Qwen2: only with `use_sliding_window`, on the layers
    that `layer_types` names (or from `max_window_layers` on, transformers' Qwen2Config rule)."""
    window = c.get("sliding_window")
    if model_type == "llama" or (model_type == "qwen2" and not c.get("use_sliding_window")):
        window = None
    if not window:
        return {}
    types = c.get("layer_types")
    if types is None and model_type == "qwen2":
        first = int(c.get("max_window_layers", 28))
        types = ["sliding_attention" if i >= first else "full_attention" for i in range(num_layers)]
    types = types or ["sliding_attention"] * num_layers
    if len(types) != num_layers or set(types) - {"sliding_attention", "full_attention"}:
        raise CheckpointError(
            f"layer_types {types} are not {num_layers} of full_attention and sliding_attention."
        )
    layers = tuple(i for i, t in enumerate(types) if t == "sliding_attention")
    return {"sliding_window": int(window), "sliding_layers": layers} if layers else {}


def normal_param(
    rngs: nnx.Rngs, shape: tuple[int, ...], axes: tuple[str, ...], scale: float, dtype: jnp.dtype
) -> nnx.Param:
    """A `shape` param drawn from N(0, scale^2), with `logical_axes=axes` metadata."""
    value = scale * jax.random.normal(rngs.params(), shape, jnp.float32)
    return nnx.Param(value.astype(dtype), logical_axes=axes)


def ones_param(shape: tuple[int, ...], axes: tuple[str, ...], dtype: jnp.dtype) -> nnx.Param:
    """A `shape` param of ones (norm scales), with `logical_axes=axes` metadata."""
    return nnx.Param(jnp.ones(shape, dtype), logical_axes=axes)


def zeros_param(shape: tuple[int, ...], axes: tuple[str, ...], dtype: jnp.dtype) -> nnx.Param:
    """A `shape` param of zeros (biases), with `logical_axes=axes` metadata."""
    return nnx.Param(jnp.zeros(shape, dtype), logical_axes=axes)


def rms_norm(x: jax.Array, weight: jax.Array, eps: float) -> jax.Array:
    """RMSNorm (Zhang & Sennrich 2019), computed in float32, returned in `x.dtype`."""
    x32 = x.astype(jnp.float32)
    y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
    return (y * weight.astype(jnp.float32)).astype(x.dtype)


def rope_inv_freq(cfg: LlamaConfig) -> np.ndarray:
    """The rotary inverse frequencies, `[head_dim // 2] float32`, radians per position.

    `theta ** (-2i / head_dim)`, then scaled as `cfg.rope_type` says (the formulas of Hugging Face
    `modeling_rope_utils`: `linear` divides every frequency by the factor; `llama3` divides the
    low frequencies by it, keeps the high ones, and interpolates smoothly between).
    """
    half = cfg.head_dim // 2
    inv_freq = 1.0 / (cfg.rope_theta ** (np.arange(half, dtype=np.float64) / half))
    if cfg.rope_type == "linear":
        inv_freq = inv_freq / cfg.rope_factor
    elif cfg.rope_type == "llama3":
        factor, low, high = cfg.rope_factor, cfg.rope_low_freq_factor, cfg.rope_high_freq_factor
        old_len = cfg.rope_original_max_positions
        wavelen = 2 * math.pi / inv_freq
        scaled = np.where(wavelen > old_len / low, inv_freq / factor, inv_freq)
        smooth = (old_len / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = (wavelen >= old_len / high) & (wavelen <= old_len / low)
        inv_freq = np.where(medium, smoothed, scaled)
    return inv_freq.astype(np.float32)


def rotary(x: jax.Array, positions: jax.Array, inv_freq: np.ndarray) -> jax.Array:
    """Rotary position embedding (Su et al. 2021), half-split layout.

    Args:
      x: `[batch, seq, heads, head_dim]`.
      positions: `[batch, seq] int32`.
      inv_freq: `[head_dim // 2]`, from `rope_inv_freq`.
    """
    half = x.shape[-1] // 2
    angles = positions.astype(jnp.float32)[..., None] * jnp.asarray(inv_freq)  # [B, T, half]
    cos = jnp.cos(angles)[:, :, None, :]
    sin = jnp.sin(angles)[:, :, None, :]
    x32 = x.astype(jnp.float32)
    x1, x2 = x32[..., :half], x32[..., half:]
    out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
    return out.astype(x.dtype)


class Attention(nnx.Module):
    def __init__(
        self,
        cfg: LlamaConfig,
        rngs: nnx.Rngs,
        dtype: jnp.dtype,
        window: int | None = None,
        attention: str = "xla",
    ):
        d, h, kv, hd = cfg.embed_dim, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.cfg = cfg
        self.window = window
        self.attention = attention
        self.q = normal_param(rngs, (d, h, hd), ("embed", "heads", "head_dim"), d**-0.5, dtype)
        self.k = normal_param(rngs, (d, kv, hd), ("embed", "kv_heads", "head_dim"), d**-0.5, dtype)
        self.v = normal_param(rngs, (d, kv, hd), ("embed", "kv_heads", "head_dim"), d**-0.5, dtype)
        self.o = normal_param(
            rngs, (h, hd, d), ("heads", "head_dim", "embed"), (h * hd) ** -0.5, dtype
        )
        if cfg.qkv_bias:
            self.q_bias = zeros_param((h, hd), ("heads", "head_dim"), dtype)
            self.k_bias = zeros_param((kv, hd), ("kv_heads", "head_dim"), dtype)
            self.v_bias = zeros_param((kv, hd), ("kv_heads", "head_dim"), dtype)
        if cfg.o_bias:
            self.o_bias = zeros_param((d,), ("embed",), dtype)

    def __call__(self, x: jax.Array, positions: jax.Array, segment_ids: jax.Array) -> jax.Array:
        cfg = self.cfg
        q = jnp.einsum("btd,dhk->bthk", x, self.q[...])
        k = jnp.einsum("btd,dhk->bthk", x, self.k[...])
        v = jnp.einsum("btd,dhk->bthk", x, self.v[...])
        if cfg.qkv_bias:
            q, k, v = q + self.q_bias[...], k + self.k_bias[...], v + self.v_bias[...]
        inv_freq = rope_inv_freq(cfg)
        q, k = rotary(q, positions, inv_freq), rotary(k, positions, inv_freq)
        # Causal attention within a segment (and within the window, where there is one).
        out = attend(
            q,
            k,
            v,
            segment_ids=segment_ids,
            positions=positions,
            window=self.window,
            implementation=self.attention,
        )
        out = jnp.einsum("bthk,hkd->btd", out, self.o[...])
        return out + self.o_bias[...] if cfg.o_bias else out


class MLP(nnx.Module):
    def __init__(self, cfg: LlamaConfig, rngs: nnx.Rngs, dtype: jnp.dtype):
        d, f = cfg.embed_dim, cfg.mlp_dim
        self.bias = cfg.mlp_bias
        self.gate = normal_param(rngs, (d, f), ("embed", "mlp"), d**-0.5, dtype)
        self.up = normal_param(rngs, (d, f), ("embed", "mlp"), d**-0.5, dtype)
        self.down = normal_param(rngs, (f, d), ("mlp", "embed"), f**-0.5, dtype)
        if cfg.mlp_bias:
            self.gate_bias = zeros_param((f,), ("mlp",), dtype)
            self.up_bias = zeros_param((f,), ("mlp",), dtype)
            self.down_bias = zeros_param((d,), ("embed",), dtype)

    def __call__(self, x: jax.Array) -> jax.Array:
        if not self.bias:
            return (jax.nn.silu(x @ self.gate[...]) * (x @ self.up[...])) @ self.down[...]
        gate = x @ self.gate[...] + self.gate_bias[...]
        hidden = jax.nn.silu(gate) * (x @ self.up[...] + self.up_bias[...])
        return hidden @ self.down[...] + self.down_bias[...]


class Block(nnx.Module):
    def __init__(
        self,
        cfg: LlamaConfig,
        rngs: nnx.Rngs,
        dtype: jnp.dtype,
        window: int | None = None,
        attention: str = "xla",
    ):
        self.eps = cfg.norm_eps
        self.attn_norm = ones_param((cfg.embed_dim,), ("embed",), dtype)
        self.attn = Attention(cfg, rngs, dtype, window, attention)
        self.mlp_norm = ones_param((cfg.embed_dim,), ("embed",), dtype)
        self.mlp = MLP(cfg, rngs, dtype)

    def __call__(self, x: jax.Array, positions: jax.Array, segment_ids: jax.Array) -> jax.Array:
        x = x + self.attn(rms_norm(x, self.attn_norm[...], self.eps), positions, segment_ids)
        return x + self.mlp(rms_norm(x, self.mlp_norm[...], self.eps))


class Llama(nnx.Module):
    """The decoder. `__call__` gives final hidden states; `unembedding()` the output matrix."""

    def __init__(
        self,
        cfg: LlamaConfig,
        rngs: nnx.Rngs,
        dtype: jnp.dtype = jnp.float32,
        attention: str = "xla",
    ):
        self.cfg = cfg
        self.embedding = normal_param(
            rngs, (cfg.vocab_size, cfg.embed_dim), ("vocab", "embed"), cfg.embed_dim**-0.5, dtype
        )
        self.layers = nnx.List(
            [
                Block(
                    cfg,
                    rngs,
                    dtype,
                    cfg.sliding_window if i in cfg.sliding_layers else None,
                    attention,
                )
                for i in range(cfg.num_layers)
            ]
        )
        self.final_norm = ones_param((cfg.embed_dim,), ("embed",), dtype)
        if not cfg.tie_embeddings:
            self.lm_head = normal_param(
                rngs,
                (cfg.embed_dim, cfg.vocab_size),
                ("embed", "vocab"),
                cfg.embed_dim**-0.5,
                dtype,
            )

    def __call__(
        self, tokens: jax.Array, positions: jax.Array, segment_ids: jax.Array
    ) -> jax.Array:
        """Final hidden states.

        Args:
          tokens, positions, segment_ids: `[batch, seq] int32`.

        Returns:
          `[batch, seq, embed_dim]` in the parameter dtype, after the final RMSNorm.
        """
        x = jnp.take(self.embedding[...], tokens, axis=0)
        for layer in self.layers:
            x = layer(x, positions, segment_ids)
        return rms_norm(x, self.final_norm[...], self.cfg.norm_eps)

    def unembedding(self) -> jax.Array:
        """`[embed_dim, vocab_size]`: the tied embedding transposed, or the separate head."""
        if self.cfg.tie_embeddings:
            return self.embedding[...].T
        return self.lm_head[...]
