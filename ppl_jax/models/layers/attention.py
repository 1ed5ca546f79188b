"""Attention within segments, by position, on every backend and across the context axis.

`attend` is the interface every family codes against: queries, keys and
values with segment ids and positions, optionally a sliding window, chunked attention (Llama 4),
learned sinks (GPT-OSS), a soft-cap (Gemma 2), a scale, and value heads of another width than the
query/key heads (DeepSeek's MLA). For query `i` and key `j` of the same row:

    visible(i, j) = seg[i] == seg[j] and pos[j] <= pos[i]
                    and (window is None or pos[i] - pos[j] < window)
                    and (chunk is None or pos[i] // chunk == pos[j] // chunk)

Implementations (`resolve` picks one for `model.attention=auto`):

- `xla`: flash attention in plain JAX (`ppl_jax.models.layers.flash`): key blocks with an online
  softmax in float32, memory linear in the window, blocks that the mask rules out skipped.
  Runs everywhere and everything; the reference the others are tested against.
- `cudnn`: cuDNN on NVIDIA GPUs, 16-bit, packed rows on Hopper (`ppl_jax.models.layers.fused`).
- `splash`: the Pallas splash kernel on TPUs (`ppl_jax.models.layers.fused`).

**The context axis** (docs/clusters.md, "One window over several devices"). Under a mesh whose `context` axis has `N > 1`
devices (set by `jax.set_mesh` while tracing; the scorer sets its own), `attend` takes the row in
the load-balanced order of `ppl_jax.models.layers.context.load_balanced_order`, `T` split over
`context`, and runs in a `shard_map` manual over `context` only: each device all-gathers the
layer's keys, values, segment ids and positions (and puts them back in row order), then attends
its own queries (`model.context_attention=all_gather`, the default); or the keys and values go
round a ring of `ppermute`s in `N` steps, the online softmax carried from one shard to the next
(`ring`: `xla` only), for layers whose gathered keys and values do not fit. The result is the
same as on one device (the mask is by positions, so any order of the row's tokens is right);
only the order of float32 additions differs.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from ppl_jax.errors import ConfigError
from ppl_jax.models.layers import context as context_lib
from ppl_jax.models.layers import flash, fused, split_merge

IMPLEMENTATIONS = ("auto", "xla", "cudnn", "splash")
# The implementations that keep the segments of a packed row apart (segment ids in the mask);
# cuDNN's does through its packed layout on Hopper or newer only (`fused.cudnn_packs`),
# before that it takes per-row sequence lengths, so each of its rows holds one window.
KEEP_SEGMENTS = ("xla", "splash")


def keeps_segments(implementation: str) -> bool:
    """Whether `implementation` keeps packed windows apart: a model running it may have several
    windows per row (`LanguageModel.honours_segments`): all but `cudnn` before Hopper."""
    return implementation in KEEP_SEGMENTS or (implementation == "cudnn" and fused.cudnn_packs())


def unsupported(
    implementation: str,
    *,
    softcap: bool = False,
    chunk: bool = False,
    sinks: bool = False,
    mla: bool = False,
    context: int = 1,
    context_attention: str = "all_gather",
) -> str | None:
    """What `implementation` cannot do of what the model and mesh need (a phrase), or None."""
    if implementation == "cudnn":
        needs = [
            (softcap, "soft-cap attention scores (attn_logit_softcapping)"),
            (chunk, "run chunked attention"),
            (sinks, "add attention sinks"),
            (mla, "use value heads of another width than the key heads"),
            (
                context > 1 and context_attention == "ring",
                "pass keys and values round a ring (model.context_attention=ring)",
            ),
        ]
        return next((what for need, what in needs if need), None)
    if implementation == "splash":
        if chunk:
            return "run chunked attention"
        if context > 1 and context_attention == "ring":
            return "pass keys and values round a ring (model.context_attention=ring)"
    return None


def resolve(
    setting: str,
    dtype,
    head_dim: int | None,
    platform: str | None = None,
    softcap: bool = False,
    *,
    chunk: bool = False,
    sinks: bool = False,
    value_dim: int | None = None,
    context: int = 1,
    context_attention: str = "all_gather",
) -> str:
    """The implementation that `model.attention=setting` runs on this platform, for a model whose
    attention needs a soft-cap, chunks, sinks or value heads of width `value_dim`, on a mesh with
    `context` devices along the context axis.

    `auto`: `splash` on TPU, `cudnn` on GPU for 16-bit params with head width a multiple of 8 up
    to 128, `xla` otherwise, and `xla` wherever the pick cannot run what the model needs.
    `head_dim` None: a model without attention layers (Mamba2), for which `auto` is `xla`.
    `platform`: where the model runs (the mesh's devices'); None: the default backend for `auto`,
    and no check of an explicit setting (a model built abstractly, with no devices in view).

    Raises:
      ConfigError: an explicit `cudnn` or `splash` that cannot run the model or the mesh, or an
        explicit `cudnn` on a `platform` without cuDNN.
    """
    needs = dict(
        softcap=softcap,
        chunk=chunk,
        sinks=sinks,
        mla=value_dim is not None and value_dim != head_dim,
        context=context,
        context_attention=context_attention,
    )
    if setting != "auto":
        missing = unsupported(setting, **needs)
        if missing:
            raise ConfigError(
                f"model.attention={setting} cannot {missing}, which this run needs; set "
                f"model.attention=auto or xla."
            )
        if setting == "cudnn" and platform is not None and not fused.cudnn_present(platform):
            raise ConfigError(
                f"model.attention=cudnn needs an NVIDIA GPU with cuDNN, and this run's devices "
                f"({platform}) have none; set model.attention=auto (cuDNN where it can run, else "
                f"xla)."
            )
        return setting
    platform = platform or jax.default_backend()
    pick = "xla"
    if head_dim is None:  # no attention layers: nothing to pick
        return pick
    if platform == "tpu":
        pick = "splash"
    elif (
        platform == "gpu"
        and jnp.dtype(dtype) in (jnp.bfloat16, jnp.float16)
        and (head_dim % 8 == 0 and head_dim <= 128)
    ):
        pick = "cudnn"
    return "xla" if unsupported(pick, **needs) else pick


def resolve_for(
    setting: str, dtype, description: dict, context: int = 1, platform: str | None = None, **mesh
) -> str:
    """`resolve` for a model description (`model.build`'s): its head width, `attn_softcap`, and
    the keys a family sets when its attention needs them: `attn_chunk` (chunked attention),
    `attn_sinks` (true: learned sinks), `v_head_dim` (value heads' width). A description with
    neither `head_dim` nor `num_heads` is a model without attention layers (Mamba2's).
    `platform`: as in `resolve`."""
    head_dim = description.get("head_dim")
    if not head_dim and description.get("num_heads"):
        head_dim = description["embed_dim"] // description["num_heads"]
    return resolve(
        setting,
        dtype,
        head_dim,
        softcap=bool(description.get("attn_softcap")),
        chunk=bool(description.get("attn_chunk")),
        sinks=bool(description.get("attn_sinks")),
        value_dim=description.get("v_head_dim"),
        context=context,
        platform=platform,
        **mesh,
    )


def attend(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    *,
    segment_ids: jax.Array,
    positions: jax.Array,
    kv_segment_ids: jax.Array | None = None,
    kv_positions: jax.Array | None = None,
    window: int | None = None,
    chunk: int | None = None,
    sinks: jax.Array | None = None,
    scale: float | None = None,
    softcap: float | None = None,
    implementation: str = "xla",
) -> jax.Array:
    """Attention of each token to the earlier tokens of its own segment (the mask above).

    Args:
      q: `[B, T, H, Dk]`; k: `[B, S, KV, Dk]`; v: `[B, S, KV, Dv]`, with `H` a multiple of `KV`
        (grouped-query attention) and `Dv` possibly other than `Dk` (MLA; `xla` and `splash`);
        `S = T` unless the keys are given their own segment ids and positions.
      segment_ids: `[B, T] int32`, 0 for padding (whose outputs are zeros, or unspecified with
        `cudnn`/`splash`: never scored).
      positions: `[B, T] int32`, the token's position in its segment, strictly increasing
        along the row within a segment.
      kv_segment_ids, kv_positions: `[B, S] int32`, the keys' own, when they are other tokens
        than the queries (a chunk of a long window's queries against every key of the row:
        `context.QUERIES_APART`, one device); None: the keys are the queries' tokens.
      window: keys with `pos[i] - pos[j] < window` only (Mistral, Gemma, GPT-OSS), or None.
      chunk: keys of the same chunk `pos // chunk` only (Llama 4's chunked attention), or None.
      sinks: `[H]` float, one logit per query head in the softmax's denominator, not scaled nor
        soft-capped, its probability dropped (transformers' GPT-OSS `eager_attention_forward`);
        or None.
      scale: the logits' scale (default `Dk ** -0.5`), applied to `q` in its dtype.
      softcap: None, or `c` for scores `c * tanh(scale * q.k / c)` before masking (Gemma 2).
      implementation: `xla`, `cudnn` or `splash` (resolved: see `resolve`).

    Returns:
      `[B, T, H, Dv]` in `q.dtype`.

    Raises:
      ConfigError: an implementation that cannot do what is asked (see `unsupported`);
      ValueError: shapes that do not fit, a window or chunk below 1, or under a context axis of
        `N` devices a row whose length is not a multiple of `2N`.
    """
    b, t, h, dk = q.shape
    kv = k.shape[2]
    apart = kv_segment_ids is not None
    s = k.shape[1] if apart else t
    if k.shape[:2] != (b, s) or v.shape[:3] != (b, s, kv) or k.shape[3] != dk or h % kv:
        raise ValueError(f"attend: q {q.shape}, k {k.shape}, v {v.shape} do not fit")
    if segment_ids.shape != (b, t) or positions.shape != (b, t):
        raise ValueError(f"attend: segment ids / positions {segment_ids.shape} for q {q.shape}")
    if (window is not None and window < 1) or (chunk is not None and chunk < 1):
        raise ValueError(f"attend: window={window}, chunk={chunk} must be None or at least 1")
    if sinks is not None and sinks.shape != (h,):
        raise ValueError(f"attend: sinks {sinks.shape}, one per query head ({h}) expected")
    n = context_lib.context_size()
    context_attention = context_lib.current().context_attention
    missing = unsupported(
        implementation,
        softcap=softcap is not None,
        chunk=chunk is not None,
        sinks=sinks is not None,
        mla=v.shape[3] != dk,
        context=n,
        context_attention=context_attention,
    )
    if missing:
        raise ConfigError(f"model.attention={implementation} cannot {missing}; use xla.")
    if implementation not in IMPLEMENTATIONS[1:]:
        raise ValueError(f"unknown attention implementation {implementation!r}")
    if apart:
        return _queries_apart(
            q, k, v, segment_ids, positions, kv_segment_ids, kv_positions,
            dict(window=window, chunk=chunk, sinks=sinks, softcap=softcap), scale, implementation,
        )  # fmt: skip
    scale = dk**-0.5 if scale is None else scale
    mask = dict(window=window, chunk=chunk, sinks=sinks, scale=scale, softcap=softcap)
    if n == 1:
        if implementation == "cudnn":
            return fused.cudnn(q, k, v, segment_ids, window, scale)
        if implementation == "splash":
            return fused.splash(q, k, v, segment_ids, segment_ids, **_no_chunk(mask))
        return flash.flash_attention(
            q, k, v, segment_ids, positions, segment_ids, positions, **mask
        )
    if t % (2 * n):
        raise ValueError(
            f"attend: a row of {t} tokens does not split into 2 x {n} chunks of the context "
            f"axis (the scorer pads rows to a multiple of {2 * n})."
        )
    return _over_context(
        implementation, context_attention == "ring", n, q, k, v, segment_ids, positions, mask
    )


def _queries_apart(q, k, v, seg, pos, kv_seg, kv_pos, mask, scale, implementation):
    """`attend` of queries against keys with their own segment ids and positions (see `attend`),
    on one device."""
    if kv_pos is None or kv_seg.shape != kv_pos.shape or kv_seg.shape != k.shape[:2]:
        raise ValueError(f"attend: key segment ids / positions for k {k.shape} do not fit")
    if implementation not in context_lib.QUERIES_APART or context_lib.context_size() > 1:
        raise ValueError(
            f"attend: queries apart from their keys run on one device with "
            f"{', '.join(context_lib.QUERIES_APART)}, not {implementation} over "
            f"{context_lib.context_size()} (`query_chunk` decides)"
        )
    scale = q.shape[3] ** -0.5 if scale is None else scale

    def flash_path():
        return flash.flash_attention(q, k, v, seg, pos, kv_seg, kv_pos, scale=scale, **mask)

    if implementation != "cudnn" or mask["window"] is not None:
        return flash_path()
    # cuDNN: the chunk's diagonal block and its prefix, for rows of one document (whose tokens
    # sit at their positions: the chunk starts at its first real token's position).
    one, real = split_merge.one_document(kv_seg, kv_pos)
    start = jnp.max(jnp.where(seg[:, 0] > 0, pos[:, 0], 0))

    def split():
        out = split_merge.chunk_of_row(
            q, k, v, start, real, scale=scale, partial=split_merge.PARTIALS["cudnn"]
        )
        return out.astype(q.dtype)

    return jax.lax.cond(one, split, flash_path)


def _no_chunk(mask: dict) -> dict:
    return {k: v for k, v in mask.items() if k != "chunk"}


def _over_context(implementation, ring, n, q, k, v, seg, pos, mask):
    """`attend` under a context axis of `n` devices (see the module docstring)."""
    sinks = mask["sinks"]

    def body(q, k, v, seg, pos, sinks_in):
        local = dict(mask, sinks=None if sinks is None else sinks_in)
        if ring:
            return _ring(n, q, k, v, seg, pos, local)
        k_row, v_row, seg_row, pos_row = (context_lib.gather_rows(x, n) for x in (k, v, seg, pos))
        if implementation == "cudnn" and local["window"] is None:
            one, real = split_merge.one_document(seg_row, pos_row)
            return jax.lax.cond(
                one,
                lambda: split_merge.over_context(
                    q, k_row, v_row, real, n, scale=local["scale"],
                    partial=split_merge.PARTIALS["cudnn"],
                ),
                lambda: flash.flash_attention(q, k_row, v_row, seg, pos, seg_row, pos_row, **local),
            )  # fmt: skip
        if implementation == "splash":
            half = q.shape[1] // 2
            r = jax.lax.axis_index(context_lib.AXIS)
            outs = [
                fused.splash(
                    q[:, i * half : (i + 1) * half],
                    k_row,
                    v_row,
                    seg[:, i * half : (i + 1) * half],
                    seg_row,
                    offset=chunk_index * half,
                    **_no_chunk(local),
                )
                for i, chunk_index in enumerate((r, 2 * n - 1 - r))
            ]
            return jnp.concatenate(outs, axis=1)
        return flash.flash_attention(q, k_row, v_row, seg, pos, seg_row, pos_row, **local)

    dummy = jnp.zeros((q.shape[2],), jnp.float32) if sinks is None else sinks
    return context_lib.shard_over_context(body, q, k, v, seg, pos, dummy, replicated=(5,))


def _ring(n, q, k, v, seg, pos, mask):
    """Inside `shard_map` over `context`: the local queries against every device's keys and
    values, which go round the ring one step at a time (`n - 1` `ppermute`s)."""
    b, t, h, _ = q.shape
    kv, dv = k.shape[2], v.shape[3]
    block_q, block_k = flash.block_sizes(t, k.shape[1])
    queries = flash.split_heads(q, kv, mask["scale"])
    perm = [(i, (i + 1) % n) for i in range(n)]
    options = dict(
        window=mask["window"],
        chunk=mask["chunk"],
        softcap=mask["softcap"],
        block_q=block_q,
        block_k=block_k,
    )

    def see(state, keys):
        return flash.update(state, queries, *keys[:2], seg, pos, *keys[2:], **options)

    def step(_, carry):
        state, keys = carry
        state = see(state, keys)
        return state, jax.lax.ppermute(keys, context_lib.AXIS, perm)

    state = flash.init(b, kv, h // kv, t, dv)
    state, keys = jax.lax.fori_loop(0, n - 1, step, (state, (k, v, seg, pos)))
    return flash.finish(see(state, keys), mask["sinks"], q.dtype)
