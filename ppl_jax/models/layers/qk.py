"""What Llama 4 and DeepSeek-V3 do to queries and keys before attention, beyond
`ppl_jax.models.layers.rope`'s rotate-half rotation.

- `rotate_pairs`: the rotary embedding of adjacent pairs `(x0, x1), (x2, x3), ...`, each pair
  rotated by one frequency: Llama 4's complex multiplication (transformers 5
  `modeling_llama4.apply_rotary_emb`, `torch.view_as_complex` of pairs) and DeepSeek-V3's
  `rope_interleave` (`apply_rotary_pos_emb_interleave`). The output is laid out as the rotated
  even dims then the rotated odd dims (DeepSeek's layout; Llama 4 keeps the pairs interleaved):
  a permutation of the head's dims applied to queries and keys alike, so every query-key dot
  product, and the L2 norm over the head, is the same.
- `l2_norm`: Llama 4's `Llama4TextL2Norm`, an RMS normalisation without a weight,
  `x * rsqrt(mean(x^2) + eps)` in float32.
- `temperature`: Llama 4's attention temperature tuning on its NoPE layers (Nakanishi 2025,
  "Scalable-Softmax Is Superior for Attention", arXiv 2501.19399, as transformers implements it):
  queries at position p times `1 + attn_scale * log(1 + floor((p + 1) / floor_scale))`.
  transformers counts p along the row (`arange`, plus the cache's length); ppl_jax counts it
  within each segment, which is the same for a window scored alone.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np


def rotate_pairs(
    x: jax.Array, positions: jax.Array, inv_freq: np.ndarray, attention_factor: float = 1.0
) -> jax.Array:
    """Rotates the pairs of the last dim of `x` (see the module docstring).

    Args:
      x: `[batch, seq, heads, dim]`, `dim` even.
      positions: `[batch, seq] int32`.
      inv_freq: `[dim // 2] float32`, radians per position of each pair
        (`ppl_jax.models.layers.rope.inv_freq`).
      attention_factor: cos and sin are multiplied by it (YaRN's; 1 otherwise).

    Returns:
      `x.shape` in `x.dtype`: the rotated even dims, then the rotated odd dims; computed in
      float32.
    """
    angles = positions.astype(jnp.float32)[..., None] * jnp.asarray(inv_freq, jnp.float32)
    cos = (jnp.cos(angles) * attention_factor)[:, :, None, :]
    sin = (jnp.sin(angles) * attention_factor)[:, :, None, :]
    x32 = x.astype(jnp.float32)
    even, odd = x32[..., 0::2], x32[..., 1::2]
    out = jnp.concatenate([even * cos - odd * sin, odd * cos + even * sin], axis=-1)
    return out.astype(x.dtype)


def l2_norm(x: jax.Array, eps: float) -> jax.Array:
    """`x * rsqrt(mean(x^2, last dim) + eps)` in float32, returned in `x.dtype`."""
    x32 = x.astype(jnp.float32)
    return (x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)).astype(x.dtype)


def temperature(positions: jax.Array, floor_scale: float, attn_scale: float) -> jax.Array:
    """`[batch, seq] float32`: `1 + attn_scale * log1p(floor((positions + 1) / floor_scale))`."""
    p = positions.astype(jnp.float32)
    return jnp.log1p(jnp.floor((p + 1.0) / floor_scale)) * attn_scale + 1.0
