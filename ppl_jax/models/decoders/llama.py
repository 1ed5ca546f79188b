"""A decoder of the Llama family in Flax NNX: RMSNorm, rotary embeddings, SwiGLU, grouped-query
attention, optionally tied embeddings (Touvron et al. 2023, "LLaMA"; Ainslie et al. 2023, "GQA").

The same module covers the Hugging Face `llama`, `mistral` and `qwen2` model types, and through
the flags below the decoders of the Llama-like families of `ppl_jax.models.families` (Qwen3,
OLMo 2/3, Gemma 2/3, Phi-3, the mixtures of experts): optional
q/k/v (and output) projection biases (Qwen2, Llama's `attention_bias`), MLP biases (`mlp_bias`),
a sliding attention window on chosen layers (Mistral, Jiang et al. 2023; Qwen2's
`use_sliding_window`), and the rotary scalings `linear` (Chen et al. 2023, position
interpolation) and `llama3` (Meta's Llama 3.1 frequency-dependent scaling, as in Hugging Face
`modeling_rope_utils._compute_llama3_parameters`); the other rotary scalings are in
`ppl_jax.models.layers.rope`. The flags: QK-norm per head (Qwen3, Gemma 3) or over the whole
projection (OLMo 2); norms after the sublayers (OLMo 2) or around them (Gemma's four per block);
RMSNorm `x̂·(offset + w)` (Gemma: 1); GELU-tanh gating; the embedding times `sqrt(embed_dim)`
rounded to the weight dtype (Gemma); the attention scale (`query_pre_attn_scalar`); attention and
final-logit soft-caps (Gemma 2); partial rotary; and a rotary scaling of its own on the sliding
layers (`sliding_rope`, transformers 5's `rope_parameters` per layer type).

Every parameter carries its logical axis names in the `logical_axes` metadata of its `nnx.Param`
(`vocab`, `embed`, `heads`, `kv_heads`, `head_dim`, `mlp`); `ppl_jax.runtime.mesh` maps them to mesh axes
with the table in the config. The rotary embedding rotates the two halves of each head
(the Hugging Face `rotate_half` layout), so that Hugging Face Llama weights load unchanged.

A family that changes a layer subclasses the config (its own `FAMILY` and fields) and the module,
and composes its layers through the decoder's two factories, `make_attention(cfg, layer, ...)`
and `make_mlp(cfg, layer, ...)` (attention with sinks and a routed block; `Attention(rotary=False)`
on layers without rotary embedding); a subclass of `Attention` may override
`position_q` and `position_k` (what happens to queries and keys before attention) and
`attend_options` (what it adds to the call of `attend`: sinks, chunks). The layers run through
`ppl_jax.models.decoders.stack.run_layers`: scans over the runs of identical layers.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from ppl_jax.models.decoders.llama_config import (  # noqa: F401  (the families import them here)
    LlamaConfig,
    sorted_items,
)
from ppl_jax.models.decoders.stack import run_layers
from ppl_jax.models.layers import packed
from ppl_jax.models.layers import rope as rope_lib
from ppl_jax.models.layers.attention import attend, query_chunk
from ppl_jax.models.layers.context import per_token
from ppl_jax.models.layers.core import ACTIVATIONS, normal_param, ones_param, rms_norm, zeros_param


def _projection_norm(x: jax.Array, weight: jax.Array, eps: float) -> jax.Array:
    """RMSNorm of `x [B, T, H, D]` over its last two dims (all heads of a projection: OLMo 2's
    QK-norm before the split into heads), weight `[H, D]`."""
    b, t, h, d = x.shape
    return rms_norm(x.reshape(b, t, h * d), weight.reshape(h * d), eps).reshape(b, t, h, d)


class Attention(nnx.Module):
    def __init__(
        self,
        cfg: LlamaConfig,
        rngs: nnx.Rngs,
        dtype: jnp.dtype,
        window: int | None = None,
        attention: str = "xla",
        rotary: bool = True,
    ):
        d, h, kv, hd = cfg.embed_dim, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.cfg = cfg
        self.window = window
        self.attention = attention
        self.rotary = rotary  # False: no rotary embedding on this layer (NoPE)
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
        if cfg.qk_norm == "head":
            self.q_norm = ones_param((hd,), ("head_dim",), dtype)
            self.k_norm = ones_param((hd,), ("head_dim",), dtype)
        elif cfg.qk_norm == "projection":
            self.q_norm = ones_param((h, hd), ("heads", "head_dim"), dtype)
            self.k_norm = ones_param((kv, hd), ("kv_heads", "head_dim"), dtype)

    def __call__(self, x: jax.Array, positions: jax.Array, segment_ids: jax.Array) -> jax.Array:
        """`[B, T, embed]` -> `[B, T, embed]`: each token attends to the earlier tokens of its
        segment (`attend_queries` over `keys_values` of the same tokens)."""
        kv = self.keys_values(x, positions, segment_ids)
        return self.attend_queries(x, positions, segment_ids, kv, None, None)

    def keys_values(
        self, x: jax.Array, positions: jax.Array, segment_ids: jax.Array
    ) -> tuple[jax.Array, jax.Array]:
        """Keys `[B, T, kv_heads, head_dim]` (after `position_k`) and values of `x [B, T,
        embed]`, per token: the half of the layer every query needs whole."""
        k = jnp.einsum("btd,dhk->bthk", x, self.k[...])
        v = jnp.einsum("btd,dhk->bthk", x, self.v[...])
        if self.cfg.qkv_bias:
            k, v = k + self.k_bias[...], v + self.v_bias[...]
        return self.position_k(k, positions, segment_ids), v

    def attend_queries(
        self,
        x: jax.Array,
        positions: jax.Array,
        segment_ids: jax.Array,
        kv: tuple[jax.Array, jax.Array],
        kv_positions: jax.Array | None,
        kv_segment_ids: jax.Array | None,
    ) -> jax.Array:
        """The layer's output `[B, Tq, embed]` for the queries of `x [B, Tq, embed]` (positions
        and segment ids `[B, Tq]`) against `keys_values` `kv` of `[B, T]` tokens with their own
        positions and segment ids `[B, T]`: every token of the row, for a long window's queries in
        chunks; or None, None: the keys and values are those of `x`'s own tokens."""
        q = jnp.einsum("btd,dhk->bthk", x, self.q[...])
        if self.cfg.qkv_bias:
            q = q + self.q_bias[...]
        q = self.position_q(q, positions, segment_ids)
        out = self.attend_heads(
            q, *kv, positions, segment_ids, kv_positions=kv_positions, kv_segment_ids=kv_segment_ids
        )
        out = jnp.einsum("bthk,hkd->btd", out, self.o[...])
        return out + self.o_bias[...] if self.cfg.o_bias else out

    def position_q(self, q: jax.Array, positions: jax.Array, segment_ids: jax.Array) -> jax.Array:
        """Queries `[B, T, heads, head_dim]` after the QK-norm and the rotary embedding (a family
        that treats them otherwise overrides it, and `position_k`)."""
        return self._qk_norm_rotary(q, "q_norm", positions, segment_ids)

    def position_k(self, k: jax.Array, positions: jax.Array, segment_ids: jax.Array) -> jax.Array:
        """Keys `[B, T, kv_heads, head_dim]` after the QK-norm and the rotary embedding."""
        return self._qk_norm_rotary(k, "k_norm", positions, segment_ids)

    def _qk_norm_rotary(self, x, norm: str, positions, segment_ids) -> jax.Array:
        cfg = self.cfg
        if cfg.qk_norm == "head":  # after projection, before RoPE (Qwen3, Gemma 3)
            x = rms_norm(x, getattr(self, norm)[...], cfg.norm_eps, cfg.norm_offset)
        elif cfg.qk_norm == "projection":
            x = _projection_norm(x, getattr(self, norm)[...], cfg.norm_eps)
        if self.rotary:
            x = rope_lib.rotary(x, positions, segment_ids, cfg)
        return x

    def attend_heads(
        self,
        q: jax.Array,
        k: jax.Array,
        v: jax.Array,
        positions: jax.Array,
        segment_ids: jax.Array,
        *,
        kv_positions: jax.Array | None,
        kv_segment_ids: jax.Array | None,
    ) -> jax.Array:
        """`[B, Tq, heads, head_dim]`: causal attention within a segment (and within the window,
        where there is one), by the queries' and the keys' own positions and segment ids, with
        what the family adds (`attend_options`)."""
        return attend(
            q,
            k,
            v,
            segment_ids=segment_ids,
            positions=positions,
            kv_segment_ids=kv_segment_ids,
            kv_positions=kv_positions,
            window=self.window,
            scale=self.cfg.query_scale,
            softcap=self.cfg.attn_softcap,
            implementation=self.attention,
            **self.attend_options(),
        )

    def attend_options(self) -> dict[str, Any]:
        """What a family adds to `attend`'s call (`sinks`, `chunk`); none for Llama."""
        return {}


