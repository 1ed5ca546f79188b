"""Attention within segments, by position, on every backend and across the context axis.

`attend` is the interface every family codes against: queries, keys and
values with segment ids and positions, optionally a sliding window, chunked attention (Llama 4),
learned sinks (GPT-OSS), a soft-cap (Gemma 2), a scale, and value heads of another width than the
query/key heads (DeepSeek's MLA). For query `i` and key `j` of the same row:

    visible(i, j) = seg[i] == seg[j] and pos[j] <= pos[i]
                    and (window is None or pos[i] - pos[j] < window)
                    and (chunk is None or pos[i] // chunk == pos[j] // chunk)

Implementations (`ppl_jax.models.layers.kernels.KERNELS`, one record each; `resolve` picks one
for `model.attention=auto`, per kind of layer where they differ):

- `xla`: flash attention in plain JAX (`ppl_jax.models.layers.flash`): key blocks with an online
  softmax in float32, memory linear in the window, blocks that the mask rules out skipped.
  Runs everywhere and everything; the reference the others are tested against.
- `cudnn`: cuDNN on NVIDIA GPUs, 16-bit, packed rows on Hopper (`ppl_jax.models.layers.fused`);
  sinks, chunks and narrower values around its partial attention (`split_merge`). No soft-cap.
- `tokamax`: tokamax's Pallas kernels on NVIDIA GPUs, where the optional extra is installed
  (`ppl_jax.models.layers.tokamax_kernel`): soft-caps, packed rows, windows and chunks as
  per-query key ranges, sinks after its log-sum-exp; `auto`'s kernel for what cuDNN cannot run.
- `splash`: the Pallas splash kernel on TPUs (`ppl_jax.models.layers.fused`); chunks by segment
  ids and the ring by its partials (`ppl_jax.models.layers.splash_cases`).

**The context axis** (docs/clusters.md, "One window over several devices"). Under a mesh whose `context` axis has `N > 1`
devices (set by `jax.set_mesh` while tracing; the scorer sets its own), `attend` takes the row in
the load-balanced order of `ppl_jax.models.layers.context.load_balanced_order`, `T` split over
`context`, and runs in a `shard_map` manual over `context` only: each device all-gathers the
layer's keys, values, segment ids and positions (and puts them back in row order), then attends
its own queries (`model.context_attention=all_gather`, the default); or the keys and values go
round a ring of `ppermute`s in `N` steps, the online softmax carried from one shard to the next
(`ring`: `xla`, `cudnn` by its partials, `ring_merge`, `splash` and `tokamax` by theirs), for layers whose gathered keys and values do not fit. The result is the
same as on one device (the mask is by positions, so any order of the row's tokens is right);
only the order of float32 additions differs.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from ppl_jax.errors import ConfigError
from ppl_jax.models.layers import context as context_lib
from ppl_jax.models.layers import flash, kernels, split_merge

IMPLEMENTATIONS = kernels.CHOICES


def keeps_segments(implementation: str) -> bool:
    """Whether `implementation` keeps packed windows apart: a model running it may have several
    windows per row (`LanguageModel.honours_segments`): all but `cudnn` before Hopper
    (`Kernel.keeps_segments`). `auto` (layers that run different kernels): whether every kernel
    `auto` may pick on this backend does."""
    return all(k.keeps_segments() for k in _named(implementation))


def queries_apart(implementation: str) -> bool:
    """Whether a layer of `implementation` may take a long window's queries apart from their
    keys (`Kernel.queries_apart`; `auto`: every kernel it may pick on this backend)."""
    return all(k.queries_apart for k in _named(implementation))


def query_chunk(tokens: int, implementation: str) -> int:
    """Queries per chunk of a layer over a row of `tokens` tokens: `token_chunk` (the step
    setting) when the row is longer on one device and the attention `implementation` takes
    queries apart from their keys (`queries_apart`); else 0 (the layer takes the row
    at once; under a context axis each device holds `tokens / N` of it already)."""
    chunk = context_lib.current().token_chunk
    if not chunk or tokens <= chunk or context_lib.context_size() > 1:
        return 0
    return chunk if queries_apart(implementation) else 0


def _named(implementation: str) -> tuple[kernels.Kernel, ...]:
    if implementation == "auto":
        backend = jax.default_backend()
        return tuple(k for k in kernels.KERNELS.values() if backend in k.platforms)
    return (kernels.kernel(implementation),)


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

    `auto`: the fastest kernel of `ppl_jax.models.layers.kernels.KERNELS` that may run here and
    can do what the model needs (`kernels.pick`): `splash` on TPU, `cudnn` on GPU for 16-bit
    params with head width a multiple of 8 up to 128, 256 on Hopper or newer (`tokamax`, where
    installed, for 16-bit soft-capped attention with heads up to 256 wide), `xla` otherwise.
    `head_dim` None: a model without attention layers (Mamba2), for which `auto` is `xla`.
    `platform`: where the model runs (the mesh's devices'); None: the default backend for `auto`,
    and no check of an explicit setting (a model built abstractly, with no devices in view).

    Raises:
      ConfigError: an explicit kernel that cannot run the model or the mesh, an
        explicit `cudnn` or `tokamax` on a `platform` without it, or `tokamax` not installed.
    """
    needs = kernels.Needs(
        softcap=softcap,
        chunk=chunk,
        sinks=sinks,
        mla=value_dim is not None and value_dim != head_dim,
        context=context,
        context_attention=context_attention,
    )
    if setting != "auto":
        _check(setting, needs, platform)
        return setting
    return kernels.pick(platform or jax.default_backend(), dtype, head_dim, needs).name


