"""`model.attention=tokamax` (`ppl_jax.models.layers.tokamax_kernel`) with tokamax's Triton kernel
interpreted on CPU, against the flash kernel (`xla`) in float32: soft-caps, windows, chunks,
sinks, values narrower than the keys, packed rows with padding, grouped-query heads; a chunk of
a long window's queries; the context axis gathered and round the ring (issue 38 item 4).
Collected only where tokamax is installed (tests/conftest.py `TOKAMAX_PATHS`: Python >= 3.12,
`pip install '.[gpu]'`).

What runs is tokamax's own Triton kernel (`pallas_triton.PallasTritonFlashAttention`, its
device check bypassed) under Pallas's HLO interpreter: JAX's `pallas_call` takes any true value
of its interpret-mode setting for `interpret=True`, which tokamax does not pass itself. tokamax's
Mosaic GPU kernel, the one a Hopper GPU runs, cannot be interpreted on CPU (its warpgroups
synchronise by inline PTX barriers, `mgpu_lib.bar_sync`, which JAX's GPU interpret mode
refuses, and with `inline_mgpu="ignore"` the kernel does not lower): it is compared with the
flash kernel on a GPU in tests/gpu/test_tokamax.py. Both are called the same way (the op's
arguments, the `Mask` of key ranges, the residuals)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from test_attention import packed_rows
from test_context import _on_mesh

from ppl_jax.models.layers import context as context_lib
from ppl_jax.models.layers import flash, tokamax_kernel
from ppl_jax.models.layers.attention import attend

ATOL = 1e-6  # float32 outputs of order 1
PACKED = [[40, 30, 26], [96], [50], [7, 60]]


@pytest.fixture(autouse=True)
def interpreted(monkeypatch):
    """tokamax's Triton kernel, interpreted on CPU, in place of the GPU's choice (`_op`)."""
    from jax._src import config as jax_config
    from tokamax._src.ops.attention import pallas_triton

    calls = []

    def op(dtype):
        calls.append(jnp.dtype(dtype).name)
        return pallas_triton.PallasTritonFlashAttention(bypass_device_check=True)

    monkeypatch.setattr(tokamax_kernel, "_op", op)
    mode = jax_config.pallas_tpu_interpret_mode_context_manager
    previous = mode.swap_local(True)
    yield calls
    mode.set_local(previous)


def _case(lengths=PACKED, t=96, dv=8, seed=0):
    rng = np.random.default_rng(seed)
    seg, pos = packed_rows(lengths, t)
    b = len(lengths)
    q = 2 * rng.standard_normal((b, t, 4, 8)).astype(np.float32)  # scores past the cap
    k = rng.standard_normal((b, t, 2, 8)).astype(np.float32)
    v = rng.standard_normal((b, t, 2, dv)).astype(np.float32)
    sinks = rng.standard_normal(4).astype(np.float32)
    return q, k, v, seg, pos, sinks


def _mask(mask, sinks):
    return dict(mask, sinks=jnp.asarray(sinks)) if mask.get("sinks") else mask


def _compare(got, expected, seg):
    real = seg > 0
    np.testing.assert_allclose(got[real], expected[real], atol=ATOL, rtol=0)
    assert np.all(got[~real] == 0)


# The interpreted kernel takes 5 to 10 s a case on 2 cores: one case in the default tier.
MASKS = [
    {"softcap": 2.0, "window": 20},  # Gemma 2's sliding layers
    pytest.param({"softcap": 2.0}, marks=pytest.mark.slow),  # and its global ones
    pytest.param({"chunk": 16, "sinks": True}, marks=pytest.mark.slow),
    pytest.param({"window": 9, "chunk": 7, "softcap": 50.0}, marks=pytest.mark.slow),
    pytest.param({}, marks=pytest.mark.slow),
]


@pytest.mark.parametrize("mask", MASKS, ids=str)
def test_tokamax_equals_xla_on_one_device(interpreted, mask):
    """Packed rows with padding, four query heads on two key/value heads, values narrower than
    the keys (6 of 8)."""
    q, k, v, seg, pos, sinks = _case(dv=6)
    kw = dict(segment_ids=seg, positions=pos, **_mask(mask, sinks))
    expected = np.asarray(attend(q, k, v, **kw))
    fn = jax.jit(lambda q, k, v: attend(q, k, v, implementation="tokamax", **kw))
    _compare(np.asarray(fn(q, k, v)), expected, seg)
    assert interpreted == ["float32"]  # tokamax ran, once
    if mask.get("softcap") == 2.0:  # the cap bites
        uncapped = np.asarray(attend(q, k, v, **dict(kw, softcap=None)))
        assert np.abs(uncapped - expected)[seg > 0].max() > 0.1


@pytest.mark.slow
def test_its_log_sum_exp_is_the_flash_kernels():
    """`attention_lse` of a chunk of queries (32 to 63 of the row) against every key, a window
    and a soft-cap: outputs and log-sum-exp as `flash.attention_lse`'s, 0 and `-inf` where a
    query sees no key."""
    q, k, v, seg, pos, _ = _case()
    options = dict(window=20, chunk=None, scale=8**-0.5, softcap=2.0)
    rows = (seg[:, 32:64], pos[:, 32:64], seg, pos)
    got = jax.jit(lambda q: tokamax_kernel.attention_lse(q, k, v, *rows, **options))(q[:, 32:64])
    expected = flash.attention_lse(q[:, 32:64], k, v, *rows, **options)
    real = seg[:, 32:64] > 0
    for g, e in zip(got, expected, strict=True):
        np.testing.assert_allclose(np.asarray(g)[real], np.asarray(e)[real], atol=ATOL, rtol=0)
    assert np.all(np.isneginf(np.asarray(got[1])[~real]))
    assert np.all(np.asarray(got[0])[~real] == 0)


@pytest.mark.slow
def test_a_long_windows_chunks_of_queries_take_one_call_each():
    """`model.token_chunk`: each chunk of 32 queries against the row's keys (`Kernel.apart`),
    packed rows, a window and a soft-cap."""
    q, k, v, seg, pos, _ = _case()
    kw = dict(segment_ids=seg, positions=pos, softcap=2.0, window=20)
    expected = np.asarray(attend(q, k, v, **kw))
    got = [
        attend(
            q[:, i : i + 32], k, v, segment_ids=seg[:, i : i + 32], positions=pos[:, i : i + 32],
            kv_segment_ids=seg, kv_positions=pos, softcap=2.0, window=20,
            implementation="tokamax",
        )
        for i in range(0, 96, 32)
    ]  # fmt: skip
    _compare(np.concatenate(got, axis=1), expected, seg)


CONTEXT_CASES = [
    pytest.param(2, "ring", {"softcap": 2.0, "window": 30}, marks=pytest.mark.slow),
    pytest.param(
        2, "all_gather", {"softcap": 2.0, "window": 30, "sinks": True}, marks=pytest.mark.slow
    ),
    pytest.param(4, "ring", {"chunk": 12, "window": 20, "sinks": True}, marks=pytest.mark.slow),
    pytest.param(4, "all_gather", {"chunk": 16, "softcap": 2.0}, marks=pytest.mark.slow),
]


@pytest.mark.parametrize("context,how,mask", CONTEXT_CASES, ids=str)
def test_tokamax_over_context_equals_xla(interpreted, context, how, mask):
    """In the load-balanced order over `context` devices: the gathered row in one call per
    device, or the ring, one call per step merged by log-sum-exp (the sinks once at the end)."""
    q, k, v, seg, pos, sinks = _case(dv=6)
    mask = _mask(mask, sinks)
    expected = np.asarray(attend(q, k, v, segment_ids=seg, positions=pos, **mask))
    order = context_lib.load_balanced_order(96, context)

    def fn(q, k, v, seg, pos):
        with context_lib.settings(context_lib.Settings(how)):
            return attend(q, k, v, segment_ids=seg, positions=pos, implementation="tokamax", **mask)

    out = _on_mesh(8 // context, context, fn, *(x[:, order] for x in (q, k, v, seg, pos)))
    _compare(out, expected[:, order], seg[:, order])
    assert len(interpreted) == (2 if how == "ring" else 1)  # the loop's step and the last