class MLP(nnx.Module):
    def __init__(self, cfg: LlamaConfig, rngs: nnx.Rngs, dtype: jnp.dtype):
        d, f = cfg.embed_dim, cfg.mlp_dim
        self.bias = cfg.mlp_bias
        self.activation = cfg.activation
        self.gate = normal_param(rngs, (d, f), ("embed", "mlp"), d**-0.5, dtype)
        self.up = normal_param(rngs, (d, f), ("embed", "mlp"), d**-0.5, dtype)
        self.down = normal_param(rngs, (f, d), ("mlp", "embed"), f**-0.5, dtype)
        if cfg.mlp_bias:
            self.gate_bias = zeros_param((f,), ("mlp",), dtype)
            self.up_bias = zeros_param((f,), ("mlp",), dtype)
            self.down_bias = zeros_param((d,), ("embed",), dtype)

    def __call__(self, x: jax.Array) -> jax.Array:
        act = ACTIVATIONS[self.activation]
        if not self.bias:
            return (act(x @ self.gate[...]) * (x @ self.up[...])) @ self.down[...]
        gate = x @ self.gate[...] + self.gate_bias[...]
        hidden = act(gate) * (x @ self.up[...] + self.up_bias[...])
        return hidden @ self.down[...] + self.down_bias[...]


