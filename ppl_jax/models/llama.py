"""A decoder of the Llama family in Flax NNX: RMSNorm, rotary embeddings, SwiGLU, grouped-query
attention, optionally tied embeddings (Touvron et al. 2023, "LLaMA"; Ainslie et al. 2023, "GQA").

Every parameter carries its logical axis names in the `logical_axes` metadata of its `nnx.Param`
(`vocab`, `embed`, `heads`, `kv_heads`, `head_dim`, `mlp`); `ppl_jax.mesh` maps them to mesh axes
with the table in the config. The rotary embedding rotates the two halves of each head
(the Hugging Face `rotate_half` layout), so that Hugging Face Llama weights load unchanged.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from ppl_jax.errors import CheckpointError


@dataclasses.dataclass(frozen=True)
class LlamaConfig:
    """Architecture of a Llama-family decoder (stored as JSON beside each checkpoint)."""

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

    def to_dict(self) -> dict[str, Any]:
        return {"family": "llama", **dataclasses.asdict(self)}

    @staticmethod
    def from_dict(d: dict[str, Any]) -> LlamaConfig:
        fields = {f.name for f in dataclasses.fields(LlamaConfig)}
        unknown = set(d) - fields - {"family"}
        if d.get("family", "llama") != "llama" or unknown:
            raise CheckpointError(
                f"the stored architecture {d!r} is not a Llama-family description "
                f"(unknown keys: {sorted(unknown)})."
            )
        return LlamaConfig(**{k: v for k, v in d.items() if k in fields})


def _param(rngs: nnx.Rngs, shape: tuple[int, ...], axes: tuple[str, ...], scale: float,
           dtype: jnp.dtype) -> nnx.Param:
    value = scale * jax.random.normal(rngs.params(), shape, jnp.float32)
    return nnx.Param(value.astype(dtype), logical_axes=axes)


def _ones(shape: tuple[int, ...], axes: tuple[str, ...], dtype: jnp.dtype) -> nnx.Param:
    return nnx.Param(jnp.ones(shape, dtype), logical_axes=axes)


def rms_norm(x: jax.Array, weight: jax.Array, eps: float) -> jax.Array:
    """RMSNorm (Zhang & Sennrich 2019), computed in float32, returned in `x.dtype`."""
    x32 = x.astype(jnp.float32)
    y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
    return (y * weight.astype(jnp.float32)).astype(x.dtype)


def rotary(x: jax.Array, positions: jax.Array, theta: float) -> jax.Array:
    """Rotary position embedding (Su et al. 2021), half-split layout.

    Args:
      x: `[batch, seq, heads, head_dim]`.
      positions: `[batch, seq] int32`.
    """
    half = x.shape[-1] // 2
    inv_freq = 1.0 / (theta ** (jnp.arange(half, dtype=jnp.float32) / half))
    angles = positions.astype(jnp.float32)[..., None] * inv_freq  # [B, T, half]
    cos = jnp.cos(angles)[:, :, None, :]
    sin = jnp.sin(angles)[:, :, None, :]
    x32 = x.astype(jnp.float32)
    x1, x2 = x32[..., :half], x32[..., half:]
    out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
    return out.astype(x.dtype)


class Attention(nnx.Module):
    def __init__(self, cfg: LlamaConfig, rngs: nnx.Rngs, dtype: jnp.dtype):
        d, h, kv, hd = cfg.embed_dim, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.cfg = cfg
        self.q = _param(rngs, (d, h, hd), ("embed", "heads", "head_dim"), d**-0.5, dtype)
        self.k = _param(rngs, (d, kv, hd), ("embed", "kv_heads", "head_dim"), d**-0.5, dtype)
        self.v = _param(rngs, (d, kv, hd), ("embed", "kv_heads", "head_dim"), d**-0.5, dtype)
        self.o = _param(rngs, (h, hd, d), ("heads", "head_dim", "embed"), (h * hd) ** -0.5, dtype)

    def __call__(self, x: jax.Array, positions: jax.Array, segment_ids: jax.Array) -> jax.Array:
        cfg = self.cfg
        q = rotary(jnp.einsum("btd,dhk->bthk", x, self.q[...]), positions, cfg.rope_theta)
        k = rotary(jnp.einsum("btd,dhk->bthk", x, self.k[...]), positions, cfg.rope_theta)
        v = jnp.einsum("btd,dhk->bthk", x, self.v[...])
        # Causal attention within a segment; padding (segment 0) only sees padding.
        same_segment = segment_ids[:, :, None] == segment_ids[:, None, :]  # [B, Tq, Tk]
        out = jax.nn.dot_product_attention(
            q, k, v, mask=same_segment[:, None, :, :], is_causal=True, implementation="xla"
        )
        return jnp.einsum("bthk,hkd->btd", out, self.o[...])


class MLP(nnx.Module):
    def __init__(self, cfg: LlamaConfig, rngs: nnx.Rngs, dtype: jnp.dtype):
        d, f = cfg.embed_dim, cfg.mlp_dim
        self.gate = _param(rngs, (d, f), ("embed", "mlp"), d**-0.5, dtype)
        self.up = _param(rngs, (d, f), ("embed", "mlp"), d**-0.5, dtype)
        self.down = _param(rngs, (f, d), ("mlp", "embed"), f**-0.5, dtype)

    def __call__(self, x: jax.Array) -> jax.Array:
        return (jax.nn.silu(x @ self.gate[...]) * (x @ self.up[...])) @ self.down[...]


class Block(nnx.Module):
    def __init__(self, cfg: LlamaConfig, rngs: nnx.Rngs, dtype: jnp.dtype):
        self.eps = cfg.norm_eps
        self.attn_norm = _ones((cfg.embed_dim,), ("embed",), dtype)
        self.attn = Attention(cfg, rngs, dtype)
        self.mlp_norm = _ones((cfg.embed_dim,), ("embed",), dtype)
        self.mlp = MLP(cfg, rngs, dtype)

    def __call__(self, x: jax.Array, positions: jax.Array, segment_ids: jax.Array) -> jax.Array:
        x = x + self.attn(rms_norm(x, self.attn_norm[...], self.eps), positions, segment_ids)
        return x + self.mlp(rms_norm(x, self.mlp_norm[...], self.eps))


class Llama(nnx.Module):
    """The decoder. `__call__` gives final hidden states; `unembedding()` the output matrix."""

    def __init__(self, cfg: LlamaConfig, rngs: nnx.Rngs, dtype: jnp.dtype = jnp.float32):
        self.cfg = cfg
        self.embedding = _param(rngs, (cfg.vocab_size, cfg.embed_dim), ("vocab", "embed"), cfg.embed_dim**-0.5,
                                dtype)
        self.layers = nnx.List([Block(cfg, rngs, dtype) for _ in range(cfg.num_layers)])
        self.final_norm = _ones((cfg.embed_dim,), ("embed",), dtype)
        if not cfg.tie_embeddings:
            self.lm_head = _param(rngs, (cfg.embed_dim, cfg.vocab_size), ("embed", "vocab"),
                                  cfg.embed_dim**-0.5, dtype)

    def __call__(self, tokens: jax.Array, positions: jax.Array,
                 segment_ids: jax.Array) -> jax.Array:
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
