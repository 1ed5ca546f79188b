"""The LayerNorm decoder that GPT-2 and GPT-NeoX configure (`LayerNormDecoder`): a token
embedding, learned absolute positions (GPT-2) or rotary ones (GPT-NeoX), pre-LayerNorm blocks
(LayerNorm with bias) of multi-head causal attention and a plain (ungated) MLP, sequential or with
the parallel residual `x + attn(ln1(x)) + mlp(ln2(x))`, a final LayerNorm, and the output tied to
the embedding or a separate `lm_head`.

The interface is that of `ppl_jax.models.decoders.llama.Llama`: `__call__(tokens, positions,
segment_ids)` gives the hidden states after the final LayerNorm, `unembedding()` the `[embed,
vocab]` output matrix. Attention is causal within a segment; segment 0 is padding. Every
parameter names its dims in `logical_axes` metadata with the names of
`ppl_jax.config.defaults.DEFAULT_RULES` (`vocab`, `embed`, `heads`, `head_dim`, `mlp`), plus
`positions` for a learned position table, which the rules do not map (replicated).

A family's config configures it (what `LayerNormDecoder` reads besides the sizes `vocab_size`,
`embed_dim`, `num_layers`, `num_heads`, `head_dim`, `mlp_dim`, `max_positions`, `norm_eps`,
`activation` (a key of `ppl_jax.models.layers.core.ACTIVATIONS`) and `tie_embeddings`):

- `learned_positions`: a learned `[max_positions, embed]` position table added to the embedding
  (positions must lie in `[0, max_positions)`); otherwise rotary embeddings on q and k
  (`ppl_jax.models.layers.rope.rotary` with the config: `rotary_dim`, `rope_theta`, ...);
- `parallel_residual`: the parallel residual, else the sequential one;
- `bias`: biases on q, k, v and the output projection;
- `mlp_apart`: the MLP's weights under the block's `mlp/` (GPT-2's names) or on the block itself
  (GPT-NeoX's): the names each family's checkpoints have always had;
- `attention_scale(layer)`: the logits' scale of a layer, or None for `attend`'s own
  `head_dim ** -0.5`.

`norm_rules` maps a checkpoint's two LayerNorms of a block (weight and bias) onto the block's.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from ppl_jax.models.decoders.stack import run_layers
from ppl_jax.models.layers import packed
from ppl_jax.models.layers import rope as rope_lib
from ppl_jax.models.layers.attention import attend
from ppl_jax.models.layers.context import per_token
from ppl_jax.models.layers.core import (
    ACTIVATIONS,
    layer_norm,
    normal_param,
    ones_param,
    zeros_param,
)


class Attention(nnx.Module):
    """Multi-head causal attention: q, k, v `[embed, heads, head_dim]`, o `[heads, head_dim,
    embed]`, with biases when `cfg.bias`, rotary positions unless `cfg.learned_positions`."""

    def __init__(self, cfg: Any, layer: int, rngs: nnx.Rngs, dtype: jnp.dtype, attention: str):
        d, h, hd = cfg.embed_dim, cfg.num_heads, cfg.head_dim
        self.cfg, self.attention, self.scale = cfg, attention, cfg.attention_scale(layer)
        axes = ("embed", "heads", "head_dim")
        self.q = normal_param(rngs, (d, h, hd), axes, d**-0.5, dtype)
        self.k = normal_param(rngs, (d, h, hd), axes, d**-0.5, dtype)
        self.v = normal_param(rngs, (d, h, hd), axes, d**-0.5, dtype)
        if cfg.bias:
            self.q_bias = zeros_param((h, hd), ("heads", "head_dim"), dtype)
            self.k_bias = zeros_param((h, hd), ("heads", "head_dim"), dtype)
            self.v_bias = zeros_param((h, hd), ("heads", "head_dim"), dtype)
        self.o = normal_param(rngs, (h, hd, d), ("heads", "head_dim", "embed"), d**-0.5, dtype)
        if cfg.bias:
            self.o_bias = zeros_param((d,), ("embed",), dtype)

    def __call__(self, x: jax.Array, positions: jax.Array, segment_ids: jax.Array) -> jax.Array:
        q = jnp.einsum("btd,dhk->bthk", x, self.q[...])
        k = jnp.einsum("btd,dhk->bthk", x, self.k[...])
        v = jnp.einsum("btd,dhk->bthk", x, self.v[...])
        if self.cfg.bias:
            q, k, v = q + self.q_bias[...], k + self.k_bias[...], v + self.v_bias[...]
        if not self.cfg.learned_positions:
            q = rope_lib.rotary(q, positions, segment_ids, self.cfg)
            k = rope_lib.rotary(k, positions, segment_ids, self.cfg)
        out = attend(
            q,
            k,
            v,
            segment_ids=segment_ids,
            positions=positions,
            scale=self.scale,
            implementation=self.attention,
        )
        out = jnp.einsum("bthk,hkd->btd", out, self.o[...])
        return out + self.o_bias[...] if self.cfg.bias else out


def _mlp_params(owner: nnx.Module, cfg: Any, rngs: nnx.Rngs, dtype: jnp.dtype) -> None:
    """Sets the MLP's weights `fc` `[embed, mlp]`, `proj` `[mlp, embed]` and their biases on
    `owner`."""
    d, f = cfg.embed_dim, cfg.mlp_dim
    owner.fc = normal_param(rngs, (d, f), ("embed", "mlp"), d**-0.5, dtype)
    owner.fc_bias = zeros_param((f,), ("mlp",), dtype)
    owner.proj = normal_param(rngs, (f, d), ("mlp", "embed"), f**-0.5, dtype)
    owner.proj_bias = zeros_param((d,), ("embed",), dtype)


def _mlp(owner: nnx.Module, x: jax.Array, activation: str) -> jax.Array:
    """The plain MLP of the weights `owner` holds (`_mlp_params`) on `x` `[..., embed]`."""
    h = ACTIVATIONS[activation](x @ owner.fc[...] + owner.fc_bias[...])
    return h @ owner.proj[...] + owner.proj_bias[...]


class MLP(nnx.Module):
    """The MLP as a module of its own (`mlp_apart`: its weights under the block's `mlp/`)."""

    def __init__(self, cfg: Any, rngs: nnx.Rngs, dtype: jnp.dtype):
        self.activation = cfg.activation
        _mlp_params(self, cfg, rngs, dtype)

    def __call__(self, x: jax.Array) -> jax.Array:
        return _mlp(self, x, self.activation)


class Block(nnx.Module):
    """A pre-LayerNorm block: `attn_norm` (and bias), `attn`, `mlp_norm` (and bias), the MLP."""

    def __init__(self, cfg: Any, layer: int, rngs: nnx.Rngs, dtype: jnp.dtype, attention: str):
        d = cfg.embed_dim
        self.cfg = cfg
        self.attn_norm = ones_param((d,), ("embed",), dtype)
        self.attn_norm_bias = zeros_param((d,), ("embed",), dtype)
        self.attn = Attention(cfg, layer, rngs, dtype, attention)
        self.mlp_norm = ones_param((d,), ("embed",), dtype)
        self.mlp_norm_bias = zeros_param((d,), ("embed",), dtype)
        if cfg.mlp_apart:
            self.mlp = MLP(cfg, rngs, dtype)
        else:
            _mlp_params(self, cfg, rngs, dtype)

    def _mlp_sublayer(self, x: jax.Array) -> jax.Array:
        h = layer_norm(x, self.mlp_norm[...], self.mlp_norm_bias[...], self.cfg.norm_eps)
        return self.mlp(h) if self.cfg.mlp_apart else _mlp(self, h, self.cfg.activation)

    def __call__(self, x: jax.Array, positions: jax.Array, segment_ids: jax.Array) -> jax.Array:
        h = layer_norm(x, self.attn_norm[...], self.attn_norm_bias[...], self.cfg.norm_eps)
        attn = self.attn(h, positions, segment_ids)
        # The MLP per token, in chunks of `model.token_chunk` tokens where set (long windows).
        if self.cfg.parallel_residual:
            return x + attn + per_token(self._mlp_sublayer, x)
        x = x + attn
        return x + per_token(self._mlp_sublayer, x)


class LayerNormDecoder(nnx.Module):
    """The decoder (see the module docstring). `__call__` gives final hidden states;
    `unembedding()` the output matrix."""

    def __init__(
        self,
        cfg: Any,
        rngs: nnx.Rngs,
        dtype: jnp.dtype = jnp.float32,
        attention: str = "xla",
    ):
        d = cfg.embed_dim
        self.cfg = cfg
        self.embedding = normal_param(rngs, (cfg.vocab_size, d), ("vocab", "embed"), 0.02, dtype)
        if cfg.learned_positions:
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
          tokens, positions, segment_ids: `[batch, seq] int32`; with learned positions, positions
            in `[0, max_positions)`.

        Returns:
          `[batch, seq, embed_dim]` in the parameter dtype, after the final LayerNorm.
        """
        x = packed.take(self.embedding, tokens)
        if self.cfg.learned_positions:
            x = x + packed.take(self.position_embedding, positions)
        x = run_layers(self.layers, x, positions, segment_ids)
        return layer_norm(x, self.final_norm[...], self.final_norm_bias[...], self.cfg.norm_eps)

    def unembedding(self) -> jax.Array:
        """`[embed_dim, vocab_size]`: the tied embedding transposed, or the separate head."""
        if self.cfg.tie_embeddings:
            return self.embedding[...].T
        return self.lm_head[...]


def norm_rules(layer: str, names: tuple[tuple[str, str], ...]) -> list[dict[str, Any]]:
    """The mapping rules of a block's two LayerNorms with bias: for each (stored name, ours) of
    `names`, its weight to `layers/{l}/<ours>` and its bias to `layers/{l}/<ours>_bias`; `layer`
    is the pattern of a stored layer's head (`h\\.(?P<l>\\d+)\\.`)."""
    return [
        {"from": layer + theirs + stored, "to": "layers/{l}/" + ours + suffix}
        for theirs, ours in names
        for stored, suffix in ((r"\.weight", ""), (r"\.bias", "_bias"))
    ]
