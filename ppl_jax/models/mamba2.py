"""Mamba2 language models (Dao & Gu 2024; Hugging Face `mamba2`, transformers 5.24's
`Mamba2ForCausalLM`): an embedding, layers of `x + mixer(rms_norm(x))` with the Mamba2 layer of
`ppl_jax.models.ssd`, a final RMSNorm, and the output matrix (tied to the embedding or not).

With `residual_in_fp32` (transformers' default) the residual stream is kept in float32 and each
layer's input is cast to the weights' dtype, as `Mamba2Block` does; RMSNorms scale by their
weight after casting back (`Mamba2RMSNorm`). Mamba2 has no position embedding and no window: a
window of any length is scored (`max_positions` is a bound of memory, not of the model).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from ppl_jax.errors import CheckpointError
from ppl_jax.models import ssd
from ppl_jax.models.llama import normal_param, ones_param

NO_POSITION_LIMIT = 1 << 20  # the recurrent families' max_positions: no limit of the model's own


@dataclasses.dataclass(frozen=True)
class Mamba2Config:
    """Architecture of a Mamba2 language model (stored as JSON beside each checkpoint).

    Attributes:
      vocab_size, embed_dim, num_layers: the sizes.
      ssm: every layer's Mamba2 mixer.
      norm_eps: the RMSNorms' epsilon (`layer_norm_epsilon`).
      tie_embeddings: the output matrix is the embedding's transpose.
      residual_in_fp32: the residual stream in float32 (`residual_in_fp32`).
      max_positions: the longest window scored.
    """

    vocab_size: int
    embed_dim: int
    num_layers: int
    ssm: ssd.Mamba2Spec
    norm_eps: float = 1e-5
    tie_embeddings: bool = True
    residual_in_fp32: bool = True
    max_positions: int = NO_POSITION_LIMIT

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["ssm"] = spec_to_dict(self.ssm)
        return {"family": "mamba2", **d}

    @staticmethod
    def from_dict(d: dict[str, Any]) -> Mamba2Config:
        fields = {f.name for f in dataclasses.fields(Mamba2Config)}
        unknown = set(d) - fields - {"family"}
        if d.get("family") != "mamba2" or unknown:
            raise CheckpointError(
                f"the stored architecture (family {str(d.get('family'))[:40]!r}) is not a "
                f"Mamba2 description (unknown keys: {sorted(unknown)[:5]})."
            )
        kwargs = {k: v for k, v in d.items() if k in fields and k != "family"}
        kwargs["ssm"] = spec_from_dict(d["ssm"])
        return Mamba2Config(**kwargs)


def spec_to_dict(spec: ssd.Mamba2Spec) -> dict[str, Any]:
    """A `Mamba2Spec` as JSON-able data (an infinite dt limit as None)."""
    d = dataclasses.asdict(spec)
    d["dt_limit"] = [None if math.isinf(v) else v for v in spec.dt_limit]
    d["part_scales"] = list(spec.part_scales)
    return d


def spec_from_dict(d: dict[str, Any]) -> ssd.Mamba2Spec:
    """The inverse of `spec_to_dict`.

    Raises:
      CheckpointError: unknown keys.
    """
    fields = {f.name for f in dataclasses.fields(ssd.Mamba2Spec)}
    if set(d) - fields:
        raise CheckpointError(f"unknown keys of a Mamba2 layer: {sorted(set(d) - fields)[:5]}.")
    d = dict(d)
    if "dt_limit" in d:
        low, high = d["dt_limit"]
        d["dt_limit"] = (float(low or 0.0), float("inf") if high is None else float(high))
    if "part_scales" in d:
        d["part_scales"] = tuple(float(v) for v in d["part_scales"])
    return ssd.Mamba2Spec(**d)


def dt_limit(value: Any, low_default: float = 0.0) -> tuple[float, float]:
    """`time_step_limit` of a `config.json` (a pair; transformers writes infinity as
    `{"__float__": "Infinity"}`), as `(low, high)` floats.

    Raises:
      CheckpointError: not a pair of numbers.
    """

    def number(v):
        if isinstance(v, dict) and set(v) == {"__float__"}:
            v = v["__float__"]
        return float(v)

    if value is None:
        return (low_default, float("inf"))
    try:
        low, high = (number(v) for v in value)
    except (TypeError, ValueError):
        raise CheckpointError(
            f"time_step_limit {str(value)[:60]} is not a pair of numbers."
        ) from None
    return (low, high)


def from_hf_config(c: dict[str, Any]) -> Mamba2Config:
    """The architecture of a Hugging Face `mamba2` `config.json` (transformers 5.24's defaults
    for missing fields).

    Raises:
      CheckpointError: an activation other than silu, inconsistent sizes. KeyError: a required
        field is missing.
    """
    if (c.get("hidden_act") or "silu") != "silu":
        raise CheckpointError(f"hidden_act {str(c['hidden_act'])[:40]!r} is not supported (silu).")
    d = int(c["hidden_size"])
    heads, head_dim = int(c.get("num_heads", 128)), int(c.get("head_dim", 64))
    if heads * head_dim != int(c.get("expand", 2)) * d:
        raise CheckpointError(
            f"num_heads * head_dim = {heads * head_dim} differs from expand * hidden_size = "
            f"{int(c.get('expand', 2)) * d} (transformers refuses such a config too)."
        )
    eps = float(c.get("layer_norm_epsilon", 1e-5))
    spec = ssd.Mamba2Spec(
        embed_dim=d,
        heads=heads,
        head_dim=head_dim,
        groups=int(c.get("n_groups", 8)),
        state_dim=int(c.get("state_size", 128)),
        conv_kernel=int(c.get("conv_kernel", 4)),
        chunk=int(c.get("chunk_size", 256)),
        norm_eps=eps,
        dt_limit=dt_limit(c.get("time_step_limit")),
        conv_bias=bool(c.get("use_conv_bias", True)),
        in_bias=bool(c.get("use_bias", False)),
        out_bias=bool(c.get("use_bias", False)),
        norm="gated",
    )
    return Mamba2Config(
        vocab_size=int(c["vocab_size"]),
        embed_dim=d,
        num_layers=int(c["num_hidden_layers"]),
        ssm=spec,
        norm_eps=eps,
        tie_embeddings=bool(c.get("tie_word_embeddings", False)),
        residual_in_fp32=bool(c.get("residual_in_fp32", True)),
    )


def norm_then_cast(x: jax.Array, weight: jax.Array, eps: float) -> jax.Array:
    """transformers' `Mamba2RMSNorm`/`FalconH1RMSNorm`: `w * x̂` with x̂ (float32) cast to `x`'s
    dtype first, in the weight's dtype."""
    x32 = x.astype(jnp.float32)
    y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
    return weight * y.astype(x.dtype)


