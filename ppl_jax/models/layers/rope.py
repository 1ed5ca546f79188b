"""Rotary position embeddings (Su et al. 2021) and their scalings, as transformers 5 computes them.

The scalings are those of Hugging Face `modeling_rope_utils` (transformers 5.24), in the
`rope_parameters` vocabulary, computed in transformers' float32 order of operations
(`frequencies`; equal to its `inv_freq` bit for bit but where PyTorch's `powf` rounds the other
way, tests/golden/rope):

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

Angles (`rope_angles`, the run's `model.rope_angles`; `cos_sin`): `float32` forms `position *
inv_freq` in float32 as transformers does, so that ppl_jax equals it at any position; the
float32 angle drifts from the formula's by up to about `position * 2^-23` rad (0.04 in `cos` at
1M positions for Llama 3.1's frequencies). `exact` reduces the float64 angle on the host and is
within 3e-7 of the float64 cosine at every position (`benchmarks/bench_rope.py`).
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

ROPE_TYPES = ("default", "linear", "llama3", "yarn", "longrope", "dynamic")
ANGLES = ("float32", "exact")  # `rope_angles`: transformers' float32 arithmetic, or exact angles


def inv_freq(cfg, long: bool = False) -> np.ndarray:
    """`[rotary_dim // 2] float32`, radians per position, as transformers computes them (`long`:
    longrope's long factors), for a config with the `rope_*` fields of
    `ppl_jax.models.decoders.llama.LlamaConfig` (see `frequencies`)."""
    return frequencies(cfg, long, np.float32)


def frequencies(cfg, long: bool = False, dtype: Any = np.float32) -> np.ndarray:
    """`[rotary_dim // 2]` radians per position in `dtype`, by the formulas of transformers'
    `modeling_rope_utils` in their order of operations.

    In float32 every operation is transformers' own in float32 (each correctly rounded, as
    NumPy's and PyTorch's float32 arithmetic is): the exponent `2i / dim`, the power `theta **
    exponent`, `1.0 / x` as PyTorch evaluates a scalar over a tensor (a reciprocal, then a
    product), the scalings' products and quotients. The power alone may differ: it is rounded
    correctly here, while PyTorch's `powf` (SLEEF's on x86 CPUs, CUDA's on GPUs) is accurate to
    one unit in the last place but not always correctly rounded, so a frequency may differ from
    transformers' by one unit in the last place (e.g. theta 1e6, dim 128: one of 64, by 2e-11
    rad per position). In float64 the same formulas give the frequencies as they are meant
    (`rope_angles=exact`).
    """
    c = np.dtype(dtype).type
    dim = rotary_dim(cfg)
    half = dim // 2
    base = powers(cfg, dtype)
    freq = c(1) / base
    kind = cfg.rope_type
    if kind == "linear":
        freq = freq / c(cfg.rope_factor)
    elif kind == "llama3":
        factor, low, high = cfg.rope_factor, cfg.rope_low_freq_factor, cfg.rope_high_freq_factor
        old_len = cfg.rope_original_max_positions
        wavelen = (c(1) / freq) * c(2 * math.pi)  # PyTorch's `2 * pi / t`: a reciprocal, a product
        scaled = np.where(wavelen > c(old_len / low), freq / c(factor), freq)
        smooth = ((c(1) / wavelen) * c(old_len) - c(low)) / c(high - low)
        smoothed = ((c(1) - smooth) * scaled) / c(factor) + smooth * scaled
        medium = ~(wavelen < c(old_len / high)) & ~(wavelen > c(old_len / low))
        freq = np.where(medium, smoothed, scaled)
    elif kind == "yarn":
        freq = _yarn(cfg, base, dim, c)
    elif kind == "longrope":
        factors = cfg.rope_long_factor if long else cfg.rope_short_factor
        freq = c(1) / (np.asarray(factors, dtype)[:half] * base)
    return np.asarray(freq, dtype)


def powers(cfg, dtype: Any = np.float32) -> np.ndarray:
    """`[rotary_dim // 2]`: `theta ** (2i / dim)` in `dtype`, the exponent in `dtype` and the
    power rounded correctly from float64 (transformers' `base ** (arange(0, dim, 2) / dim)`)."""
    c = np.dtype(dtype).type
    dim = rotary_dim(cfg)
    exponent = np.arange(0, dim, 2).astype(dtype) / c(dim)
    return (np.float64(c(cfg.rope_theta)) ** exponent.astype(np.float64)).astype(dtype)


def _yarn(cfg, base: np.ndarray, dim: int, c: Any) -> np.ndarray:
    theta, factor, old_len = cfg.rope_theta, cfg.rope_factor, cfg.rope_original_max_positions

    def correction_dim(rotations):
        return (dim * math.log(old_len / (rotations * 2 * math.pi))) / (2 * math.log(theta))

    low, high = correction_dim(cfg.rope_beta_fast), correction_dim(cfg.rope_beta_slow)
    if cfg.rope_truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # transformers' guard against a zero-width ramp
    ramp = np.clip((np.arange(dim // 2).astype(base.dtype) - c(low)) / c(high - low), 0, 1)
    extrapolation = c(1) - ramp
    interpolated, extrapolated = c(1) / (c(factor) * base), c(1) / base
    return interpolated * (c(1) - extrapolation) + extrapolated * extrapolation


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
    cos, sin = cos_sin(positions, segment_ids, cfg)
    cos, sin = cos[:, :, None, :], sin[:, :, None, :]
    x32 = x.astype(jnp.float32)
    x1, x2, rest = x32[..., :half], x32[..., half:dim], x32[..., dim:]
    out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin, rest], axis=-1)
    return out.astype(x.dtype)


def cos_sin(positions: jax.Array, segment_ids: jax.Array, cfg) -> tuple[jax.Array, jax.Array]:
    """`(cos, sin)`, each `[batch, seq, rotary_dim // 2] float32`, of the rotation angles of
    `positions` (`[batch, seq] int32`), times the scaling's attention factor.

    `cfg.rope_angles` (`ANGLES`) says how the angles are formed:

    - `float32` (the default): as transformers forms them, `float32(position) * inv_freq` in
      float32 with the float32 frequencies (`inv_freq`), whose cosine XLA takes. The angle
      `position * inv_freq` is rounded to float32, whose spacing is 0.0625 rad at 1e6 rad: at
      position p the angle is off by up to `p * 2^-24` of its own size from the float32 inputs'
      exact product, and the frequency itself by half a unit in the last place of float32 from
      its value in the formula; both grow with the position.
    - `exact`: the angles of the formulas' float64 frequencies (`frequencies(cfg, long,
      np.float64)`), reduced in float64 on the host: a position `p = h * B + l` (`B`, a power of
      two near `sqrt(max_positions)`) turns by `h * B * f` and by `l * f`, whose cosines and
      sines NumPy takes in float64 (with full range reduction) into two float32 tables; the
      device adds the two turns (`cos(a + b) = cos a cos b - sin a sin b`). The result is within
      about 3e-7 of the float64 cosine whatever the position.
    """
    mode = getattr(cfg, "rope_angles", "float32")

    def one(long: bool) -> tuple[jax.Array, jax.Array]:
        if mode == "exact":
            freq = frequencies(cfg, long, np.float64)
            return exact_cos_sin(positions, freq, cfg.max_positions)
        angles = positions.astype(jnp.float32)[..., None] * jnp.asarray(inv_freq(cfg, long))
        return jnp.cos(angles), jnp.sin(angles)

    cos, sin = one(False)
    if cfg.rope_type == "longrope":
        long = (segment_lengths(positions, segment_ids) > cfg.rope_original_max_positions)[
            ..., None
        ]
        cos_long, sin_long = one(True)
        cos, sin = jnp.where(long, cos_long, cos), jnp.where(long, sin_long, sin)
    scale = cfg.rope_attention_factor
    return cos * scale, sin * scale


def exact_cos_sin(
    positions: jax.Array, freq: np.ndarray, max_positions: int
) -> tuple[jax.Array, jax.Array]:
    """`(cos, sin)` `[..., len(freq)] float32` of `positions * freq` (`freq`: float64 radians
    per position), reduced in float64 on the host (see `cos_sin`); positions in
    `[0, max_positions)`."""
    n = max(int(max_positions), 1)
    block = 1 << max(0, math.ceil(math.log2(n) / 2))
    rows = -(-n // block)
    high = (np.arange(rows, dtype=np.float64) * block)[:, None] * freq  # [rows, half] radians
    low = np.arange(block, dtype=np.float64)[:, None] * freq  # [block, half]
    tables = [jnp.asarray(f(a), jnp.float32) for a in (high, low) for f in (np.cos, np.sin)]
    h = jnp.clip(positions // block, 0, rows - 1)
    k = positions % block
    cos_h, sin_h = tables[0][h], tables[1][h]
    cos_l, sin_l = tables[2][k], tables[3][k]
    return cos_h * cos_l - sin_h * sin_l, sin_h * cos_l + cos_h * sin_l


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
