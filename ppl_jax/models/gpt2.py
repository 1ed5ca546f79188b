"""GPT-2 in Flax NNX (Radford et al. 2019): learned absolute positions, pre-LayerNorm blocks,
multi-head causal attention, a GELU MLP, and (as published) the output tied to the token embedding.

The interface is that of `ppl_jax.models.llama.Llama`: `__call__(tokens, positions, segment_ids)`
gives the hidden states after the final LayerNorm, `unembedding()` the `[embed, vocab]` output
matrix. Attention is causal within a segment; segment 0 is padding. Positions index the learned
position table, so they must lie in `[0, max_positions)` (the scorer's windows start at 0).

Every parameter names its dims in `logical_axes` metadata with the names of
`ppl_jax.config.defaults.DEFAULT_RULES` (`vocab`, `embed`, `heads`, `head_dim`, `mlp`), plus `positions`
for the position table, which the rules do not map (replicated). The fused `c_attn` projection of
Hugging Face's `GPT2Attention` is held as separate q, k and v weights of shape
`[embed, heads, head_dim]`; its family's mapping rules (`ppl_jax.models.families.gpt2`)
split it on loading. The attention scale and activation
follow Hugging Face `modeling_gpt2` (`scale_attn_weights`, `scale_attn_by_inverse_layer_idx`,
`activation_function`).
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
from flax import nnx

from ppl_jax.errors import CheckpointError
from ppl_jax.models.attention import attend
from ppl_jax.models.context import per_token
from ppl_jax.models.layers import ACTIVATIONS, layer_norm, normal_param, ones_param, zeros_param
from ppl_jax.models.stack import run_layers


@dataclasses.dataclass(frozen=True)
class GPT2Config:
    """Architecture of a GPT-2 decoder (stored as JSON beside each checkpoint).

    Attributes:
      vocab_size, embed_dim (`n_embd`), num_layers (`n_layer`), num_heads (`n_head`),
      mlp_dim (`n_inner`, default 4 * embed_dim), max_positions (`n_positions`).
      norm_eps: LayerNorm epsilon (`layer_norm_epsilon`).
      activation: a key of `ACTIVATIONS` (`activation_function`).
      scale_attn_weights: divide attention scores by sqrt(head_dim).
      scale_attn_by_inverse_layer_idx: also divide them by (layer index + 1).
      tie_embeddings: the output matrix is the token embedding (otherwise a separate `lm_head`).
    """

    vocab_size: int
    embed_dim: int
    num_layers: int
    num_heads: int
    mlp_dim: int
    max_positions: int
    norm_eps: float = 1e-5
    activation: str = "gelu_new"
    scale_attn_weights: bool = True
    scale_attn_by_inverse_layer_idx: bool = False
    tie_embeddings: bool = True

    FAMILY: ClassVar[str] = "gpt2"

    def __post_init__(self):
        if self.activation not in ACTIVATIONS:
            raise CheckpointError(
                f"GPT-2 activation {self.activation!r} is not supported (supported: "
                f"{', '.join(ACTIVATIONS)})."
            )
        if self.embed_dim % self.num_heads:
            raise CheckpointError(
                f"GPT-2 embed_dim={self.embed_dim} is not a multiple of num_heads={self.num_heads}."
            )

    @property
    def head_dim(self) -> int:
        return self.embed_dim // self.num_heads

    def to_dict(self) -> dict[str, Any]:
        return {"family": "gpt2", **dataclasses.asdict(self)}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> GPT2Config:
        fields = {f.name for f in dataclasses.fields(GPT2Config)}
        unknown = set(d) - fields - {"family"}
        if d.get("family") != "gpt2" or unknown:
            raise CheckpointError(
                f"the stored architecture {d!r} is not a GPT-2 description "
                f"(unknown keys: {sorted(unknown)})."
            )
        return GPT2Config(**{k: v for k, v in d.items() if k in fields})


class Attention(nnx.Module):
    def __init__(
        self, cfg: GPT2Config, layer: int, rngs: nnx.Rngs, dtype: jnp.dtype, attention: str = "xla"
    ):
        d, h, hd = cfg.embed_dim, cfg.num_heads, cfg.head_dim
        self.attention = attention
        self.scale = (hd**-0.5 if cfg.scale_attn_weights else 1.0) / (
            layer + 1 if cfg.scale_attn_by_inverse_layer_idx else 1
        )
        axes = ("embed", "heads", "head_dim")
        self.q = normal_param(rngs, (d, h, hd), axes, d**-0.5, dtype)
        self.k = normal_param(rngs, (d, h, hd), axes, d**-0.5, dtype)
        self.v = normal_param(rngs, (d, h, hd), axes, d**-0.5, dtype)
        self.q_bias = zeros_param((h, hd), ("heads", "head_dim"), dtype)
        self.k_bias = zeros_param((h, hd), ("heads", "head_dim"), dtype)
        self.v_bias = zeros_param((h, hd), ("heads", "head_dim"), dtype)
        self.o = normal_param(rngs, (h, hd, d), ("heads", "head_dim", "embed"), d**-0.5, dtype)
        self.o_bias = zeros_param((d,), ("embed",), dtype)

    def __call__(self, x: jax.Array, positions: jax.Array, segment_ids: jax.Array) -> jax.Array:
        q = jnp.einsum("btd,dhk->bthk", x, self.q[...]) + self.q_bias[...]
        k = jnp.einsum("btd,dhk->bthk", x, self.k[...]) + self.k_bias[...]
        v = jnp.einsum("btd,dhk->bthk", x, self.v[...]) + self.v_bias[...]
        out = attend(
            q,
            k,
            v,
            segment_ids=segment_ids,
            positions=positions,
            scale=self.scale,
            implementation=self.attention,
        )
        return jnp.einsum("bthk,hkd->btd", out, self.o[...]) + self.o_bias[...]


class MLP(nnx.Module):
    def __init__(self, cfg: GPT2Config, rngs: nnx.Rngs, dtype: jnp.dtype):
        d, f = cfg.embed_dim, cfg.mlp_dim
        self.activation = cfg.activation
        self.fc = normal_param(rngs, (d, f), ("embed", "mlp"), d**-0.5, dtype)
        self.fc_bias = zeros_param((f,), ("mlp",), dtype)
        self.proj = normal_param(rngs, (f, d), ("mlp", "embed"), f**-0.5, dtype)
        self.proj_bias = zeros_param((d,), ("embed",), dtype)

    def __call__(self, x: jax.Array) -> jax.Array:
        h = ACTIVATIONS[self.activation](x @ self.fc[...] + self.fc_bias[...])
        return h @ self.proj[...] + self.proj_bias[...]


class Block(nnx.Module):
    def __init__(
        self, cfg: GPT2Config, layer: int, rngs: nnx.Rngs, dtype: jnp.dtype, attention: str = "xla"
    ):
        d = cfg.embed_dim
        self.eps = cfg.norm_eps
        self.attn_norm = ones_param((d,), ("embed",), dtype)
        self.attn_norm_bias = zeros_param((d,), ("embed",), dtype)
        self.attn = Attention(cfg, layer, rngs, dtype, attention)
        self.mlp_norm = ones_param((d,), ("embed",), dtype)
        self.mlp_norm_bias = zeros_param((d,), ("embed",), dtype)
        self.mlp = MLP(cfg, rngs, dtype)

    def __call__(self, x: jax.Array, positions: jax.Array, segment_ids: jax.Array) -> jax.Array:
        h = layer_norm(x, self.attn_norm[...], self.attn_norm_bias[...], self.eps)
        x = x + self.attn(h, positions, segment_ids)
        # Per token, in chunks of `model.token_chunk` tokens where set (long windows).
        return x + per_token(self._mlp_sublayer, x)

    def _mlp_sublayer(self, x: jax.Array) -> jax.Array:
        return self.mlp(layer_norm(x, self.mlp_norm[...], self.mlp_norm_bias[...], self.eps))


class GPT2(nnx.Module):
    """The decoder. `__call__` gives final hidden states; `unembedding()` the output matrix."""

    def __init__(
        self,
        cfg: GPT2Config,
        rngs: nnx.Rngs,
        dtype: jnp.dtype = jnp.float32,
        attention: str = "xla",
    ):
        d = cfg.embed_dim
        self.cfg = cfg
        self.embedding = normal_param(rngs, (cfg.vocab_size, d), ("vocab", "embed"), 0.02, dtype)
        self.position_embedding = normal_param(
            rngs, (cfg.max_positions, d), ("positions", "embed"), 0.01, dtype
        )
        self.layers = nnx.List(
            [Block(cfg, i, rngs, dtype, attention) for i in range(cfg.num_layers)]
        )
        self.final_norm = ones_param((d,), ("embed",), dtype)
        self.final_norm_bias = zeros_param((d,), ("embed",), dtype)
        if not cfg.tie_embeddings:
            self.lm_head = normal_param(
                rngs, (d, cfg.vocab_size), ("embed", "vocab"), d**-0.5, dtype
            )

    def __call__(
        self, tokens: jax.Array, positions: jax.Array, segment_ids: jax.Array
    ) -> jax.Array:
        """Final hidden states.

        Args:
          tokens, positions, segment_ids: `[batch, seq] int32`; positions in
            `[0, max_positions)`.

        Returns:
          `[batch, seq, embed_dim]` in the parameter dtype, after the final LayerNorm.
        """
        x = jnp.take(self.embedding[...], tokens, axis=0)
        x = x + jnp.take(self.position_embedding[...], positions, axis=0)
        x = run_layers(self.layers, x, positions, segment_ids)
        return layer_norm(x, self.final_norm[...], self.final_norm_bias[...], self.cfg.norm_eps)

    def unembedding(self) -> jax.Array:
        """`[embed_dim, vocab_size]`: the tied embedding transposed, or the separate head."""
        if self.cfg.tie_embeddings:
            return self.embedding[...].T
        return self.lm_head[...]
