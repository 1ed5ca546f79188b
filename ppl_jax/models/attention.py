"""Causal self-attention within segments, by one of three implementations.

- `xla`: plain XLA ops, in query blocks (128 queries; 512 on GPU): the queries of block `i` meet only the keys up to the
  block's end (and, with a window, from `window - 1` before its start), so the causal upper
  triangle is mostly skipped (about 60% of the full score matrix at 4 blocks); segment and
  window masks are applied within the block; scores and softmax in float32. Runs everywhere, and
  is the one that handles packed rows on GPU.
- `cudnn`: cuDNN flash attention through `jax.nn.dot_product_attention(implementation="cudnn")`,
  for bfloat16/float16 on NVIDIA GPUs, with causal masking and per-row sequence lengths (no dense
  mask), so each row must hold one segment followed by padding (no packing).
- `splash`: the Pallas splash-attention kernel of TPUs
  (`jax.experimental.pallas.ops.tpu.splash_attention`), with segment ids, causal (or local)
  masks, and grouped-query heads as multi-query kernels per key/value head.

`resolve` picks one for `model.attention=auto`: `splash` on TPU, `cudnn` on GPU for 16-bit
params when the shape allows, `xla` otherwise. An attention soft-cap (Gemma 2's
`attn_logit_softcapping`: scores `c * tanh(s / c)` before masking) runs in `xla` and `splash`;
cuDNN has none, so `auto` then takes `xla` on GPU and an explicit `cudnn` is refused.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from ppl_jax.errors import ConfigError

IMPLEMENTATIONS = ("auto", "xla", "cudnn", "splash")
# The implementations that keep the segments of a packed row apart (segment ids in the mask);
# cuDNN's takes per-row sequence lengths, so each of its rows holds one window.
KEEP_SEGMENTS = ("xla", "splash")


def keeps_segments(implementation: str) -> bool:
    """Whether `implementation` keeps packed windows apart: a model running it may have several
    windows per row (`LanguageModel.honours_segments`)."""
    return implementation in KEEP_SEGMENTS


def resolve(
    setting: str, dtype, head_dim: int, platform: str | None = None, softcap: bool = False
) -> str:
    """The implementation that `model.attention=setting` runs on this platform.

    Raises:
      ConfigError: `cudnn` asked for a model whose attention is soft-capped.
    """
    if setting == "cudnn" and softcap:
        raise ConfigError(
            "model.attention=cudnn cannot soft-cap attention scores, which this model needs "
            "(attn_logit_softcapping); set model.attention=auto or xla."
        )
    if setting != "auto":
        return setting
    platform = platform or jax.default_backend()
    if platform == "tpu":
        return "splash"
    if (
        not softcap
        and platform == "gpu"
        and jnp.dtype(dtype) in (jnp.bfloat16, jnp.float16)
        and (head_dim % 8 == 0 and head_dim <= 128)
    ):
        return "cudnn"
    return "xla"


def resolve_for(setting: str, dtype, description: dict) -> str:
    """`resolve` for a model description (`model.build`'s), whose head width it reads."""
    head_dim = description.get("head_dim") or description["embed_dim"] // description["num_heads"]
    softcap = bool(description.get("attn_softcap"))
    return resolve(setting, dtype, head_dim, softcap=softcap)


def attend(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    *,
    segment_ids: jax.Array,
    positions: jax.Array,
    window: int | None = None,
    scale: float | None = None,
    softcap: float | None = None,
    implementation: str = "xla",
) -> jax.Array:
    """Causal attention of each token to the earlier tokens of its own segment.

    Args:
      q: `[batch, seq, heads, head_dim]`; k, v: `[batch, seq, kv_heads, head_dim]`, with
        `heads` a multiple of `kv_heads` (grouped-query attention).
      segment_ids: `[batch, seq] int32`, 0 for padding.
      positions: `[batch, seq] int32`, within each segment.
      window: attend only to the last `window` positions (Mistral's sliding window), or None.
      scale: the logits' scale (default `head_dim ** -0.5`).
      softcap: None, or `c` for scores `c * tanh(scale * q.k / c)` (transformers' Gemma 2
        `eager_attention_forward`); not with `cudnn`.
      implementation: `xla`, `cudnn` or `splash` (see the module docstring).

    Returns:
      `[batch, seq, heads, head_dim]`, in `q.dtype`.
    """
    if implementation == "xla":
        return _blocked_xla(q, k, v, segment_ids, positions, window, scale, softcap=softcap)
    if softcap is not None and implementation == "cudnn":
        raise ConfigError(
            "model.attention=cudnn cannot soft-cap attention scores; set model.attention=xla."
        )
    if implementation == "cudnn":
        lengths = jnp.sum(segment_ids != 0, axis=1, dtype=jnp.int32)
        return jax.nn.dot_product_attention(
            q,
            k,
            v,
            scale=scale,
            is_causal=True,
            query_seq_lengths=lengths,
            key_value_seq_lengths=lengths,
            local_window_size=None if window is None else (window - 1, 0),
            implementation="cudnn",
        )
    if implementation == "splash":
        return _splash(q, k, v, segment_ids, window, scale, softcap)
    raise ValueError(f"unknown attention implementation {implementation!r}")


# Queries per block of the `xla` path. On CPU 128 is fastest. On an H100 (1B Llama, 2048 tokens,
# bfloat16, BENCHMARKS.md) 512 runs as fast as 128 and compiles 3x sooner (25 s against 75 s: each
# block is its own matmul shape, which XLA:GPU autotunes), for 2.4 GB more memory at 16 x 2048.
QUERY_BLOCK = 128
GPU_QUERY_BLOCK = 512


def _blocked_xla(q, k, v, segment_ids, positions, window, scale, block=None, softcap=None):
    b, t, h, d = q.shape
    block = block or (GPU_QUERY_BLOCK if jax.default_backend() == "gpu" else QUERY_BLOCK)
    kv = k.shape[2]
    group = h // kv
    scale = d**-0.5 if scale is None else scale
    # Heads first ([B, KV, G, T, D] and [B, KV, T, D]) so each block is a plain batched matmul.
    q = (q * jnp.asarray(scale, q.dtype)).reshape(b, t, kv, group, d).transpose(0, 2, 3, 1, 4)
    k = k.transpose(0, 2, 1, 3)
    v = v.transpose(0, 2, 1, 3)
    out = []
    for q0 in range(0, t, block):
        q1 = min(t, q0 + block)
        k0 = 0 if window is None else max(0, q0 - window + 1)
        s = jnp.einsum(
            "bkgqd,bksd->bkgqs",
            q[:, :, :, q0:q1],
            k[:, :, k0:q1],
            preferred_element_type=jnp.float32,
        )
        if softcap is not None:
            s = jnp.tanh(s / softcap) * softcap
        causal = jnp.arange(q0, q1)[:, None] >= jnp.arange(k0, q1)[None, :]
        mask = causal & (segment_ids[:, q0:q1, None] == segment_ids[:, None, k0:q1])
        if window is not None:
            mask &= positions[:, q0:q1, None] - positions[:, None, k0:q1] < window
        s = jnp.where(mask[:, None, None], s, jnp.finfo(jnp.float32).min)
        e = jnp.exp(s - jnp.max(s, axis=-1, keepdims=True))  # unnormalised; divide after PV
        o = jnp.einsum(
            "bkgqs,bksd->bkgqd",
            e.astype(v.dtype),
            v[:, :, k0:q1],
            preferred_element_type=jnp.float32,
        )
        out.append((o / jnp.sum(e, axis=-1)[..., None]).astype(v.dtype))
    o = jnp.concatenate(out, axis=3)  # [B, KV, G, T, D]
    return o.transpose(0, 3, 1, 2, 4).reshape(b, t, h, d)


@functools.lru_cache(maxsize=16)
def _splash_kernel(
    group: int, seq: int, window: int | None, interpret: bool, softcap: float | None = None
):
    from jax.experimental.pallas.ops.tpu.splash_attention import (
        splash_attention_kernel as kernel,
    )
    from jax.experimental.pallas.ops.tpu.splash_attention import (
        splash_attention_mask as mask_lib,
    )

    if window is None:
        head_mask = mask_lib.CausalMask(shape=(seq, seq))
    else:
        head_mask = mask_lib.LocalMask(shape=(seq, seq), window_size=(window - 1, 0), offset=0)
    block = next(b for b in (512, 256, 128, seq) if seq % b == 0)
    sizes = kernel.BlockSizes(block_q=block, block_kv=block, block_kv_compute=block)
    # The kernel holds its mask's block tables as arrays; made under a trace they would be that
    # trace's tracers, and the cached kernel would leak them into the next trace (a second batch
    # shape of the same width). Made at compile time they are concrete.
    with jax.ensure_compile_time_eval():
        return kernel.make_splash_mqa_single_device(
            mask=mask_lib.MultiHeadMask([head_mask] * group),
            block_sizes=sizes,
            interpret=interpret,
            attn_logits_soft_cap=softcap,
        )


def _splash(q, k, v, segment_ids, window, scale, softcap=None):
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel

    b, t, h, d = q.shape
    kv = k.shape[2]
    group = h // kv
    interpret = jax.default_backend() != "tpu"  # CPU tests run the kernel interpreted
    kern = _splash_kernel(group, t, window, interpret, softcap)
    scale = d**-0.5 if scale is None else scale
    # [B, T, KV*G, D] -> [B, KV, G, T, D]; one multi-query kernel call per (example, KV head).
    q = (q * jnp.asarray(scale, q.dtype)).reshape(b, t, kv, group, d).transpose(0, 2, 3, 1, 4)
    k = k.transpose(0, 2, 1, 3)  # [B, KV, T, D]
    v = v.transpose(0, 2, 1, 3)

    def one(q_g, k_1, v_1, seg):
        ids = splash_attention_kernel.SegmentIds(q=seg, kv=seg)
        return kern(q_g, k_1, v_1, segment_ids=ids)

    per_head = jax.vmap(one, in_axes=(0, 0, 0, None))
    out = jax.vmap(per_head, in_axes=(0, 0, 0, 0))(q, k, v, segment_ids)  # [B, KV, G, T, D]
    return out.transpose(0, 3, 1, 2, 4).reshape(b, t, h, d).astype(np.dtype(q.dtype))
