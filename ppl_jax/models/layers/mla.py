"""Multi-head latent attention (DeepSeek-AI 2024, "DeepSeek-V2", section 2.1; as transformers 5
`DeepseekV3Attention` computes it).

Queries come through a low-rank bottleneck (`q_lora_rank`: `x @ q_a`, RMSNorm, `@ q_b`; or one
projection `q` without it); keys and values through a shared latent: `x @ kv_a` gives a
`kv_lora_rank` latent and one rotary key of `qk_rope_head_dim` shared by all heads; the latent,
RMS-normalised, goes through `kv_b` to each head's non-rotary key (`qk_nope_head_dim`) and value
(`v_head_dim`). A query head is its non-rotary part then its rotary part; a key head the
non-rotary key then the shared rotary key. Only the rotary parts are rotated (rotate-half, or
adjacent pairs with `rope_interleave`: `ppl_jax.models.layers.qk.rotate_pairs`). Attention runs with
query and key heads of `qk_nope_head_dim + qk_rope_head_dim` and value heads of `v_head_dim`,
scaled by `softmax_scale` (transformers: `qk_head_dim ** -0.5`, times YaRN's
`mscale(factor, mscale_all_dim) ** 2` when the rotary scaling is YaRN with `mscale_all_dim`).

The latent norms use eps 1e-6 whatever `rms_norm_eps` says (transformers builds
`DeepseekV3RMSNorm(q_lora_rank)` and `(kv_lora_rank)` with their default eps).

Params carry `logical_axes`: the latents `q_lora` and `kv_lora` (unmapped by the default mesh
rules, so replicated), `heads` (split over `model`), `head_dim`, `embed`.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from ppl_jax.errors import CheckpointError
from ppl_jax.models.layers import qk
from ppl_jax.models.layers import rope as rope_lib
from ppl_jax.models.layers.attention import attend
from ppl_jax.models.layers.core import normal_param, ones_param, rms_norm, zeros_param

LATENT_NORM_EPS = 1e-6


@dataclasses.dataclass(frozen=True)
class MlaSpec:
    """The shapes of one MLA layer (transformers' `DeepseekV3Config` names in parentheses).

    Attributes:
      embed_dim, num_heads: `hidden_size`, `num_attention_heads`.
      q_lora_rank: the query bottleneck (0: one projection `q`, `q_lora_rank: null`).
      kv_lora_rank, qk_nope_dim, qk_rope_dim, v_dim: `kv_lora_rank`, `qk_nope_head_dim`,
        `qk_rope_head_dim`, `v_head_dim`.
      bias: `attention_bias` (biases on `q_a`, `kv_a` and `o`).
      interleave: `rope_interleave` (rotate adjacent pairs, else halves).
      softmax_scale: the attention logits' scale (`softmax_scale`).
    """

    embed_dim: int
    num_heads: int
    q_lora_rank: int
    kv_lora_rank: int
    qk_nope_dim: int
    qk_rope_dim: int
    v_dim: int
    bias: bool = False
    interleave: bool = True
    softmax_scale: float = 0.0

    def __post_init__(self):
        if self.qk_rope_dim % 2:
            raise CheckpointError(f"qk_rope_head_dim={self.qk_rope_dim} is not even.")

    @property
    def qk_dim(self) -> int:
        return self.qk_nope_dim + self.qk_rope_dim


def softmax_scale(qk_dim: int, rope: dict[str, Any]) -> float:
    """transformers' `DeepseekV3Attention.scaling`: `qk_dim ** -0.5`, times
    `(0.1 * mscale_all_dim * ln(factor) + 1) ** 2` for a scaling other than `default` with a
    non-zero `mscale_all_dim` and `factor > 1` (`yarn_apply_mscale`)."""
    scale = qk_dim**-0.5
    kind = rope.get("rope_type", rope.get("type")) or "default"
    all_dim = rope.get("mscale_all_dim") or 0
    if kind != "default" and all_dim:
        factor = float(rope["factor"])
        m = 1.0 if factor <= 1 else 0.1 * float(all_dim) * math.log(factor) + 1.0
        scale *= m * m
    return scale


class LatentAttention(nnx.Module):
    """One MLA layer (see the module docstring).

    Params: `q_a [embed, q_lora]`, `q_a_norm [q_lora]`, `q_b [q_lora, heads, qk]` (or
    `q [embed, heads, qk]`); `kv_a [embed, kv_lora + rope]`, `kv_a_norm [kv_lora]`,
    `kv_b [kv_lora, heads, nope + v]`; `o [heads, v, embed]`; with `bias`: `q_a_bias`,
    `kv_a_bias`, `o_bias`.

    Args:
      spec: the layer's shapes.
      rope: the rotary scaling, any object with `ppl_jax.models.layers.rope`'s `rope_*` fields whose
        rotary width is `qk_rope_dim` (a `LlamaConfig` with `head_dim=qk_rope_dim`).
      attention: the attention implementation (`ppl_jax.models.layers.attention.attend`).
    """

    def __init__(
        self,
        spec: MlaSpec,
        rope: Any,
        rngs: nnx.Rngs,
        dtype: jnp.dtype = jnp.float32,
        attention: str = "xla",
    ):
        d, h, qr, kvr = spec.embed_dim, spec.num_heads, spec.q_lora_rank, spec.kv_lora_rank
        self.spec, self.rope, self.attention = spec, rope, attention
        if qr:
            self.q_a = normal_param(rngs, (d, qr), ("embed", "q_lora"), d**-0.5, dtype)
            self.q_a_norm = ones_param((qr,), ("q_lora",), dtype)
            self.q_b = normal_param(
                rngs, (qr, h, spec.qk_dim), ("q_lora", "heads", "head_dim"), qr**-0.5, dtype
            )
        else:
            self.q = normal_param(
                rngs, (d, h, spec.qk_dim), ("embed", "heads", "head_dim"), d**-0.5, dtype
            )
        self.kv_a = normal_param(
            rngs, (d, kvr + spec.qk_rope_dim), ("embed", "kv_lora"), d**-0.5, dtype
        )
        self.kv_a_norm = ones_param((kvr,), ("kv_lora",), dtype)
        self.kv_b = normal_param(
            rngs,
            (kvr, h, spec.qk_nope_dim + spec.v_dim),
            ("kv_lora", "heads", "head_dim"),
            kvr**-0.5,
            dtype,
        )
        self.o = normal_param(
            rngs,
            (h, spec.v_dim, d),
            ("heads", "head_dim", "embed"),
            (h * spec.v_dim) ** -0.5,
            dtype,
        )
        if spec.bias:
            if qr:
                self.q_a_bias = zeros_param((qr,), ("q_lora",), dtype)
            self.kv_a_bias = zeros_param((kvr + spec.qk_rope_dim,), ("kv_lora",), dtype)
            self.o_bias = zeros_param((d,), ("embed",), dtype)

    def _rotate(self, x, positions, segment_ids):
        if self.spec.interleave:
            freq = rope_lib.inv_freq(self.rope)
            return qk.rotate_pairs(x, positions, freq, self.rope.rope_attention_factor)
        return rope_lib.rotary(x, positions, segment_ids, self.rope)

    def _queries(self, x: jax.Array, positions: jax.Array, segment_ids: jax.Array) -> jax.Array:
        spec = self.spec
        if spec.q_lora_rank:
            q = jnp.einsum("btd,dr->btr", x, self.q_a[...])
            if spec.bias:
                q = q + self.q_a_bias[...]
            q = rms_norm(q, self.q_a_norm[...], LATENT_NORM_EPS)
            q = jnp.einsum("btr,rhk->bthk", q, self.q_b[...])
        else:
            q = jnp.einsum("btd,dhk->bthk", x, self.q[...])
        q_rot = self._rotate(q[..., spec.qk_nope_dim :], positions, segment_ids)
        return jnp.concatenate([q[..., : spec.qk_nope_dim], q_rot], axis=-1)

    def keys_values(
        self, x: jax.Array, positions: jax.Array, segment_ids: jax.Array
    ) -> tuple[jax.Array, jax.Array]:
        """Keys `[B, T, heads, qk]` and values `[B, T, heads, v]` of `x [B, T, embed]` (from
        the latent), in `x.dtype`."""
        spec = self.spec
        latent = jnp.einsum("btd,dr->btr", x, self.kv_a[...])
        if spec.bias:
            latent = latent + self.kv_a_bias[...]
        kv, k_rot = latent[..., : spec.kv_lora_rank], latent[..., spec.kv_lora_rank :]
        kv = rms_norm(kv, self.kv_a_norm[...], LATENT_NORM_EPS)
        kv = jnp.einsum("btr,rhk->bthk", kv, self.kv_b[...])
        k_nope, v = kv[..., : spec.qk_nope_dim], kv[..., spec.qk_nope_dim :]
        k_rot = self._rotate(k_rot[:, :, None, :], positions, segment_ids)
        k_rot = jnp.broadcast_to(k_rot, (*k_nope.shape[:-1], spec.qk_rope_dim))
        return jnp.concatenate([k_nope, k_rot], axis=-1), v

    def projections(
        self, x: jax.Array, positions: jax.Array, segment_ids: jax.Array
    ) -> tuple[jax.Array, jax.Array, jax.Array]:
        """Queries `[B, T, heads, qk]`, keys `[B, T, heads, qk]` and values `[B, T, heads, v]`
        of `x [B, T, embed]` (positions and segment ids `[B, T] int32`), in `x.dtype`."""
        return self._queries(x, positions, segment_ids), *self.keys_values(
            x, positions, segment_ids
        )

    def __call__(self, x: jax.Array, positions: jax.Array, segment_ids: jax.Array) -> jax.Array:
        """`[B, T, embed]` -> `[B, T, embed]`: causal attention within segments."""
        kv = self.keys_values(x, positions, segment_ids)
        return self.attend_queries(x, positions, segment_ids, kv, None, None)

    def attend_queries(
        self,
        x: jax.Array,
        positions: jax.Array,
        segment_ids: jax.Array,
        kv: tuple[jax.Array, jax.Array],
        kv_positions: jax.Array | None,
        kv_segment_ids: jax.Array | None,
    ) -> jax.Array:
        """The layer's output `[B, Tq, embed]` for the queries of `x [B, Tq, embed]` against the
        `keys_values` `kv` of `[B, T]` tokens with their own positions and segment ids (as
        `ppl_jax.models.decoders.llama.Attention.attend_queries`)."""
        out = attend(
            self._queries(x, positions, segment_ids),
            *kv,
            segment_ids=segment_ids,
            positions=positions,
            kv_segment_ids=kv_segment_ids,
            kv_positions=kv_positions,
            scale=self.spec.softmax_scale,
            implementation=self.attention,
        )
        out = jnp.einsum("bthk,hkd->btd", out, self.o[...])
        return out + self.o_bias[...] if self.spec.bias else out
