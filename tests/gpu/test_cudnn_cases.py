"""On an NVIDIA GPU: the cases cuDNN carries as a transformation around its partial attention
(`ppl_jax.models.layers.split_merge`: learned sinks added after the merge, values narrower than
the keys padded, chunked attention as the row reshaped into its chunks) against the XLA path, as tests/gpu/test_cudnn.py compares the plain path:

    PPL_JAX_GPU_TESTS=1 python -m pytest -n 0 tests/gpu/test_cudnn_cases.py

The ring's band (`ring_merge.band`: a causal call with cuDNN's window whose queries' block is
longer than its keys') on one device; the ring itself needs several devices. bfloat16
inputs against the float32 flash kernel at `highest`; cuDNN must be as close to it as
XLA's own bfloat16 result is. The same transformations with the flash partial standing in for
cuDNN: tests/unit/models/test_cudnn_cases.py."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ppl_jax.models.layers import flash, ring_merge, split_merge
from ppl_jax.models.layers.attention import attend
from ppl_jax.scoring import precision


@pytest.fixture(autouse=True, scope="module")
def _on_gpu():
    assert jax.default_backend() == "gpu", f"PPL_JAX_GPU_TESTS=1 on {jax.default_backend()}"


def _rows(lengths, t):
    seg = (np.arange(t)[None, :] < np.asarray(lengths)[:, None]).astype(np.int32)
    pos = np.broadcast_to(np.arange(t, dtype=np.int32), seg.shape)
    return jnp.asarray(seg), jnp.asarray(pos)


def _inputs(lengths, t, head_dim, value_dim):
    rng = np.random.default_rng(2)
    q = rng.standard_normal((len(lengths), t, 8, head_dim)).astype(np.float32)
    k = rng.standard_normal((len(lengths), t, 2, head_dim)).astype(np.float32)
    v = rng.standard_normal((len(lengths), t, 2, value_dim)).astype(np.float32)
    return q, k, v, jnp.asarray(rng.standard_normal(8), jnp.float32)


@pytest.mark.parametrize(
    "sinks,value_dim,window,chunk",
    [(True, 64, None, None), (False, 32, None, None), (True, 32, None, None),
     (True, 64, 128, None), (False, 64, None, 128), (True, 32, None, 200)],
)  # fmt: skip
def test_attend_cudnn_carries_what_its_kernel_lacks(sinks, value_dim, window, chunk):
    """On one device, rows of one document: GPT-OSS's sinks (with its window of 128),
    DeepSeek's narrower values, Llama 4's chunks (the rows reshaped into them, 512 a multiple of
    128 or not of 200)."""
    t, lengths = 512, [512, 300, 1, 0]
    seg, pos = _rows(lengths, t)
    q, k, v, s = _inputs(lengths, t, 64, value_dim)
    s = s if sinks else None
    args = dict(segment_ids=seg, positions=pos, sinks=s, window=window, chunk=chunk)
    with precision.applied("highest"):
        ref = np.asarray(attend(*map(jnp.asarray, (q, k, v)), **args))
    out = {}
    for impl in ("xla", "cudnn"):
        fn = jax.jit(lambda q, k, v, impl=impl: attend(q, k, v, implementation=impl, **args))
        qb, kb, vb = (jnp.asarray(x, jnp.bfloat16) for x in (q, k, v))
        out[impl] = np.asarray(fn(qb, kb, vb).astype(jnp.float32))
    real = np.asarray(seg) != 0
    err = {impl: np.abs(o[real] - ref[real]).max() for impl, o in out.items()}
    assert np.isfinite(out["cudnn"][real]).all()
    assert err["cudnn"] <= max(2 * err["xla"], 2e-2), err


@pytest.mark.parametrize("window", [None, 128, 300])
@pytest.mark.parametrize("start", [0, 256])
def test_a_chunk_with_sinks_and_narrow_values_matches_xla(start, window):
    """A chunk of 128 queries: cuDNN's diagonal and prefix (values padded), merged, then the
    sink epilogue; with a window, one causal call with cuDNN's window over the chunk and the
    `window - 1` keys before it; against the flash partial doing the same and the whole row in
    float32."""
    t, lengths = 1024, [1024, 700, 0]
    seg, pos = _rows(lengths, t)
    q, k, v, s = _inputs(lengths, t, 64, 32)
    ref = np.asarray(
        attend(*map(jnp.asarray, (q, k, v)), segment_ids=seg, positions=pos, sinks=s, window=window)
    )
    real = jnp.asarray(lengths, jnp.int32)
    out = {}
    for name in ("xla", "cudnn"):
        fn = jax.jit(
            lambda q, k, v, name=name: split_merge.chunk_of_row(
                q,
                k,
                v,
                start,
                real,
                scale=64**-0.5,
                partial=split_merge.PARTIALS[name],
                sinks=s,
                window=window,
            )
        )
        qb, kb, vb = (jnp.asarray(x, jnp.bfloat16) for x in (q[:, start : start + 128], k, v))
        out[name] = np.asarray(fn(qb, kb, vb).astype(jnp.float32))
    scored = np.asarray(seg)[:, start : start + 128] != 0
    err = {n: np.abs(o[scored] - ref[:, start : start + 128][scored]).max() for n, o in out.items()}
    assert np.isfinite(out["cudnn"][scored]).all()
    assert err["cudnn"] <= max(2 * err["xla"], 2e-2), err


@pytest.mark.parametrize("chunk", [64, 512])
@pytest.mark.parametrize("start", [0, 384])
def test_a_chunk_with_chunked_attention_matches_xla(start, chunk):
    """128 queries at `start` with chunked attention: holding whole chunks of 64 (reshaped) or
    inside one of 512 (the prefix from its first key), cuDNN's partials against the flash
    partial's and the whole row in float32."""
    t, lengths = 1024, [1024, 700, 0]
    seg, pos = _rows(lengths, t)
    q, k, v, s = _inputs(lengths, t, 64, 64)
    ref = np.asarray(
        attend(*map(jnp.asarray, (q, k, v)), segment_ids=seg, positions=pos, sinks=s, chunk=chunk)
    )
    real = jnp.asarray(lengths, jnp.int32)
    out = {}
    for name in ("xla", "cudnn"):
        fn = jax.jit(
            lambda q, k, v, name=name: split_merge.chunk_of_row(
                q,
                k,
                v,
                start,
                real,
                scale=64**-0.5,
                partial=split_merge.PARTIALS[name],
                sinks=s,
                chunk=chunk,
            )
        )
        qb, kb, vb = (jnp.asarray(x, jnp.bfloat16) for x in (q[:, start : start + 128], k, v))
        out[name] = np.asarray(fn(qb, kb, vb).astype(jnp.float32))
    scored = np.asarray(seg)[:, start : start + 128] != 0
    err = {n: np.abs(o[scored] - ref[:, start : start + 128][scored]).max() for n, o in out.items()}
    assert np.isfinite(out["cudnn"][scored]).all()
    assert err["cudnn"] <= max(2 * err["xla"], 2e-2), err


