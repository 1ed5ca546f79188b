"""tokamax's fused attention on NVIDIA GPUs: `model.attention=tokamax`, and `auto`'s kernel on a
GPU for the layers cuDNN cannot run (Gemma 2's soft-capped scores), where the optional extra is
installed (`pip install 'ppl_jax[gpu]'`: tokamax needs Python >= 3.12 and jax >= 0.11.1).

tokamax (openxla/tokamax, Apache-2.0) has flash attention kernels in Pallas: Mosaic GPU (used
here on Hopper and newer, compute capability 9.0+, 16-bit inputs) and Triton (elsewhere, and for
float32). Both take a soft-cap, grouped-query heads, value heads of another width than the keys,
and per-query key ranges `[k_start, k_end)` (`Mask(k_start=, k_end=)`, key blocks outside a
query block's ranges skipped), and return the softmax's residuals in float32: each query's
largest score `m` and denominator `l` (`sum exp(s - m)`), so `lse = m + log l`.

`attend`'s mask becomes one key range per query (`key_ranges`): for query `(seg, pos)` the
keys of its segment with `pos - window < key pos <= pos` (and in its chunk `pos // chunk`),
which are one run of the keys when the keys' real tokens lie in `(segment id, position)` order
along the row: segments in order, positions increasing in each, padding anywhere. That is how the
scorer lays out its rows (and how the context axis restores them before attending); the flash
kernel (`xla`) is exact for any order. The ranges are found by binary search over the keys, so
one call serves every case of the table:

- one device, packed rows, windows, chunks (`one_device`); a chunk of a long window's queries
  against the row's keys (`apart`); the context axis's gathered row (`gathered`): the queries
  against keys with their own segment ids and positions, one call;
- the ring (`ring`): one call per step on the keys and values passing by (two chunks of the row,
  in row order), the partial results merged by log-sum-exp (`split_merge.merge`);
- learned sinks (GPT-OSS): added once to the merged result (`split_merge.with_sinks`).

Queries are scaled in their dtype before the call (as the flash kernel does), the products run
at the step's matmul precision (`jax.default_matmul_precision`), and padding queries get zeros.
tokamax's op classes and `Mask` are imported from `tokamax._src` (its public
`dot_product_attention` takes neither per-query key ranges nor returns the residuals), which is
why the extra pins the version these tests ran. tokamax is imported only when a layer is traced.
"""

from __future__ import annotations

import importlib.util
import sys
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ppl_jax.models.layers import context as context_lib
from ppl_jax.models.layers import fused, split_merge

# The pip command that installs tokamax with ppl_jax (pyproject.toml's `gpu` extra).
INSTALL = "pip install 'ppl_jax[gpu]', on Python >= 3.12"
_BIG = np.iinfo(np.int32).max


def installed() -> bool:
    """Whether tokamax can be imported by this Python (>= 3.12, the package found): checked
    without importing it, which takes seconds."""
    return sys.version_info >= (3, 12) and importlib.util.find_spec("tokamax") is not None


def present(platform: str) -> bool:
    """Whether tokamax's kernels can run on `platform` (a device's `platform`): tokamax
    installed and an NVIDIA GPU with CUDA's libraries (`fused.cudnn_present`)."""
    return installed() and fused.cudnn_present(platform)


def _op(dtype) -> Any:
    """tokamax's attention op for inputs of `dtype`: Mosaic GPU on compute capability 9.0 or
    newer for 16-bit inputs (its kernels take no float32), else Triton."""
    from tokamax._src.ops.attention import pallas_mosaic_gpu, pallas_triton

    if fused.compute_major("gpu") >= 9 and jnp.dtype(dtype) in (jnp.bfloat16, jnp.float16):
        return pallas_mosaic_gpu.PallasMosaicGpuFlashAttention()
    return pallas_triton.PallasTritonFlashAttention()


def _count_before(key_s, key_p, s, p, *, inclusive: bool) -> jax.Array:
    """Per row, how many of the keys `(key_s, key_p)` `[B, S]` (in lexicographic order along
    `S`) come before each `(s, p)` `[B, T]`: strictly before, or also equal with `inclusive`.
    `[B, T] int32`, by binary search (`S.bit_length()` steps)."""
    n = key_s.shape[1]

    def step(_, bounds):
        lo, hi = bounds
        mid = (lo + hi) // 2
        at = jnp.minimum(mid, n - 1)
        ms = jnp.take_along_axis(key_s, at, axis=1)
        mp = jnp.take_along_axis(key_p, at, axis=1)
        before = (ms < s) | ((ms == s) & ((mp <= p) if inclusive else (mp < p)))
        active = lo < hi
        return jnp.where(active & before, mid + 1, lo), jnp.where(active & ~before, mid, hi)

    lo = jnp.zeros(s.shape, jnp.int32)
    hi = jnp.full(s.shape, n, jnp.int32)
    return jax.lax.fori_loop(0, n.bit_length(), step, (lo, hi))[0]