def _check(setting: str, needs: kernels.Needs, platform: str | None) -> None:
    """Raises ConfigError where the explicit `setting` cannot do what a model `needs` or run on
    `platform` (see `resolve`)."""
    kernel = kernels.kernel(setting)
    missing = kernel.refuses(needs)
    if missing:
        raise ConfigError(
            f"model.attention={setting} cannot {missing}, which this run needs; set "
            f"model.attention=auto or xla."
        )
    if platform is not None and not kernel.installed():
        raise ConfigError(
            f"model.attention={setting} needs {setting}, which is not installed here "
            f"({kernel.install}); set model.attention=auto (the fastest kernel that can run, "
            f"else xla)."
        )
    if platform is not None and not kernel.present(platform):
        raise ConfigError(
            f"model.attention={setting} needs {kernel.needs}, and this run's devices "
            f"({platform}) have none; set model.attention=auto (the fastest kernel that can "
            f"run, else xla)."
        )


def layer_kernels(
    setting: str, dtype, description: dict, context: int = 1, platform: str | None = None, **mesh
) -> dict[str, str]:
    """The kernel each kind of attention layer of a model description runs under
    `model.attention=setting` (`kernels.layer_needs`' kinds: `attention`, or `chunked`,
    `sliding`, `global`): `auto` picks per kind; an explicit setting (or a resolved name) runs
    on every layer. Empty for a model without attention layers. Arguments as `resolve_for`."""
    head_dim = kernels.head_dim(description)
    if head_dim is None:
        return {}
    kinds = kernels.layer_needs(description, context=context, **mesh)
    if setting != "auto":
        return dict.fromkeys(kinds, setting)
    platform = platform or jax.default_backend()
    return {kind: kernels.pick(platform, dtype, head_dim, n).name for kind, n in kinds.items()}


def flash_note(
    setting: str, dtype, description: dict, context: int = 1, platform: str | None = None, **mesh
) -> str | None:
    """Which kinds of layer run the flash kernel (`xla`) under `setting` though the platform has a
    fused kernel but for one capability they need, and which (`kernels.flash_note`: Gemma 2's
    soft-cap on a GPU), as one line; None where none do or on CPU.
    Arguments as `resolve_for`."""
    picks = layer_kernels(setting, dtype, description, context, platform, **mesh)
    needs = kernels.layer_needs(description, context=context, **mesh)
    slow = {kind: needs[kind] for kind, name in picks.items() if name == "xla"}
    platform = platform or jax.default_backend()
    return kernels.flash_note(platform, dtype, kernels.head_dim(description), slow)