class Block(nnx.Module):
    """One layer: an attention and an MLP sublayer (built by the decoder's factories,
    `Llama.make_attention` and `Llama.make_mlp`) with their norms. `norm_layout` `pre`:
    `x + f(norm(x))`; `post`: `x + norm(f(x))`; `sandwich`: `x + norm(f(norm(x)))`
    (`attn_norm`/`mlp_norm` before, `post_attn_norm`/`post_mlp_norm` after)."""

    def __init__(self, cfg: LlamaConfig, dtype: jnp.dtype, attn: nnx.Module, mlp: nnx.Module):
        d = cfg.embed_dim
        self.eps, self.offset, self.layout = cfg.norm_eps, cfg.norm_offset, cfg.norm_layout
        if cfg.norm_layout != "post":
            self.attn_norm = ones_param((d,), ("embed",), dtype)
        self.attn = attn
        if cfg.norm_layout != "post":
            self.mlp_norm = ones_param((d,), ("embed",), dtype)
        if cfg.norm_layout != "pre":
            self.post_attn_norm = ones_param((d,), ("embed",), dtype)
            self.post_mlp_norm = ones_param((d,), ("embed",), dtype)
        self.mlp = mlp

    def _norm(self, x: jax.Array, name: str) -> jax.Array:
        return rms_norm(x, getattr(self, name)[...], self.eps, self.offset)

    def _attn_input(self, x: jax.Array) -> jax.Array:
        return x if self.layout == "post" else self._norm(x, "attn_norm")

    def _attn_residual(self, x: jax.Array, out: jax.Array) -> jax.Array:
        return x + (out if self.layout == "pre" else self._norm(out, "post_attn_norm"))

    def _mlp_sublayer(self, x: jax.Array) -> jax.Array:
        if self.layout == "pre":
            return self.mlp(self._norm(x, "mlp_norm"))
        h = x if self.layout == "post" else self._norm(x, "mlp_norm")
        return self._norm(self.mlp(h), "post_mlp_norm")

    def __call__(self, x: jax.Array, positions: jax.Array, segment_ids: jax.Array) -> jax.Array:
        """`[B, T, embed]` -> `[B, T, embed]`. A long window (more tokens than `model.token_chunk`
        on one device, `ppl_jax.models.layers.attention.query_chunk`) runs in two passes: the keys and
        values of every token, per token in chunks; then, chunk by chunk of queries, the rest of
        the layer (attention of the chunk's queries to every key, the MLP), so that nothing of
        the window's size but the residual stream and the keys and values is ever held."""
        chunk = query_chunk(x.shape[1], self.attn.attention)
        if not chunk:
            x = self._attn_residual(x, self.attn(self._attn_input(x), positions, segment_ids))
            # Per token, in chunks of `model.token_chunk` tokens where set (long windows).
            return x + per_token(self._mlp_sublayer, x)
        kv = per_token(
            lambda a: self.attn.keys_values(self._attn_input(a[0]), a[1], a[2]),
            (x, positions, segment_ids),
        )

        def rest(a):
            x, pos, seg = a
            out = self.attn.attend_queries(
                self._attn_input(x), pos, seg, kv, positions, segment_ids
            )
            x = self._attn_residual(x, out)
            return x + self._mlp_sublayer(x)

        return per_token(rest, (x, positions, segment_ids), chunk)