def key_ranges(q_seg, q_pos, k_seg, k_pos, window, chunk) -> tuple[jax.Array, jax.Array]:
    """`(k_start, k_end)` `[B, T] int32`: the keys `[k_start, k_end)` each query `(q_seg, q_pos)`
    `[B, T]` sees among keys `(k_seg, k_pos)` `[B, S]` (`attend`'s mask; the keys' real tokens in
    `(segment, position)` order, see the module docstring). An empty range for a query that sees
    none (padding), placed where the previous query's ended (the kernel skips key blocks by each
    query block's smallest start and largest end)."""
    real_k = k_seg > 0
    key_s = jax.lax.cummax(jnp.where(real_k, k_seg, 0), axis=1)  # padding: its run's segment
    key_p = jnp.where(real_k, k_pos, _BIG)  # ... after its real keys
    lower = jnp.full_like(q_pos, np.iinfo(np.int32).min)
    if window is not None:
        lower = q_pos - (window - 1)
    if chunk is not None:
        lower = jnp.maximum(lower, q_pos - q_pos % chunk)
    start = _count_before(key_s, key_p, q_seg, lower, inclusive=False)
    end = _count_before(key_s, key_p, q_seg, q_pos, inclusive=True)
    seen = (q_seg > 0) & (end > start)
    last = jax.lax.cummax(jnp.where(seen, end, 0), axis=1)
    return jnp.where(seen, start, last), jnp.where(seen, end, last)


def attention_lse(
    q, k, v, q_seg, q_pos, k_seg, k_pos, *, window, chunk, scale, softcap
) -> tuple[jax.Array, jax.Array]:
    """Queries `[B, T, H, Dk]` against keys `[B, S, KV, Dk]` and values `[B, S, KV, Dv]` with
    their own segment ids and positions (`[B, T]`, `[B, S]` int32), by tokamax: `(out [B, T, H,
    Dv] float32, lse [B, T, H] float32)`, `lse = m + log l` from tokamax's residuals; a query
    that sees no key gets 0 and `-inf` (as `flash.attention_lse`, and what
    `split_merge.merge` takes). Scores `softcap * tanh(scale * q.k / softcap)` with `softcap`,
    else `scale * q.k`."""
    from tokamax._src.ops.attention import base

    start, end = key_ranges(q_seg, q_pos, k_seg, k_pos, window, chunk)
    mask = base.Mask(k_start=start[:, None], k_end=end[:, None])  # [B, heads (broadcast), T]
    # float32 products at the step's precision; 16-bit ones are exact in float32 whatever it is.
    precision = None if q.dtype == jnp.float32 else jax.lax.Precision.DEFAULT
    q, k, v = map(jnp.asarray, (q, k, v))  # tokamax's signature takes JAX arrays only
    out, (row_max, denom) = _op(q.dtype)(
        q * jnp.asarray(scale, q.dtype), k, v, mask=mask, logits_scale=1.0,
        logits_soft_cap=softcap, precision=precision, return_residuals=True,
    )  # fmt: skip
    seen = (end > start)[..., None]
    lse = jnp.where(seen, (row_max + jnp.log(denom)).transpose(0, 2, 1), -jnp.inf)
    return jnp.where(seen[..., None], out.astype(jnp.float32), 0.0), lse


def apart(q, k, v, q_seg, q_pos, k_seg, k_pos, mask) -> jax.Array:
    """`attend` of queries `[B, T, H, Dk]` against keys and values `[B, S, KV, D*]` with their
    own segment ids and positions, `mask` as `Kernel.one_device`'s: `attention_lse`, then the
    sinks (`split_merge.with_sinks`); `[B, T, H, Dv]` in `q.dtype`, padding queries 0."""
    out, lse = attention_lse(
        q, k, v, q_seg, q_pos, k_seg, k_pos, window=mask["window"], chunk=mask["chunk"],
        scale=mask["scale"], softcap=mask["softcap"],
    )  # fmt: skip
    out = split_merge.with_sinks(out, lse, mask["sinks"])[0]
    return jnp.where((q_seg > 0)[..., None, None], out, 0.0).astype(q.dtype)


def one_device(q, k, v, seg, pos, mask) -> jax.Array:
    """`Kernel.one_device`: the row's queries against its own keys, one call."""
    return apart(q, k, v, seg, pos, seg, pos, mask)


def gathered(n, q, k_row, v_row, seg, pos, seg_row, pos_row, mask) -> jax.Array:
    """`Kernel.gathered`: this device's queries against the gathered row's keys, one call."""
    del n
    return apart(q, k_row, v_row, seg, pos, seg_row, pos_row, mask)


def ring(n, q, k, v, seg, pos, mask, flash_ring) -> jax.Array:
    """`Kernel.ring`, inside `shard_map` over `context` (`n` devices): the local queries against
    each device's keys and values as they pass (`n - 1` `ppermute`s; each device's two chunks
    of the row lie in row order), one `attention_lse` per step merged by log-sum-exp
    (`split_merge.merge`), the sinks added once at the end; `[B, T, H, Dv]` in `q.dtype`."""
    del flash_ring
    perm = [(i, (i + 1) % n) for i in range(n)]
    options = dict(
        window=mask["window"], chunk=mask["chunk"], scale=mask["scale"], softcap=mask["softcap"]
    )

    def see(state, keys):
        k_b, v_b, seg_b, pos_b = keys
        return split_merge.merge(
            state, attention_lse(q, k_b, v_b, seg, pos, seg_b, pos_b, **options)
        )

    def step(_, carry):
        state, keys = carry
        return see(state, keys), jax.lax.ppermute(keys, context_lib.AXIS, perm)

    state = split_merge.no_keys(q, v.shape[3])
    state, keys = jax.lax.fori_loop(0, n - 1, step, (state, (k, v, seg, pos)))
    out = split_merge.with_sinks(*see(state, keys), mask["sinks"])[0]
    return jnp.where((seg > 0)[..., None, None], out, 0.0).astype(q.dtype)