class Block(nnx.Module):
    def __init__(self, cfg: Mamba2Config, rngs: nnx.Rngs, dtype: jnp.dtype):
        self.eps = cfg.norm_eps
        self.norm = ones_param((cfg.embed_dim,), ("embed",), dtype)
        self.mixer = ssd.Mamba2Mixer(cfg.ssm, rngs, dtype)

    def __call__(self, x: jax.Array, segment_ids: jax.Array) -> jax.Array:
        h = norm_then_cast(x.astype(self.norm.dtype), self.norm[...], self.eps)
        return x + self.mixer(h, segment_ids).astype(x.dtype)


class Mamba2(nnx.Module):
    """The language model. `__call__(tokens, positions, segment_ids)` gives final hidden states
    `[B, T, embed]` in the weights' dtype; `unembedding()` the `[embed, vocab]` output matrix.
    Positions are not read: the recurrent layers restart at each segment start."""

    def __init__(
        self, cfg: Mamba2Config, rngs: nnx.Rngs, dtype: jnp.dtype = jnp.float32, attention="xla"
    ):
        del attention  # no attention layer
        self.cfg = cfg
        d = cfg.embed_dim
        self.embedding = normal_param(rngs, (cfg.vocab_size, d), ("vocab", "embed"), d**-0.5, dtype)
        self.layers = nnx.List([Block(cfg, rngs, dtype) for _ in range(cfg.num_layers)])
        self.final_norm = ones_param((d,), ("embed",), dtype)
        if not cfg.tie_embeddings:
            self.lm_head = normal_param(
                rngs, (d, cfg.vocab_size), ("embed", "vocab"), d**-0.5, dtype
            )

    def __call__(self, tokens: jax.Array, positions: jax.Array, segment_ids: jax.Array):
        del positions
        x = jnp.take(self.embedding[...], tokens, axis=0)
        if self.cfg.residual_in_fp32:
            x = x.astype(jnp.float32)
        for layer in self.layers:
            x = layer(x, segment_ids)
        w = self.final_norm[...]
        return norm_then_cast(x, w, self.cfg.norm_eps).astype(w.dtype)

    def unembedding(self) -> jax.Array:
        return self.embedding[...].T if self.cfg.tie_embeddings else self.lm_head[...]
