"""The fused attention kernels behind `ppl_jax.models.layers.attention.attend`: cuDNN on NVIDIA GPUs
and splash attention on TPUs.

- `cudnn`: cuDNN's flash attention through JAX's private entry
  `jax._src.cudnn.fused_attention_stablehlo.dot_product_attention`, which takes packed rows
  (sequence packing: `q_offsets`/`kv_offsets` and per-segment lengths, jax-ml/jax PR #25812,
  JAX >= 0.5.1) on Hopper or newer GPUs. Each row's segments become cuDNN segments (their start
  and length, from the segment ids), each attends causally within itself, so two documents
  packed in a row never see each other (MaxText issue 4476 is the trap of passing a causal mask
  without the offsets). A batch without packed rows takes cuDNN's per-row lengths (the path
  measured at 54% MFU, BENCHMARKS.md); the choice is made at run time. On older GPUs the layout
  puts one window per row (`packs`), and a packed row there gives NaN, never numbers from
  documents that saw each other. Either way the mask is by
  index within a segment, which is `attend`'s by positions for the scorer's rows (positions
  0, 1, 2, ... in each segment). No soft-cap, chunked attention, sinks or `Dv != Dk` here (the
  last three: `ppl_jax.models.layers.split_merge` around cuDNN's partial attention).
- `splash`: the Pallas splash-attention kernel (`jax.experimental.pallas.ops.tpu.splash_attention`,
  interpreted on CPU in the tests), with segment ids, a causal or local mask, sinks and a
  soft-cap, grouped-query heads as multi-query kernels per key/value head. Under the context
  axis each device's two chunks attend to the gathered row with the chunk's offset in the
  causal mask (`CausalMask`/`LocalMask` `offset`), one kernel per possible chunk, chosen with
  `lax.switch` by the device's index. Rows of any length: the kernel's blocks are multiples of
  128 tokens (`SPLASH_BLOCK`), so queries and keys are padded up to one inside the call with a
  segment id no real token has (-1), and the output sliced back; exact, the padded keys are
  masked for every real query. With `lse`, the partial attention and its log-sum-exp
  (`save_residuals`), which `ppl_jax.models.layers.splash_cases` merges round the context axis's
  ring; chunked attention there too, by segment ids (the kernel's own chunks are by index, not by
  position within a segment).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

# Segments per row the packed cuDNN path lays out (the layout puts at most
# `ppl_jax.plans.layout.MAX_SEGMENTS` windows in a row).
CUDNN_SEGMENTS = 64
# The splash kernel's query and key blocks are multiples of this many tokens (its `NUM_LANES`).
SPLASH_BLOCK = 128


def compute_major(platform: str | None) -> int:
    """The major compute capability of this process's first CUDA GPU on `platform` (default:
    JAX's backend), 0 where there is none."""
    if (platform or jax.default_backend()) != "gpu":
        return 0
    try:
        device = jax.local_devices(backend="gpu")[0]
        return int(str(device.compute_capability).split(".")[0])
    except (AttributeError, IndexError, RuntimeError, ValueError):
        return 0


def cudnn_packs(platform: str | None = None) -> bool:
    """Whether cuDNN attention can run packed rows here: a CUDA GPU of compute capability 9.0
    (Hopper) or newer, and JAX >= 0.5.1 (whose cuDNN entry takes `q_offsets`)."""
    return compute_major(platform) >= 9 and _jax_version() >= (0, 5, 1)


def cudnn_head_width(platform: str | None = None) -> int:
    """The widest query/key heads cuDNN's flash attention takes here in 16 bits: 256 on a GPU of
    compute capability 9.0 (Hopper) or newer, 128 before (the check of JAX's cuDNN entry,
    `jax/_src/cudnn/fused_attention_stablehlo.py`, `check_is_flash_attention`)."""
    return 256 if compute_major(platform) >= 9 else 128


def cudnn_present(platform: str) -> bool:
    """Whether cuDNN attention can run on `platform` (a device's `platform`: `gpu`, `cpu`,
    `tpu`): a GPU whose JAX has CUDA's libraries (`jax._src.lib.cuda_versions`, what JAX's cuDNN
    entry checks before it raises `cuDNN is not detected`)."""
    if platform not in ("gpu", "cuda"):
        return False
    try:
        from jax._src.lib import cuda_versions
    except ImportError:
        return False
    return cuda_versions is not None


def _jax_version() -> tuple[int, ...]:
    return tuple(int(x) for x in jax.__version__.split(".")[:3] if x.isdigit())


