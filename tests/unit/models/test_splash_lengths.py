"""Splash attention (interpreted on CPU) at rows whose length is not a multiple of its 128-token
blocks: `fused.splash` pads queries and keys inside the call and slices the output, so it gives
the flash kernel's (`xla`'s) numbers at any window length (issue 38 item 3)."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from test_attention import packed_rows

from ppl_jax.models import registry
from ppl_jax.models.layers import fused
from ppl_jax.models.layers.attention import attend
from ppl_jax.scoring.nll import token_nll

import helpers

# float32 outputs of order 1; the two kernels sum in other orders.
ATOL = 1e-6


def _inputs(lengths, t, heads=4, kv_heads=2, dim=8, seed=0):
    rng = np.random.default_rng(seed)
    seg, pos = (jnp.asarray(x) for x in packed_rows(lengths, t))
    q = jnp.asarray(rng.standard_normal((len(lengths), t, heads, dim)), jnp.float32)
    k, v = (
        jnp.asarray(rng.standard_normal((len(lengths), t, kv_heads, dim)), jnp.float32)
        for _ in range(2)
    )
    sinks = jnp.asarray(rng.standard_normal(heads), jnp.float32)
    return q, k, v, seg, pos, sinks


@pytest.mark.parametrize(
    "t,lengths,mask",
    [
        # Packed segments then the row's padding; causal, with and without sinks.
        (96, [[40, 30, 20], [96]], {}),
        # Across a block boundary: a sliding window and a soft-cap.
        (200, [[130, 50], [7, 150]], {"window": 33, "softcap": 5.0}),
    ],
)
def test_splash_at_lengths_off_the_block_equals_xla(t, lengths, mask):
    q, k, v, seg, pos, sinks = _inputs(lengths, t)
    real = np.asarray(seg) != 0
    for extra in ({}, {"sinks": sinks}):
        kw = dict(segment_ids=seg, positions=pos, **mask, **extra)
        xla = attend(q, k, v, **kw)
        splash = attend(q, k, v, implementation="splash", **kw)
        assert splash.shape == xla.shape
        np.testing.assert_allclose(np.asarray(splash)[real], np.asarray(xla)[real], atol=ATOL)


@pytest.mark.slow
def test_splash_chunks_of_a_row_off_the_block():
    """Queries `offset ..` of a 200-token row in chunks of 50 (a context axis of 2), a traced
    offset choosing the kernel: both the chunk (50) and the row (200) are padded."""
    q, k, v, seg, pos, _ = _inputs([[120, 80]], 200, heads=2, kv_heads=1)
    whole = np.asarray(attend(q, k, v, segment_ids=seg, positions=pos, window=60))
    fn = jax.jit(
        lambda q, q_seg, off: fused.splash(
            q, k, v, q_seg, seg, window=60, sinks=None, scale=8**-0.5, softcap=None, offset=off
        )
    )
    for start in (0, 150):
        part = fn(q[:, start : start + 50], seg[:, start : start + 50], jnp.int32(start))
        np.testing.assert_allclose(np.asarray(part), whole[:, start : start + 50], atol=ATOL)


@pytest.mark.slow
def test_model_with_splash_scores_a_96_token_window_like_xla():
    """`model.attention=splash` with `eval.seq_len=96`: the model runs (before: "bkv_compute=96
    must be a multiple of 128") and scores as `xla` does."""
    cfg = dataclasses.replace(helpers.TINY, max_positions=128)
    params = helpers.random_params(cfg, seed=2)
    tokens = jnp.asarray(np.random.default_rng(3).integers(0, 256, (1, 97)), jnp.int32)
    pos = jnp.arange(96, dtype=jnp.int32)[None]
    seg = jnp.ones((1, 96), jnp.int32)
    nll = {}
    for impl in ("xla", "splash"):
        model = registry.build(cfg.to_dict(), jnp.float32, impl)
        nll[impl] = np.asarray(
            token_nll(model.apply(params, tokens[:, :-1], pos, seg), tokens[:, 1:])
        )
    np.testing.assert_allclose(nll["splash"], nll["xla"], rtol=1e-5, atol=1e-5)


@pytest.mark.slow
def test_splash_over_context_at_a_length_off_the_block():
    """`eval.seq_len=200` under `mesh.context=2`: each device's chunks of 50 queries against the
    gathered row of 200 keys, both padded."""
    from test_context import _on_mesh

    from ppl_jax.models.layers import context as context_lib

    q, k, v, seg, pos, sinks = _inputs([[120, 80], [200], [50], [10, 150]], 200)
    kw = {"window": 60, "sinks": sinks}
    whole = np.asarray(attend(q, k, v, segment_ids=seg, positions=pos, **kw))
    order = context_lib.load_balanced_order(200, 2)

    def fn(q, k, v, seg, pos):
        return attend(q, k, v, segment_ids=seg, positions=pos, implementation="splash", **kw)

    out = _on_mesh(4, 2, fn, *(x[:, order] for x in (q, k, v, seg, pos)))
    real = np.asarray(seg)[:, order] > 0
    np.testing.assert_allclose(out[real], whole[:, order][real], atol=ATOL)