def resolve_for(
    setting: str, dtype, description: dict, context: int = 1, platform: str | None = None, **mesh
) -> str:
    """`resolve` for a model description (`model.build`'s): its head width, `attn_softcap`, and
    the keys a family sets when its attention needs them: `attn_chunk` (chunked attention),
    `attn_sinks` (true: learned sinks), `v_head_dim` (value heads' width). A description with
    neither `head_dim` nor `num_heads` is a model without attention layers (Mamba2's).
    `platform`: as in `resolve`.

    `auto` picks per kind of layer (`layer_kernels`): the one kernel they all take, or `auto`
    where they differ (a kernel lacking what one kind of layer needs), which `attend` then picks
    per layer the same way."""
    if setting == "auto" and kernels.head_dim(description) is not None:
        picks = set(layer_kernels(setting, dtype, description, context, platform, **mesh).values())
        return picks.pop() if len(picks) == 1 else "auto"
    return resolve(
        setting,
        dtype,
        kernels.head_dim(description),
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
        `Kernel.queries_apart`, one device); None: the keys are the queries' tokens.
      window: keys with `pos[i] - pos[j] < window` only (Mistral, Gemma, GPT-OSS), or None.
      chunk: keys of the same chunk `pos // chunk` only (Llama 4's chunked attention), or None.
      sinks: `[H]` float, one logit per query head in the softmax's denominator, not scaled nor
        soft-capped, its probability dropped (transformers' GPT-OSS `eager_attention_forward`);
        or None.
      scale: the logits' scale (default `Dk ** -0.5`), applied to `q` in its dtype.
      softcap: None, or `c` for scores `c * tanh(scale * q.k / c)` before masking (Gemma 2).
      implementation: `xla`, `cudnn`, `tokamax` or `splash` (resolved: see `resolve`), or `auto`: the
        fastest kernel that can do this layer's attention on the default backend
        (`kernels.pick`, as `resolve_for` picked it for the layer's kind).

    Returns:
      `[B, T, H, Dv]` in `q.dtype`.

    Raises:
      ConfigError: an implementation that cannot do what is asked (`Kernel.refuses`);
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
    needs = kernels.Needs(
        softcap=softcap is not None,
        chunk=chunk is not None,
        sinks=sinks is not None,
        mla=v.shape[3] != dk,
        window=window is not None,
        context=n,
        context_attention=context_attention,
    )
    if implementation == "auto":  # per layer (`resolve_for`)
        kernel = kernels.pick(jax.default_backend(), q.dtype, dk, needs)
    else:
        kernel = kernels.kernel(implementation)
    missing = kernel.refuses(needs)
    if missing:
        raise ConfigError(f"model.attention={implementation} cannot {missing}; use xla.")
    mask = dict(window=window, chunk=chunk, sinks=sinks, softcap=softcap)
    if apart:
        return _queries_apart(
            q, k, v, segment_ids, positions, kv_segment_ids, kv_positions, mask, scale, kernel
        )
    mask["scale"] = dk**-0.5 if scale is None else scale
    if n == 1:
        return kernel.one_device(q, k, v, segment_ids, positions, mask)
    if t % (2 * n):
        raise ValueError(
            f"attend: a row of {t} tokens does not split into 2 x {n} chunks of the context "
            f"axis (the scorer pads rows to a multiple of {2 * n})."
        )
    return _over_context(
        kernel, context_attention == "ring", n, q, k, v, segment_ids, positions, mask
    )


def _queries_apart(q, k, v, seg, pos, kv_seg, kv_pos, mask, scale, kernel: kernels.Kernel):
    """`attend` of queries against keys with their own segment ids and positions (see `attend`),
    on one device."""
    if kv_pos is None or kv_seg.shape != kv_pos.shape or kv_seg.shape != k.shape[:2]:
        raise ValueError(f"attend: key segment ids / positions for k {k.shape} do not fit")
    if not kernel.queries_apart or context_lib.context_size() > 1:
        apart = ", ".join(k.name for k in kernels.KERNELS.values() if k.queries_apart)
        raise ValueError(
            f"attend: queries apart from their keys run on one device with {apart}, not "
            f"{kernel.name} over {context_lib.context_size()} (`query_chunk` decides)"
        )
    scale = q.shape[3] ** -0.5 if scale is None else scale
    if kernel.apart is not None:  # one call of its own
        return kernel.apart(q, k, v, seg, pos, kv_seg, kv_pos, dict(mask, scale=scale))

    def flash_path():
        return flash.flash_attention(q, k, v, seg, pos, kv_seg, kv_pos, scale=scale, **mask)

    chunk = mask["chunk"]
    if kernel is kernels.XLA or (
        chunk is not None
        and (mask["window"] is not None or not split_merge.chunks_fit(q.shape[1], chunk))
    ):
        return flash_path()
    # The kernel's partials: the chunk's diagonal block and its prefix, for rows of one document
    # (whose tokens sit at their positions: the chunk starts at its first real token's position).
    one, real = split_merge.one_document(kv_seg, kv_pos)
    start = jnp.max(jnp.where(seg[:, 0] > 0, pos[:, 0], 0))

    def split():
        out = split_merge.chunk_of_row(
            q, k, v, start, real, scale=scale, partial=kernel.partial, sinks=mask["sinks"],
            window=mask["window"], chunk=chunk,
        )  # fmt: skip
        return out.astype(q.dtype)

    return jax.lax.cond(one, split, flash_path)


def _over_context(kernel: kernels.Kernel, ring, n, q, k, v, seg, pos, mask):
    """`attend` under a context axis of `n` devices (see the module docstring)."""
    sinks = mask["sinks"]

    def body(q, k, v, seg, pos, sinks_in):
        local = dict(mask, sinks=None if sinks is None else sinks_in)
        if ring:
            if kernel.ring is None:
                return _ring(n, q, k, v, seg, pos, local)
            return kernel.ring(n, q, k, v, seg, pos, local, _ring)
        k_row, v_row, seg_row, pos_row = (context_lib.gather_rows(x, n) for x in (k, v, seg, pos))
        return kernel.gathered(n, q, k_row, v_row, seg, pos, seg_row, pos_row, local)

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