@pytest.mark.parametrize("window,back", [(200, 1), (200, 2), (300, 2)])
def test_the_rings_band_matches_xla(window, back):
    """The ring's band (`ring_merge.band`): 128 queries at 384 against the chunk of 128 keys
    `back` chunks before them, under a window that reaches into it, as one causal call with
    cuDNN's window, the queries placed after the keys (its rows' lengths differ: the queries'
    block is longer than the keys'); against the flash partial's and the mask by positions in
    float32."""
    t, lengths, length, first = 512, [512, 450, 0], 128, 384
    seg, pos = _rows(lengths, t)
    q, k, v, _ = _inputs(lengths, t, 64, 64)
    start = first - back * length
    keys = slice(start, start + length)
    rows = slice(first, first + length)
    with precision.applied("highest"):
        ref, ref_lse = flash.attention_lse(
            *map(jnp.asarray, (q[:, rows], k[:, keys], v[:, keys])), seg[:, rows], pos[:, rows],
            seg[:, keys], pos[:, keys], window=window, chunk=None, scale=64**-0.5, softcap=None,
        )  # fmt: skip
    bands, branch = ring_merge.kinds(2, length, window)
    width = bands[branch[back + 3] - 3]  # delta = back, index delta + 2n - 1
    real = jnp.asarray(lengths, jnp.int32)
    q_len = jnp.clip(real - first, 0, length)
    kv_len = jnp.clip(real - start, 0, length)
    out = {}
    for name in ("xla", "cudnn"):
        fn = jax.jit(
            lambda q, k, v, name=name: ring_merge.band(
                q, k, v, q_len, kv_len, width, scale=64**-0.5, partial=split_merge.PARTIALS[name]
            )
        )
        qb, kb, vb = (jnp.asarray(x, jnp.bfloat16) for x in (q[:, rows], k[:, keys], v[:, keys]))
        out[name], lse = (np.asarray(x) for x in fn(qb, kb, vb))
        np.testing.assert_array_equal(np.isneginf(lse), np.isneginf(np.asarray(ref_lse)))
    scored = np.asarray(seg)[:, rows] != 0
    err = {n: np.abs(o[scored] - np.asarray(ref)[scored]).max() for n, o in out.items()}
    assert np.isfinite(out["cudnn"][scored]).all()
    assert err["cudnn"] <= max(2 * err["xla"], 2e-2), err
