"""On an NVIDIA GPU: cuDNN attention with packed rows (sequence packing, `q_offsets`, Hopper or
newer) and the flash `xla` path. Collected only when PPL_JAX_GPU_TESTS=1 (tests/conftest.py):

    PPL_JAX_GPU_TESTS=1 python -m pytest -n 0 tests/gpu

The trap these guard against is MaxText issue 4476: a cuDNN call with a causal mask but without
the segments' offsets lets every document of a packed row attend to the documents before it,
with no error. Here two packed documents must never see each other: changing the first one's
keys and values leaves the second's outputs bit for bit unchanged, and cuDNN agrees with the
flash `xla` path (itself tested against NumPy float64 on CPU) to bfloat16 rounding. The float32
comparisons run at `highest`, as a float32 run does (`ppl_jax.scoring.precision`): JAX's default
on the GPU is TF32, 3.6e-4 to 9.3e-4 off."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from test_attention import packed_rows, reference

from ppl_jax.models.layers import fused
from ppl_jax.models.layers.attention import attend, keeps_segments
from ppl_jax.scoring import precision


@pytest.fixture(autouse=True, scope="module")
def _on_gpu():
    assert jax.default_backend() == "gpu", f"PPL_JAX_GPU_TESTS=1 on {jax.default_backend()}"


def _hopper() -> bool:
    return fused.cudnn_packs()


def _qkv(rows, t, heads=8, kv_heads=2, head_dim=64, seed=0):
    rng = np.random.default_rng(seed)
    q, k, v = (
        jnp.asarray(rng.standard_normal((rows, t, h, head_dim)), jnp.bfloat16)
        for h in (heads, kv_heads, kv_heads)
    )
    return q, k, v


@pytest.mark.parametrize("window", [None, 100])
def test_packed_documents_never_see_each_other(window):
    """Rows of 3, 2 and 1 documents and padding (lengths of the scorer's packing)."""
    if not _hopper():
        pytest.fail(
            "cuDNN sequence packing needs a Hopper GPU; this GPU lays out one window per row"
        )
    t = 512
    seg, pos = packed_rows([[170, 170, 172], [150, 190], [400], [0]], t)
    seg, pos = jnp.asarray(seg), jnp.asarray(pos)
    q, k, v = _qkv(4, t)
    kw = dict(segment_ids=seg, positions=pos, window=window)
    fn = jax.jit(lambda q, k, v: attend(q, k, v, implementation="cudnn", **kw))
    out = np.asarray(fn(q, k, v).astype(jnp.float32))
    # The first document of rows 0 and 1 changed: the later documents' outputs do not move.
    k2 = k.at[:2, :150].set(3.0)
    v2 = v.at[:2, :150].set(-5.0)
    out2 = np.asarray(fn(q, k2, v2).astype(jnp.float32))
    np.testing.assert_array_equal(out2[0, 170:512], out[0, 170:512])
    np.testing.assert_array_equal(out2[1, 150:340], out[1, 150:340])
    assert np.abs(out2[0, :150] - out[0, :150]).max() > 0.1  # the check can fail
    # And the values are the mask's: flash xla in float32, NumPy float64.
    q32, k32, v32 = (x.astype(jnp.float32) for x in (q, k, v))
    with precision.applied("highest"):
        xla = np.asarray(attend(q32, k32, v32, **kw))
    ref = reference(q32, k32, v32, seg, pos, window=window)
    real = np.asarray(seg) > 0
    np.testing.assert_allclose(xla[real], ref[real], atol=1e-5)
    assert np.abs(out[real] - ref[real]).max() < 2e-2


def test_unpacked_batches_keep_the_lengths_path():
    """Rows of one document and padding (what the scorer lays out without packing, and a filler
    row of padding alone) give cuDNN's per-row-lengths numbers, finite."""
    t = 256
    seg, pos = packed_rows([[256], [200], [77], [1], []], t)
    seg, pos = jnp.asarray(seg), jnp.asarray(pos)
    q, k, v = _qkv(5, t, head_dim=128)
    out = np.asarray(
        attend(q, k, v, segment_ids=seg, positions=pos, implementation="cudnn").astype(jnp.float32)
    )
    real = np.asarray(seg) > 0
    assert np.isfinite(out[real]).all()
    q32, k32, v32 = (x.astype(jnp.float32) for x in (q, k, v))
    ref = reference(q32, k32, v32, seg, pos)
    assert np.abs(out[real] - ref[real]).max() < 2e-2


def test_packing_follows_the_gpu():
    """The layout packs windows for cuDNN exactly where cuDNN can keep them apart."""
    assert keeps_segments("cudnn") == _hopper()
    assert keeps_segments("xla")


@pytest.mark.parametrize("mask", [{}, {"window": 64, "chunk": 96}, {"softcap": 5.0}])
def test_flash_on_gpu_equals_float64(mask):
    """The flash `xla` path on the GPU (blocks of 512) against the NumPy float64 mask."""
    t = 700
    seg, pos = packed_rows([[300, 400], [700]], t)
    rng = np.random.default_rng(1)
    q = rng.standard_normal((2, t, 4, 32)).astype(np.float32)
    k = rng.standard_normal((2, t, 2, 32)).astype(np.float32)
    v = rng.standard_normal((2, t, 2, 16)).astype(np.float32)
    sinks = rng.standard_normal(4).astype(np.float32)
    with precision.applied("highest"):
        out = np.asarray(
            attend(q, k, v, segment_ids=seg, positions=pos, sinks=jnp.asarray(sinks), **mask)
        )
    ref = reference(q, k, v, seg, pos, sinks=sinks, **mask)
    real = seg > 0
    np.testing.assert_allclose(out[real], ref[real], atol=2e-5)


def test_a_long_window_fits_linearly():
    """A 131,072-token window of 8 heads: the step's temporaries stay far below one [T, T]
    score matrix (68 GB in float32)."""
    t = 131_072
    q = jax.ShapeDtypeStruct((1, t, 8, 64), jnp.bfloat16)
    ids = jax.ShapeDtypeStruct((1, t), jnp.int32)
    fn = jax.jit(lambda q, k, v, s, p: attend(q, k, v, segment_ids=s, positions=p))
    memory = fn.lower(q, q, q, ids, ids).compile().memory_analysis()
    assert memory.temp_size_in_bytes < 4 * t * t / 100
