"""Mamba2 language models (Dao & Gu 2024; Hugging Face `mamba2`, transformers 5.24's
`Mamba2ForCausalLM`): an embedding, layers of `x + mixer(rms_norm(x))` with the Mamba2 layer of
`ppl_jax.models.layers.ssd`, a final RMSNorm, and the output matrix (tied to the embedding or not).

With `residual_in_fp32` (transformers' default) the residual stream is kept in float32 and each
layer's input is cast to the weights' dtype, as `Mamba2Block` does; RMSNorms scale by their
weight after casting back (`Mamba2RMSNorm`). Mamba2 has no position embedding and no window: a
window of any length is scored (`max_positions` is a bound of memory, not of the model).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
from flax import nnx

from ppl_jax.errors import CheckpointError
from ppl_jax.models.decoders import hybrid
from ppl_jax.models.decoders.stack import run_layers
from ppl_jax.models.family import Family, Layer
from ppl_jax.models.layers import packed, ssd
from ppl_jax.models.layers.core import normal_param, ones_param

NO_POSITION_LIMIT = 1 << 20  # the recurrent families' max_positions: no limit of the model's own


@dataclasses.dataclass(frozen=True, kw_only=True)
class Mamba2Config(ssd.SsmFields, hybrid.DescribedConfig):
    """Architecture of a Mamba2 language model (stored as JSON beside each checkpoint).

    Attributes:
      vocab_size, embed_dim, num_layers: the sizes.
      ssm_*: every layer's Mamba2 layer (`SsmFields`).
      norm_eps: the RMSNorms' epsilon (`layer_norm_epsilon`).
      tie_embeddings: the output matrix is the embedding's transpose.
      residual_in_fp32: the residual stream in float32 (`residual_in_fp32`).
      max_positions: the longest window scored.
      model_type: the Hugging Face model type it was read from.
    """

    FAMILY: ClassVar[str] = "mamba2"
    vocab_size: int
    embed_dim: int
    num_layers: int
    norm_eps: float = 1e-5
    tie_embeddings: bool = True
    residual_in_fp32: bool = True
    max_positions: int = NO_POSITION_LIMIT
    model_type: str = "mamba2"

    def __post_init__(self):
        ssd.mixer_spec(self)  # raises for an impossible layer


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
    low, high = ssd.dt_limit(c.get("time_step_limit"))
    return Mamba2Config(
        vocab_size=int(c["vocab_size"]),
        embed_dim=d,
        num_layers=int(c["num_hidden_layers"]),
        ssm_heads=heads,
        ssm_head_dim=head_dim,
        ssm_groups=int(c.get("n_groups", 8)),
        ssm_state=int(c.get("state_size", 128)),
        ssm_conv=int(c.get("conv_kernel", 4)),
        ssm_chunk=int(c.get("chunk_size", 256)),
        ssm_dt_min=low,
        ssm_dt_max=None if math.isinf(high) else high,
        ssm_conv_bias=bool(c.get("use_conv_bias", True)),
        ssm_in_bias=bool(c.get("use_bias", False)),
        ssm_out_bias=bool(c.get("use_bias", False)),
        norm_eps=eps,
        tie_embeddings=bool(c.get("tie_word_embeddings", False)),
        residual_in_fp32=bool(c.get("residual_in_fp32", True)),
    )


class Block(nnx.Module):
    def __init__(self, cfg: Mamba2Config, rngs: nnx.Rngs, dtype: jnp.dtype):
        self.eps = cfg.norm_eps
        self.norm = ones_param((cfg.embed_dim,), ("embed",), dtype)
        self.mixer = ssd.Mamba2Mixer(ssd.mixer_spec(cfg), rngs, dtype)

    def __call__(self, x: jax.Array, segment_ids: jax.Array) -> jax.Array:
        h = hybrid.norm_then_cast(x.astype(self.norm.dtype), self.norm[...], self.eps)
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
        x = packed.take(self.embedding, tokens)
        if self.cfg.residual_in_fp32:
            x = x.astype(jnp.float32)
        x = run_layers(self.layers, x, segment_ids)
        w = self.final_norm[...]
        return hybrid.norm_then_cast(x, w, self.cfg.norm_eps).astype(w.dtype)

    def unembedding(self) -> jax.Array:
        return self.embedding[...].T if self.cfg.tie_embeddings else self.lm_head[...]


LAYER = r"layers\.(?P<l>\d+)\."


def rules(d: dict[str, Any]) -> list[dict[str, Any]]:
    """The mapping rules of a `mamba2` directory's weights (names without `backbone.`)."""
    return [
        *hybrid.embedding_rules(d, r"embeddings\.weight", r"norm_f\.weight"),
        {"from": LAYER + r"norm\.weight", "to": "layers/{l}/norm"},
        *ssd.hf_rules(LAYER + r"mixer\.", "layers/{l}/mixer/"),
    ]


FAMILY = Family(
    name="mamba2",
    config=Mamba2Config,
    module=Mamba2,
    hf_sizes={
        "chunk_size": ("ssm_chunk", 1),
        "conv_kernel": ("ssm_conv", 1),
        "num_heads": ("ssm_heads", 1),
        **dict.fromkeys(("n_groups", "expand"), ("ssm_groups", 1)),
        "state_size": ("ssm_state", 1),
    },
    hf_readers={"mamba2": from_hf_config},
    hf_rules=rules,
    hf_prefixes=("backbone.",),
    layers=lambda cfg: tuple(Layer("state_space", "none") for _ in range(cfg.num_layers)),
)