class Llama(nnx.Module):
    """The decoder. `__call__` gives final hidden states; `unembedding()` the output matrix;
    `logit_softcap` the final-logit soft-cap (None, or Gemma 2's `final_logit_softcapping`)."""

    def __init__(
        self,
        cfg: LlamaConfig,
        rngs: nnx.Rngs,
        dtype: jnp.dtype = jnp.float32,
        attention: str = "xla",
    ):
        self.cfg = cfg
        self.logit_softcap = cfg.final_softcap
        self.embedding = normal_param(
            rngs, (cfg.vocab_size, cfg.embed_dim), ("vocab", "embed"), cfg.embed_dim**-0.5, dtype
        )
        self.layers = nnx.List(
            [
                Block(
                    cfg,
                    dtype,
                    self.make_attention(cfg, i, rngs, dtype, attention),
                    self.make_mlp(cfg, i, rngs, dtype),
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
        x = packed.take(self.embedding, tokens)
        if self.cfg.embed_scale:  # sqrt(embed_dim) rounded to the weight dtype first (Gemma)
            x = x * jnp.asarray(math.sqrt(self.cfg.embed_dim), x.dtype)
        x = run_layers(self.layers, x, positions, segment_ids)
        # Per token, in chunks of `model.token_chunk` tokens where set (long windows).
        cfg = self.cfg
        return per_token(
            lambda x: rms_norm(x, self.final_norm[...], cfg.norm_eps, cfg.norm_offset), x
        )

    def unembedding(self) -> jax.Array:
        """`[embed_dim, vocab_size]`: the tied embedding transposed, or the separate head."""
        if self.cfg.tie_embeddings:
            return self.embedding[...].T
        return self.lm_head[...]

    # The factories a family overrides to compose its layers (called once per layer, in order,
    # before the layer's norms are made).

    def make_attention(
        self, cfg: LlamaConfig, layer: int, rngs: nnx.Rngs, dtype: jnp.dtype, attention: str
    ) -> nnx.Module:
        """Layer `layer`'s attention: `Attention` with the window on the sliding layers and the
        layer's rotary scaling (`LlamaConfig.layer_rope`). What `Block` calls of it:
        `__call__(x, positions, segment_ids)` -> `[batch, seq, embed_dim]`, and for a long
        window's query chunks (`attention.query_chunk`) its `attention` setting, `keys_values`
        and `attend_queries` (as `Attention`'s)."""
        window = cfg.layer_window(layer)
        return Attention(cfg.layer_rope(layer), rngs, dtype, window, attention)

    def make_mlp(
        self, cfg: LlamaConfig, layer: int, rngs: nnx.Rngs, dtype: jnp.dtype
    ) -> nnx.Module:
        """Layer `layer`'s MLP: the gated `MLP`; per token, `[..., embed_dim]` -> same."""
        return MLP(cfg, rngs, dtype)
