"""Rotary position embeddings (Su et al. 2021) and their scalings, as transformers 5 computes them.

The scalings are those of Hugging Face `modeling_rope_utils` (transformers 5.23), in the
`rope_parameters` vocabulary:

- `default`: `inv_freq_i = theta ** (-2i / dim)`.
- `linear`: every frequency divided by `factor` (Chen et al. 2023, position interpolation).
- `llama3`: low frequencies divided by `factor`, high ones kept, smooth in between (Llama 3.1).
- `yarn` (Peng et al. 2023): frequencies blended between interpolated and original by a linear
  ramp over the dims between the correction range of `beta_fast` and `beta_slow` rotations at
  `original_max_position_embeddings`; cos and sin times the attention factor (`0.1 ln(factor)
  + 1`, or the `mscale`/`mscale_all_dim` ratio, or the stored `attention_factor`).
- `longrope` (Ding et al. 2024; Phi-3): `inv_freq_i = 1 / (ext_i * theta ** (2i / dim))` with
  `ext = long_factor` where the sequence is longer than `original_max_position_embeddings` and
  `short_factor` otherwise; cos and sin times `sqrt(1 + ln(factor) / ln(original))`. transformers
  picks the set by `max(position_ids) + 1` of the forward call; here each segment (window) picks
  by its own length, which is the same for a window scored alone.
- `dynamic` (NTK-aware): the `default` frequencies up to `max_position_embeddings`. Past it
  transformers rescales theta by the longest sequence it has seen so far (a state of the module),
  so ppl_jax limits such a model to windows of at most that length (`max_positions`).

With `partial_rotary_factor` < 1 (GPT-NeoX `rotary_pct`, Phi-3), only the first
`rotary_dim = int(head_dim * factor)` dims of each head rotate (rotate-half within them); the
rest pass through.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

ROPE_TYPES = ("default", "linear", "llama3", "yarn", "longrope", "dynamic")


def inv_freq(cfg, long: bool = False) -> np.ndarray:
    """`[rotary_dim // 2] float32`, radians per position, for a config with the `rope_*` fields of
    `ppl_jax.models.llama.LlamaConfig` (`long`: longrope's long factors)."""
    dim = rotary_dim(cfg)
    half = dim // 2
    exponent = np.arange(0, dim, 2, dtype=np.float64) / dim
    base = cfg.rope_theta**exponent
    freq = 1.0 / base
    kind = cfg.rope_type
    if kind == "linear":
        freq = freq / cfg.rope_factor
    elif kind == "llama3":
        factor, low, high = cfg.rope_factor, cfg.rope_low_freq_factor, cfg.rope_high_freq_factor
        old_len = cfg.rope_original_max_positions
        wavelen = 2 * math.pi / freq
        scaled = np.where(wavelen > old_len / low, freq / factor, freq)
        smooth = (old_len / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = (wavelen >= old_len / high) & (wavelen <= old_len / low)
        freq = np.where(medium, smoothed, scaled)
    elif kind == "yarn":
        freq = _yarn(cfg, base, dim)
    elif kind == "longrope":
        factors = cfg.rope_long_factor if long else cfg.rope_short_factor
        freq = 1.0 / (np.asarray(factors, np.float64)[:half] * base)
    return freq.astype(np.float32)


def _yarn(cfg, base: np.ndarray, dim: int) -> np.ndarray:
    theta, factor, old_len = cfg.rope_theta, cfg.rope_factor, cfg.rope_original_max_positions

    def correction_dim(rotations):
        return (dim * math.log(old_len / (rotations * 2 * math.pi))) / (2 * math.log(theta))

    low, high = correction_dim(cfg.rope_beta_fast), correction_dim(cfg.rope_beta_slow)
    if cfg.rope_truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # transformers' guard against a zero-width ramp
    ramp = np.clip((np.arange(dim // 2, dtype=np.float32) - low) / (high - low), 0, 1)
    extrapolation = 1 - ramp.astype(np.float64)
    return (1.0 / (factor * base)) * (1 - extrapolation) + (1.0 / base) * extrapolation


def rotary_dim(cfg) -> int:
    """The rotated dims of each head: `cfg.rotary_dim`, or all of `cfg.head_dim` when 0."""
    return cfg.rotary_dim or cfg.head_dim


def segment_lengths(positions: jax.Array, segment_ids: jax.Array) -> jax.Array:
    """`[batch, seq] int32`: the length (largest position + 1) of each token's segment."""
    t = positions.shape[1]

    def one(p, s):
        return jax.ops.segment_max(p, s, num_segments=t + 1)[s] + 1

    return jax.vmap(one)(positions, segment_ids)


def rotary(x: jax.Array, positions: jax.Array, segment_ids: jax.Array, cfg) -> jax.Array:
    """Rotates `x` (`[batch, seq, heads, head_dim]`) by `positions` (`[batch, seq] int32`) as
    `cfg`'s scaling says (see the module docstring); returned in `x.dtype`."""
    dim = rotary_dim(cfg)
    half = dim // 2
    freq = jnp.asarray(inv_freq(cfg))
    pos = positions.astype(jnp.float32)[..., None]
    if cfg.rope_type == "longrope":
        long = segment_lengths(positions, segment_ids) > cfg.rope_original_max_positions
        freq = jnp.where(long[..., None], jnp.asarray(inv_freq(cfg, long=True)), freq)
    angles = pos * freq  # [B, T, half]
    scale = cfg.rope_attention_factor
    cos = (jnp.cos(angles) * scale)[:, :, None, :]
    sin = (jnp.sin(angles) * scale)[:, :, None, :]
    x32 = x.astype(jnp.float32)
    x1, x2, rest = x32[..., :half], x32[..., half:dim], x32[..., dim:]
    out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin, rest], axis=-1)
    return out.astype(x.dtype)


def from_hf(rope: dict, c: dict, head_dim: int, max_positions: int) -> dict:
    """The `rope_*` fields of `LlamaConfig` from one `rope_parameters` dict (transformers 5; or a
    legacy `rope_scaling` merged with `rope_theta`) of the config `c`.

    Raises:
      ValueError: an unsupported `rope_type`, or a scaling that lacks one of its parameters
        (the caller names the file).
    """
    kind = rope.get("rope_type", rope.get("type")) or "default"
    if kind not in ROPE_TYPES:
        raise ValueError(
            f"rope_type {kind!r} is not supported (supported: {', '.join(ROPE_TYPES)})"
        )
    partial = float(rope.get("partial_rotary_factor", c.get("partial_rotary_factor") or 1.0))
    out = {
        "rope_theta": float(rope.get("rope_theta", c.get("rope_theta", 10000.0))),
        "rope_type": kind,
        "rotary_dim": 0 if partial == 1.0 else int(head_dim * partial),
    }
    original = rope.get("original_max_position_embeddings")
    if c.get("model_type") == "phi3" and c.get("original_max_position_embeddings"):
        original = c["original_max_position_embeddings"]  # transformers' Phi-3 exception
    original = int(original or max_positions)
    try:
        if kind in ("linear", "llama3", "yarn", "dynamic"):
            out["rope_factor"] = float(rope["factor"])
        if kind == "llama3":
            out.update(
                rope_low_freq_factor=float(rope["low_freq_factor"]),
                rope_high_freq_factor=float(rope["high_freq_factor"]),
                rope_original_max_positions=original,
            )
        elif kind == "yarn":
            out.update(
                rope_original_max_positions=original,
                rope_beta_fast=float(rope.get("beta_fast") or 32),
                rope_beta_slow=float(rope.get("beta_slow") or 1),
                rope_truncate=bool(rope.get("truncate", True)),
                rope_attention_factor=_yarn_attention(rope, out["rope_factor"]),
            )
        elif kind == "longrope":
            factor = rope.get("factor") or max_positions / original
            attention = rope.get("attention_factor")
            if attention is None:
                attention = (
                    1.0 if factor <= 1 else math.sqrt(1 + math.log(factor) / math.log(original))
                )
            half = (out["rotary_dim"] or head_dim) // 2
            out.update(
                rope_original_max_positions=original,
                rope_short_factor=tuple(float(f) for f in rope["short_factor"]),
                rope_long_factor=tuple(float(f) for f in rope["long_factor"]),
                rope_attention_factor=float(attention),
            )
            if len(out["rope_short_factor"]) != half or len(out["rope_long_factor"]) != half:
                raise ValueError(f"longrope's short_factor and long_factor need {half} values each")
    except KeyError as e:
        raise ValueError(f"the {kind} rope scaling lacks {e}") from None
    return out


def _yarn_attention(rope: dict, factor: float) -> float:
    if rope.get("attention_factor") is not None:
        return float(rope["attention_factor"])

    def mscale(scale, m=1.0):
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    if rope.get("mscale") and rope.get("mscale_all_dim"):
        return float(mscale(factor, rope["mscale"]) / mscale(factor, rope["mscale_all_dim"]))
    return float(mscale(factor))