def _segment_layout(segment_ids: jax.Array, segments: int) -> tuple[jax.Array, jax.Array]:
    """`(lengths [B, M], offsets [B, M + 1])` int32 of segment ids `1..M` of each row (-1 where a
    row has no such segment), for cuDNN's packed layout; each segment's tokens must be one run."""
    b, t = segment_ids.shape

    def one(seg):
        index = jnp.arange(t, dtype=jnp.int32)
        start = jax.ops.segment_min(index, seg, num_segments=segments + 1)[1:]
        count = jax.ops.segment_sum(jnp.ones_like(seg), seg, num_segments=segments + 1)[1:]
        present = count > 0
        # Present segments first, in order of their starts (ids increase along the row).
        order = jnp.argsort(jnp.where(present, start, t + 1))
        start, count, present = start[order], count[order], present[order]
        return jnp.where(present, count, -1), jnp.where(present, start, -1)

    lengths, offsets = jax.vmap(one)(segment_ids)
    pad = jnp.full((b, 1), -1, jnp.int32)
    return lengths.astype(jnp.int32), jnp.concatenate([offsets.astype(jnp.int32), pad], axis=1)


def _segment_starts(segment_ids: jax.Array) -> jax.Array:
    """`[B] int32`: the segments each row starts (runs of one non-zero id)."""
    starts = (segment_ids[:, 1:] != segment_ids[:, :-1]) & (segment_ids[:, 1:] > 0)
    return jnp.sum(starts, axis=1, dtype=jnp.int32) + (segment_ids[:, 0] > 0)


def _poison_unsupported_rows(out: jax.Array, segment_ids: jax.Array, segments: int) -> jax.Array:
    """NaN in every row that holds more segments than the kernel was given (or any segment
    after padding), so that the scorer stops with its NaN error instead of reporting numbers
    from documents that saw each other."""
    bad = _segment_starts(segment_ids) > segments
    return jnp.where(bad[:, None, None, None], jnp.asarray(jnp.nan, out.dtype), out)


