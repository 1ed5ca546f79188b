"""The attention kernels as a table: one `Kernel` record per implementation of
`ppl_jax.models.layers.attention.attend`, which `attend`, `resolve` and the config's choices
(`model.attention`) ask. Adding a kernel is one record here and its module.

Each record says what the kernel can do (`refuses`: the first of a layer's `Needs` it cannot
meet, as the phrase of the refusal's sentence), where `auto` may pick it (`auto_ok`: platform,
params dtype, head width) and in which order (`KERNELS`' order: the fastest first), whether it
keeps a packed row's documents apart (`keeps_segments`), whether it takes a long window's
queries apart from their keys (`queries_apart`), how it is called on one device (`one_device`)
and over the context axis's gathered row (`gathered`), and its partial attention with the
log-sum-exp (`partial`, for `ppl_jax.models.layers.split_merge`). A kernel of an optional extra
says whether its package is installed (`installed`, which `auto` asks too) and how to install it.

`pick` chooses per layer: under `model.attention=auto` a model whose layers need different
things, where a kernel lacks what only some need, runs one kernel on some layers and another
on the rest (`layer_kernels` names them per kind of layer, as results.json records). Of the
kernels here none lacks a need of one kind of layer only (cuDNN's soft-cap is every layer's):
each family runs one kernel on all its layers. On a GPU, cuDNN runs what it can and tokamax
(the `gpu` extra) the soft-capped layers; without tokamax those run `xla` (`flash_note`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp

from ppl_jax.models.layers import (
    flash,
    fused,
    ring_merge,
    splash_cases,
    split_merge,
    tokamax_kernel,
)


@dataclasses.dataclass(frozen=True)
class Needs:
    """What one layer's attention asks of a kernel.

    Attributes:
      softcap: soft-capped scores (Gemma 2); chunk: chunked attention (Llama 4); sinks: learned
        sinks (GPT-OSS); mla: value heads of another width than the key heads (DeepSeek's MLA);
        window: a sliding window.
      context: devices along the mesh's context axis; context_attention: `all_gather` or
        `ring` (`mesh.context_attention`).
    """

    softcap: bool = False
    chunk: bool = False
    sinks: bool = False
    mla: bool = False
    window: bool = False
    context: int = 1
    context_attention: str = "all_gather"

    @property
    def ring(self) -> bool:
        """Keys and values passed round a ring of the context axis's devices."""
        return self.context > 1 and self.context_attention == "ring"


# The phrase of each need a kernel may lack, in the order refusals name them.
PHRASES = (
    ("softcap", "soft-cap attention scores (attn_logit_softcapping)"),
    ("chunk", "run chunked attention"),
    ("sinks", "add attention sinks"),
    ("mla", "use value heads of another width than the key heads"),
    ("ring", "pass keys and values round a ring (model.context_attention=ring)"),
)


@dataclasses.dataclass(frozen=True)
class Kernel:
    """One attention implementation (see the module docstring).

    Attributes:
      name: its `model.attention` name.
      platforms: where `auto` may pick it (a device's `platform`).
      lacks: the needs (`Needs` attribute names, of `PHRASES`) it cannot meet.
      auto_ok: `(platform, dtype, head_dim) -> bool`, beyond `platforms`, where `auto` picks it.
      keeps_segments: `() -> bool`, whether it keeps a packed row's documents apart here.
      ring: inside the context axis's `shard_map`, `(n, q, k, v, seg, pos, mask, flash_ring) ->
        out`, `model.context_attention=ring` by its own partials (`ring_merge`), or None: the
        flash kernel's ring (`flash_ring`, the same arguments but the last).
      present: `platform -> bool`, whether it can run on a device of that platform at all
        (checked for an explicit setting); needs: what it needs there, for the refusal.
      auto_when: `auto_ok`'s rule in words, for `flash_note` (`runs only ...`).
      queries_apart: whether a long window's queries may run apart from their keys.
      one_device: `(q, k, v, seg, pos, mask) -> out`, `mask` the dict of `window`, `chunk`,
        `sinks`, `scale`, `softcap`.
      gathered: inside the context axis's `shard_map`, `(n, q, k_row, v_row, seg, pos, seg_row,
        pos_row, mask) -> out`, the local queries against the gathered row.
      apart: `(q, k, v, seg, pos, kv_seg, kv_pos, mask) -> out`, queries against keys with their
        own segment ids and positions on one device (`queries_apart`), or None: the split and
        merge of its `partial` (`split_merge.chunk_of_row`).
      installed: `() -> bool`, whether its package is installed here (an optional extra's
        kernel; `auto` passes over it when not); install: how to install it, for the refusal
        and `flash_note`.

    Its partial attention with the log-sum-exp (`partial`) is `split_merge.PARTIALS`' entry of its
    name (looked up at each call: the CPU tests put the flash kernel's in cuDNN's place).
    """

    name: str
    platforms: tuple[str, ...]
    lacks: tuple[str, ...]
    auto_ok: Callable[[str, Any, int], bool]
    keeps_segments: Callable[[], bool]
    queries_apart: bool
    one_device: Callable[..., jax.Array]
    gathered: Callable[..., jax.Array]
    ring: Callable[..., jax.Array] | None = None
    present: Callable[[str], bool] = lambda platform: True
    needs: str = ""
    auto_when: str = ""
    apart: Callable[..., jax.Array] | None = None
    installed: Callable[[], bool] = lambda: True
    install: str = ""

    @property
    def partial(self) -> split_merge.Partial | None:
        """Its `split_merge.Partial`, or None."""
        return split_merge.PARTIALS.get(self.name)

    def refuses(self, needs: Needs) -> str | None:
        """The phrase of the first of `needs` this kernel cannot meet, or None."""
        return next(
            (what for need, what in PHRASES if need in self.lacks and getattr(needs, need)), None
        )


def _xla_one(q, k, v, seg, pos, mask):
    return flash.flash_attention(q, k, v, seg, pos, seg, pos, **mask)


def _xla_gathered(n, q, k_row, v_row, seg, pos, seg_row, pos_row, mask):
    return flash.flash_attention(q, k_row, v_row, seg, pos, seg_row, pos_row, **mask)


def _cudnn_one(q, k, v, seg, pos, mask):
    """`fused.cudnn`; with sinks, chunks or values of another width than the keys, rows of one
    document take cuDNN's partial (`split_merge.whole_row`, with the window, or `chunked_rows`)
    and the sink epilogue; other rows, and chunks with a window, the flash kernel."""
    plain = mask["sinks"] is None and mask["chunk"] is None and v.shape[3] == k.shape[3]
    if plain:
        return fused.cudnn(q, k, v, seg, mask["window"], mask["scale"])
    if mask["window"] is not None and mask["chunk"] is not None:
        return _xla_one(q, k, v, seg, pos, mask)
    one, real = split_merge.one_document(seg, pos)
    options = dict(scale=mask["scale"], partial=CUDNN.partial, sinks=mask["sinks"])

    def split():
        if mask["chunk"] is not None:
            return split_merge.chunked_rows(q, k, v, real, mask["chunk"], **options)
        return split_merge.whole_row(q, k, v, real, window=mask["window"], **options)

    return jax.lax.cond(
        one, lambda: split().astype(q.dtype), lambda: _xla_one(q, k, v, seg, pos, mask)
    )


def _cudnn_gathered(n, q, k_row, v_row, seg, pos, seg_row, pos_row, mask):
    """Rows of one document: the split and merge of `split_merge.over_context` (sinks after the
    merge, a window on one call per chunk, chunked attention where `split_merge.chunks_fit`);
    else the flash kernel."""
    half, chunk = q.shape[1] // 2, mask["chunk"]
    if chunk is not None and (
        mask["window"] is not None or not split_merge.chunks_fit(half, chunk)
    ):
        return _xla_gathered(n, q, k_row, v_row, seg, pos, seg_row, pos_row, mask)
    one, real = split_merge.one_document(seg_row, pos_row)
    return jax.lax.cond(
        one,
        lambda: split_merge.over_context(
            q, k_row, v_row, real, n, scale=mask["scale"], partial=CUDNN.partial,
            sinks=mask["sinks"], window=mask["window"], chunk=chunk,
        ),
        lambda: _xla_gathered(n, q, k_row, v_row, seg, pos, seg_row, pos_row, mask),
    )  # fmt: skip


def _cudnn_ring(n, q, k, v, seg, pos, mask, flash_ring):
    """Rows of one document: the ring of cuDNN's partials (`ring_merge`, a sliding window by
    the block's kind, chunked attention where `split_merge.chunks_fit` the ring's chunks, the
    sinks after the last step); else, and chunks with a window, the flash kernel's ring."""
    window, chunk = mask["window"], mask["chunk"]
    if chunk is not None and (
        window is not None or not split_merge.chunks_fit(q.shape[1] // 2, chunk)
    ):
        return flash_ring(n, q, k, v, seg, pos, mask)
    one, real = ring_merge.one_document(n, seg, pos)
    return jax.lax.cond(
        one,
        lambda: ring_merge.ring(
            n, q, k, v, real, scale=mask["scale"], partial=CUDNN.partial, sinks=mask["sinks"],
            window=window, chunk=chunk,
        ),
        lambda: flash_ring(n, q, k, v, seg, pos, mask),
    )  # fmt: skip


def _cudnn_auto(platform: str, dtype, head_dim: int) -> bool:
    """cuDNN's flash attention: 16-bit, head width a multiple of 8 up to 128, or up to 256 on
    Hopper or newer (`fused.cudnn_head_width`)."""
    sixteen = jnp.dtype(dtype) in (jnp.bfloat16, jnp.float16)
    return sixteen and head_dim % 8 == 0 and head_dim <= fused.cudnn_head_width(platform)


def _tokamax_auto(platform: str, dtype, head_dim: int) -> bool:
    """tokamax's Mosaic GPU kernel: 16-bit, heads up to 256 wide (its shared memory at 256:
    231,464 of 232,448 bytes on Hopper, `pallas_mosaic_gpu_kernel_sm90`'s estimate)."""
    return jnp.dtype(dtype) in (jnp.bfloat16, jnp.float16) and head_dim <= 256


# Fastest first: `auto` takes the first that may run and can do what the layer needs.
CUDNN = Kernel(
    name="cudnn",
    platforms=("gpu",),
    # Sinks: the epilogue after the merge; values of another width: padded; windows and chunks
    # around its partials, on one device, over the gathered row and round the ring
    # (`split_merge`, `ring_merge`; the flash kernel for packed rows, chunks with a window, and
    # chunks of queries whose length does not fit the attention chunk).
    lacks=("softcap",),
    auto_ok=_cudnn_auto,
    # Through its packed layout on Hopper or newer only (`fused.cudnn_packs`); before that it
    # takes per-row sequence lengths, so each of its rows holds one window.
    keeps_segments=fused.cudnn_packs,
    queries_apart=True,
    one_device=_cudnn_one,
    gathered=_cudnn_gathered,
    ring=_cudnn_ring,
    present=lambda platform: fused.cudnn_present(platform),
    needs="an NVIDIA GPU with cuDNN",
    auto_when="16-bit params with heads a multiple of 8 up to 128 wide, 256 on Hopper or newer",
)
TOKAMAX = Kernel(
    name="tokamax",
    platforms=("gpu",),
    # Soft-caps, packed rows, windows and chunks as per-query key ranges; sinks after its
    # log-sum-exp; the ring by its partials merged by log-sum-exp (`tokamax_kernel`).
    lacks=(),
    auto_ok=_tokamax_auto,
    keeps_segments=lambda: True,
    queries_apart=True,
    one_device=tokamax_kernel.one_device,
    gathered=tokamax_kernel.gathered,
    ring=tokamax_kernel.ring,
    apart=tokamax_kernel.apart,
    present=tokamax_kernel.present,
    needs="an NVIDIA GPU",
    auto_when="16-bit params with heads up to 256 wide",
    installed=tokamax_kernel.installed,
    install=tokamax_kernel.INSTALL,
)
SPLASH = Kernel(
    name="splash",
    platforms=("tpu",),
    # Chunks by segment ids (one per run of a segment's chunk); the ring by its partials with
    # their log-sum-exp (`splash_cases`), every row and mask.
    lacks=(),
    auto_ok=lambda platform, dtype, head_dim: True,
    keeps_segments=lambda: True,
    queries_apart=False,
    one_device=splash_cases.one_device,
    gathered=splash_cases.gathered,
    ring=splash_cases.ring,
)
XLA = Kernel(
    name="xla",
    platforms=("cpu", "gpu", "tpu"),
    lacks=(),
    auto_ok=lambda platform, dtype, head_dim: True,
    keeps_segments=lambda: True,
    queries_apart=True,
    one_device=_xla_one,
    gathered=_xla_gathered,
)
KERNELS: dict[str, Kernel] = {k.name: k for k in (CUDNN, TOKAMAX, SPLASH, XLA)}
CHOICES = ("auto", *KERNELS)


def candidates(platform: str, dtype, head_dim: int | None) -> tuple[Kernel, ...]:
    """The kernels `auto` may pick on `platform` for params of `dtype` and heads of `head_dim`,
    fastest first (`xla` last, always); an optional extra's only where it is installed."""
    if head_dim is None:  # no attention layers: nothing to pick
        return (XLA,)
    return tuple(
        k
        for k in KERNELS.values()
        if platform in k.platforms and k.auto_ok(platform, dtype, head_dim) and k.installed()
    )


def pick(platform: str, dtype, head_dim: int | None, needs: Needs) -> Kernel:
    """`auto`'s kernel for a layer: the fastest of `candidates` that can do what it `needs`."""
    return next(k for k in candidates(platform, dtype, head_dim) if not k.refuses(needs))


def flash_note(platform: str, dtype, head_dim: int | None, slow: Mapping[str, Needs]) -> str | None:
    """One line on the kinds of layer (`slow`: their `Needs`, `layer_needs`' names) that run the
    flash kernel (`xla`) on `platform` though it has fused kernels: which kinds, and why each
    fused kernel is not theirs (its refusal, else its `auto_when` against the params' dtype and
    head width, else its package not installed, with the command that installs it); None where
    none do, where a fused kernel could have run them (`model.attention=xla` asked), and on CPU
    (where `xla` is the fast path)."""
    faster = [k for k in KERNELS.values() if platform in k.platforms and k is not XLA]
    reasons: dict[str, list[str]] = {}
    for kind, needs in slow.items():
        whys = [_why(k, platform, needs, dtype, head_dim) for k in faster]
        if whys and all(whys):
            reasons.setdefault(", and ".join(whys), []).append(kind)
    return (
        "; ".join(
            f"{'every layer runs' if kinds == ['attention'] else ', '.join(kinds) + ' layers run'} "
            f"the flash kernel (xla), slower: {why}"
            for why, kinds in reasons.items()
        )
        or None
    )


def _why(k: Kernel, platform: str, needs: Needs, dtype, head_dim: int | None) -> str | None:
    if k.refuses(needs):
        return f"{k.name} cannot {k.refuses(needs)}"
    if head_dim is not None and not k.auto_ok(platform, dtype, head_dim):
        return (
            f"{k.name} runs only {k.auto_when} (here {jnp.dtype(dtype).name}, heads of {head_dim})"
        )
    if not k.installed():
        return f"{k.name} is not installed ({k.install})"
    return None


def kernel(name: str) -> Kernel:
    """The record of a resolved implementation name.

    Raises:
      ValueError: an unknown name."""
    if name not in KERNELS:
        raise ValueError(f"unknown attention implementation {name!r}")
    return KERNELS[name]


def head_dim(description: Mapping[str, Any]) -> int | None:
    """The query/key heads' width of a model description: `head_dim`, else `embed_dim /
    num_heads`; None for a model without attention layers (neither key: Mamba2's)."""
    width = description.get("head_dim")
    if not width and description.get("num_heads"):
        width = description["embed_dim"] // description["num_heads"]
    return width or None


def layer_needs(description: Mapping[str, Any], **mesh) -> dict[str, Needs]:
    """The `Needs` of each kind of attention layer of a model description (`model.build`'s):
    `chunked` (the `chunk_layers` of `attn_chunk`), `sliding` (`sliding_layers`), `global`
    (the rest); one kind, `attention`, when no layer slides or chunks. `mesh`: `context`,
    `context_attention` as in `Needs`."""
    model = dict(
        softcap=bool(description.get("attn_softcap")),
        sinks=bool(description.get("attn_sinks")),
        mla=description.get("v_head_dim") not in (None, head_dim(description)),
        **mesh,
    )
    layers = int(description.get("num_layers") or 0)
    chunked = set(description.get("chunk_layers") or ())
    if description.get("attn_chunk") and not chunked:
        chunked = set(range(layers))  # a description that chunks without naming its layers
    sliding = (
        set(description.get("sliding_layers") or ()) if description.get("sliding_window") else set()
    )
    kinds: dict[str, Needs] = {}
    for i in range(layers) if (chunked or sliding) else ():
        kind = "chunked" if i in chunked else "sliding" if i in sliding else "global"
        kinds[kind] = Needs(chunk=i in chunked, window=i in sliding, **model)
    return kinds or {"attention": Needs(chunk=bool(description.get("attn_chunk")), **model)}
