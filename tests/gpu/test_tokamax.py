"""On an NVIDIA GPU with tokamax installed: `model.attention=tokamax` (tokamax's Mosaic GPU kernel
on Hopper or newer, its Triton kernel elsewhere) against the XLA path, Gemma 2's soft-capped
attention with and without its sliding window, packed rows, and what the kernel carries besides.
Collected only when PPL_JAX_GPU_TESTS=1 and tokamax is installed (tests/conftest.py):

    pip install 'jax[cuda13]' '.[gpu,test]'   # Python >= 3.12
    PPL_JAX_GPU_TESTS=1 python -m pytest -n 0 tests/gpu/test_tokamax.py

Both paths run in bfloat16 against a float32 reference of the XLA path at `highest`; tokamax must
be as close to it as XLA's own bfloat16 result is (its Mosaic kernel computes `exp` and `tanh`
approximately). The same calls with tokamax's Triton kernel interpreted on CPU, within 1e-6 in
float32: tests/unit/models/test_tokamax_kernel.py."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from test_attention import packed_rows

from ppl_jax.models.layers import kernels, tokamax_kernel
from ppl_jax.models.layers.attention import attend, flash_note, resolve
from ppl_jax.scoring import precision


@pytest.fixture(autouse=True, scope="module")
def _on_gpu():
    assert jax.default_backend() == "gpu", f"PPL_JAX_GPU_TESTS=1 on {jax.default_backend()}"


def _compare(mask, heads=8, kv_heads=4, head_dim=256, value_dim=None, lengths=None, t=1024):
    lengths = lengths or [[1024], [300, 500, 100], [1], []]
    seg, pos = (jnp.asarray(x) for x in packed_rows(lengths, t))
    rng = np.random.default_rng(0)
    shapes = [(heads, head_dim), (kv_heads, head_dim), (kv_heads, value_dim or head_dim)]
    q, k, v = (rng.standard_normal((len(lengths), t, h, d)).astype(np.float32) for h, d in shapes)
    q *= 3.0  # scores of order 10 past Gemma 2's cap of 50 / sqrt(256): the cap bites
    args = dict(segment_ids=seg, positions=pos, **mask)
    with precision.applied("highest"):
        ref = np.asarray(attend(*map(jnp.asarray, (q, k, v)), **args))
    out = {}
    for impl in ("xla", "tokamax"):
        fn = jax.jit(lambda q, k, v, impl=impl: attend(q, k, v, implementation=impl, **args))
        qb, kb, vb = (jnp.asarray(x, jnp.bfloat16) for x in (q, k, v))
        out[impl] = np.asarray(fn(qb, kb, vb).astype(jnp.float32))
    real = np.asarray(seg) != 0
    err = {impl: np.abs(o[real] - ref[real]).max() for impl, o in out.items()}
    assert np.isfinite(out["tokamax"]).all() and np.all(out["tokamax"][~real] == 0)
    assert err["tokamax"] <= max(2 * err["xla"], 2e-2), err
    return err


@pytest.fixture(params=["chosen", "triton"])
def kernel(request, monkeypatch):
    """The kernel `tokamax_kernel._op` chooses for this GPU, and tokamax's Triton kernel (what
    GPUs before Hopper run)."""
    if request.param == "triton":
        from tokamax._src.ops.attention import pallas_triton

        triton = pallas_triton.PallasTritonFlashAttention()
        monkeypatch.setattr(tokamax_kernel, "_op", lambda dtype: triton)
    return request.param


@pytest.mark.parametrize("head_dim", [256, 128])  # Gemma 2 2B and 9B; 27B
@pytest.mark.parametrize("window", [4096, 128, None])
def test_gemma2_soft_capped_attention_matches_xla(kernel, head_dim, window):
    """Gemma 2's layers: `attn_logit_softcapping` 50, the sliding layers' window (4,096 in the
    release: the whole row here; 128: a band), the global layers without; packed rows, a row of
    one token and one of padding only."""
    mask = dict(softcap=50.0, scale=head_dim**-0.5, window=window)
    _compare(mask, head_dim=head_dim)


def test_float32_at_highest_is_float32():
    """An explicit `tokamax` for float32 params (its Triton kernel) at the step's `highest`:
    within 1e-5 of the flash kernel's float32."""
    seg, pos = (jnp.asarray(x) for x in packed_rows([[512], [200, 300]], 512))
    rng = np.random.default_rng(0)
    q, k, v = (jnp.asarray(rng.standard_normal((2, 512, h, 128)), jnp.float32) for h in (8, 2, 2))
    args = dict(segment_ids=seg, positions=pos, softcap=50.0, window=128)
    with precision.applied("highest"):
        ref = np.asarray(jax.jit(lambda q, k, v: attend(q, k, v, **args))(q, k, v))
        fn = jax.jit(lambda q, k, v: attend(q, k, v, implementation="tokamax", **args))
        got = np.asarray(fn(q, k, v))
    np.testing.assert_allclose(got, ref, atol=1e-5, rtol=0)


@pytest.mark.parametrize(
    "mask,value_dim", [({"chunk": 256}, None), ({"sinks": True, "window": 128}, None), ({}, 128)]
)  # fmt: skip
def test_what_tokamax_carries_besides_the_soft_cap(mask, value_dim):
    """Chunks as key ranges, sinks after its log-sum-exp, values narrower than the keys."""
    if mask.get("sinks"):
        mask = dict(mask, sinks=jnp.asarray(np.random.default_rng(1).standard_normal(8)))
    _compare(mask, value_dim=value_dim)


def test_tokamax_is_picked_for_soft_caps_on_this_gpu():
    """`auto` on this GPU: tokamax for 16-bit soft-capped layers, cuDNN for the rest; a Gemma 2
    run's summary carries no note; Mosaic GPU on Hopper and newer."""
    assert kernels.KERNELS["tokamax"].present("gpu")
    assert resolve("auto", jnp.bfloat16, 256, platform="gpu", softcap=True) == "tokamax"
    assert resolve("auto", jnp.bfloat16, 128, platform="gpu") == "cudnn"
    description = {"num_layers": 2, "embed_dim": 512, "num_heads": 2, "attn_softcap": 50.0}
    assert flash_note("auto", jnp.bfloat16, description, platform="gpu") is None
    major = int(str(jax.devices()[0].compute_capability).split(".")[0])
    name = type(tokamax_kernel._op(jnp.bfloat16)).__name__
    assert name == ("PallasMosaicGpuFlashAttention" if major >= 9 else "PallasTritonFlashAttention")