def cudnn(q, k, v, segment_ids, window, scale) -> jax.Array:
    """cuDNN flash attention of `[B, T, H, D]` queries against `[B, T, KV, D]` keys and values,
    causal within each segment; `[B, T, H, D]` in `q.dtype` (16-bit). A batch whose rows each
    hold one segment followed by padding runs cuDNN's per-row lengths; one with packed rows its
    packed layout on Hopper or newer (`cudnn_packs`, chosen at run time with `lax.cond`), and
    elsewhere NaN (the layout never packs rows there)."""

    def lengths_path(q, k, v, segment_ids):
        lengths = jnp.sum(segment_ids != 0, axis=1, dtype=jnp.int32)
        out = jax.nn.dot_product_attention(
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
        return _poison_unsupported_rows(out, segment_ids, 1)

    if not cudnn_packs():
        return lengths_path(q, k, v, segment_ids)
    from jax._src.cudnn import fused_attention_stablehlo as cudnn_lib

    segments = min(CUDNN_SEGMENTS, q.shape[1])

    def packed_path(q, k, v, segment_ids):
        lengths, offsets = _segment_layout(segment_ids, segments)
        out = cudnn_lib.dot_product_attention(
            q,
            k,
            v,
            q_seqlen=lengths,
            kv_seqlen=lengths,
            q_offsets=offsets,
            kv_offsets=offsets,
            scale=scale,
            mask_type=cudnn_lib.MaskType.PADDING_CAUSAL,
            sliding_window_length=window,
        )
        return _poison_unsupported_rows(out, segment_ids, segments)

    packed = jnp.any(_segment_starts(segment_ids) > 1)
    return jax.lax.cond(packed, packed_path, lengths_path, q, k, v, segment_ids)


@functools.lru_cache(maxsize=64)
def _splash_kernel(
    group: int,
    q_len: int,
    kv_len: int,
    offset: int,
    window: int | None,
    interpret: bool,
    softcap: float | None,
    residuals: bool,
    mesh: jax.sharding.AbstractMesh,
):
    """The splash kernel of these shapes and mask, made once per `mesh`: the abstract mesh in
    force (`jax.sharding.get_abstract_mesh`), whose manual axes inside the context axis's
    `shard_map` the kernel's arrays take on; made there and called outside, XLA raises
    "Unhandled OpSharding type ... manual"."""
    from jax.experimental.pallas.ops.tpu.splash_attention import (
        splash_attention_kernel as kernel,
    )
    from jax.experimental.pallas.ops.tpu.splash_attention import (
        splash_attention_mask as mask_lib,
    )

    shape = (q_len, kv_len)
    if window is None:
        head_mask = mask_lib.CausalMask(shape=shape, offset=offset)
    else:
        head_mask = mask_lib.LocalMask(shape=shape, window_size=(window - 1, 0), offset=offset)
    # The lengths are multiples of SPLASH_BLOCK (`splash` pads them).
    block_q = next(b for b in (512, 256, SPLASH_BLOCK) if q_len % b == 0)
    block_kv = next(b for b in (512, 256, SPLASH_BLOCK) if kv_len % b == 0)
    sizes = kernel.BlockSizes(block_q=block_q, block_kv=block_kv, block_kv_compute=block_kv)
    # The kernel holds its mask's block tables as arrays; made under a trace they would be that
    # trace's tracers, and the cached kernel would leak them into the next trace (a second batch
    # shape of the same width). Made at compile time they are concrete.
    with jax.ensure_compile_time_eval():
        return kernel.make_splash_mqa_single_device(
            mask=mask_lib.MultiHeadMask([head_mask] * group),
            block_sizes=sizes,
            interpret=interpret,
            attn_logits_soft_cap=softcap,
            save_residuals=residuals,
        )


def splash(
    q, k, v, q_seg, k_seg, *, window, sinks, scale, softcap, offset=0, offsets=None, lse=False
):
    """Splash attention of `[B, Tq, H, D]` queries against `[B, Tk, KV, D]` keys and values; the
    queries are the row's tokens `offset .. offset + Tq - 1` (the keys the whole row from 0).
    `offset` is a Python int or a traced int32 that takes one of the values `offsets` (the
    multiples of `Tq` below `offsets * Tq`; default `range(0, Tk, Tq)`, the context axis's
    chunks): one kernel per value, chosen with `lax.switch`. An offset past the keys
    (`offset >= Tk`) makes every key of the query's segment visible (a block of earlier keys).
    `Tq` and `Tk` of any length: each is padded to a multiple of `SPLASH_BLOCK` (keys no real
    query sees) and the output sliced back. Returns `[B, Tq, H, Dv]` in `q.dtype`; with `lse`,
    the partial attention `(out [B, Tq, H, Dv] float32, lse [B, Tq, H] float32)` of
    `split_merge` (the kernel's `save_residuals`), a query that saw no key giving 0 and `-inf`
    (the kernel gives its mask value's log-sum-exp, about -2.4e38, there)."""
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel

    b, t, h, d = q.shape
    s, kv = k.shape[1], k.shape[2]
    group = h // kv
    interpret = jax.default_backend() != "tpu"  # CPU tests run the kernel interpreted
    # Padded tokens take the segment id -1, which no real token has: no real query sees them.
    q, k, v = _pad_to_block(q), _pad_to_block(k), _pad_to_block(v)
    q_seg, k_seg = _pad_to_block(q_seg, -1), _pad_to_block(k_seg, -1)
    tp, sp = q.shape[1], k.shape[1]
    # [B, T, KV*G, D] -> [B, KV, G, T, D]; one multi-query kernel call per (example, KV head).
    q = (q * jnp.asarray(scale, q.dtype)).reshape(b, tp, kv, group, d).transpose(0, 2, 3, 1, 4)
    k = k.transpose(0, 2, 1, 3)  # [B, KV, S, D]
    v = v.transpose(0, 2, 1, 3)
    sink = None if sinks is None else sinks.astype(jnp.float32).reshape(kv, group)

    def run(kern, q, k, v, q_seg, k_seg, sink):
        def one(q_g, k_1, v_1, qs, ks, sink_g):
            ids = splash_attention_kernel.SegmentIds(q=qs, kv=ks)
            return kern(q_g, k_1, v_1, segment_ids=ids, sinks=sink_g)

        per_head = jax.vmap(one, in_axes=(0, 0, 0, None, None, None if sink is None else 0))
        return jax.vmap(per_head, in_axes=(0, 0, 0, 0, 0, None))(q, k, v, q_seg, k_seg, sink)

    def kernel_at(start):
        return _splash_kernel(
            group, tp, sp, start, window, interpret, softcap, lse, jax.sharding.get_abstract_mesh()
        )

    args = (q, k, v, q_seg, k_seg, sink)
    if isinstance(offset, int):
        out = run(kernel_at(offset), *args)
    else:
        starts = range(0, s, t) if offsets is None else range(0, offsets * t, t)
        branches = [functools.partial(run, kernel_at(start)) for start in starts]
        out = jax.lax.switch(offset // t, branches, *args)
    if not lse:
        out = out[:, :, :, :t]  # [B, KV, G, T, Dv]: the real queries
        return out.transpose(0, 3, 1, 2, 4).reshape(b, t, h, -1).astype(np.dtype(q.dtype))
    out, (stats,) = out
    stats = stats[:, :, :, :t].transpose(0, 3, 1, 2).reshape(b, t, h).astype(jnp.float32)
    seen = stats > _SPLASH_NO_KEY
    out = out[:, :, :, :t].transpose(0, 3, 1, 2, 4).reshape(b, t, h, -1).astype(jnp.float32)
    return jnp.where(seen[..., None], out, 0.0), jnp.where(seen, stats, -jnp.inf)


# Below this a splash log-sum-exp is its mask value's (-0.7 x float32's largest, plus the log of
# a block's keys): a query that saw no key.
_SPLASH_NO_KEY = -0.35 * float(np.finfo(np.float32).max)


def _pad_to_block(x: jax.Array, fill: int = 0) -> jax.Array:
    """`x` (`[B, T, ...]`) padded with `fill` along `T` to a multiple of `SPLASH_BLOCK`."""
    pad = -x.shape[1] % SPLASH_BLOCK
    widths = [(0, 0), (0, pad)] + [(0, 0)] * (x.ndim - 2)
    return jnp.pad(x, widths, constant_values=fill) if pad else x
