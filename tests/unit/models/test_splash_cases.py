"""Splash attention (interpreted on CPU) in the cases of `ppl_jax.models.layers.splash_cases`,
against the flash kernel (`xla`) over the whole row on one device: its partial attention with
the log-sum-exp (`fused.splash(lse=True)`), chunked attention by segment ids (packed rows,
windows, sinks, soft-caps), and the ring over `mesh.context` by its partials merged by
log-sum-exp (issue 38 item 3)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from test_attention import packed_rows
from test_context import _on_mesh

from ppl_jax.models.layers import context as context_lib
from ppl_jax.models.layers import flash, fused, splash_cases
from ppl_jax.models.layers.attention import attend

SCALE = 8**-0.5
ATOL = 2e-6  # float32 outputs of order 1; the kernels sum in other orders
PACKED = [[40, 30, 26], [96], [50], [7, 60]]


def _case(lengths=PACKED, t=96, dv=8, seed=0):
    rng = np.random.default_rng(seed)
    seg, pos = packed_rows(lengths, t)
    b = len(lengths)
    q = rng.standard_normal((b, t, 4, 8)).astype(np.float32)
    k = rng.standard_normal((b, t, 2, 8)).astype(np.float32)
    v = rng.standard_normal((b, t, 2, dv)).astype(np.float32)
    sinks = rng.standard_normal(4).astype(np.float32)
    return q, k, v, seg, pos, sinks


def _mask(mask, sinks):
    return dict(mask, sinks=jnp.asarray(sinks)) if mask.get("sinks") else mask


def test_chunk_ids_are_runs_of_a_segments_chunk():
    seg, pos = packed_rows([[5, 6], [3]], 12)
    ids = np.asarray(splash_cases.chunk_ids(jnp.asarray(seg), jnp.asarray(pos), 4))
    # Row 0: positions 0..4 then 0..5, padding; row 1: 0..2, padding.
    assert ids[0].tolist() == [1, 1, 1, 1, 2, 3, 3, 3, 3, 4, 4, 0]
    assert ids[1].tolist() == [1, 1, 1] + [0] * 9
    np.testing.assert_array_equal(splash_cases.chunk_ids(jnp.asarray(seg), pos, None), seg)


def test_splash_partial_with_its_log_sum_exp():
    """`fused.splash(lse=True)` against `flash.attention_lse` (queries at an offset of 32 in
    the row, a window): the outputs and the log-sum-exp of every query that saw a key; a
    query that saw none (padding, given a segment id no key has) 0 and `-inf`."""
    q, k, v, seg, pos, _ = _case(dv=6)
    q_seg = jnp.asarray(np.where(seg > 0, seg, 99))
    got_out, got_lse = jax.jit(
        lambda q, k, v: fused.splash(
            q[:, 32:64], k, v, q_seg[:, 32:64], jnp.asarray(seg), window=20,
            sinks=None, scale=SCALE, softcap=None, offset=32, lse=True,
        )
    )(q, k, v)  # fmt: skip
    out, lse = flash.attention_lse(
        q[:, 32:64], k, v, seg[:, 32:64], pos[:, 32:64], seg, pos, window=20, chunk=None,
        scale=SCALE, softcap=None,
    )  # fmt: skip
    real = seg[:, 32:64] > 0
    np.testing.assert_allclose(np.asarray(got_out)[real], np.asarray(out)[real], atol=ATOL)
    np.testing.assert_allclose(np.asarray(got_lse)[real], np.asarray(lse)[real], atol=ATOL)
    assert np.all(np.isneginf(np.asarray(got_lse)[~real]))
    assert np.all(np.asarray(got_out)[~real] == 0)


CHUNK_MASKS = [
    pytest.param({"chunk": 16}, marks=pytest.mark.slow),
    {"chunk": 24, "window": 10, "sinks": True},
    pytest.param({"chunk": 7, "softcap": 2.0, "sinks": True}, marks=pytest.mark.slow),
]


@pytest.mark.parametrize("mask", CHUNK_MASKS, ids=str)
def test_splash_chunked_attention_on_packed_rows(mask):
    """One device, packed rows whose later documents start off the chunk grid."""
    q, k, v, seg, pos, sinks = _case(dv=6)
    mask = _mask(mask, sinks)
    kw = dict(segment_ids=seg, positions=pos, **mask)
    expected = np.asarray(attend(q, k, v, **kw))
    got = np.asarray(
        jax.jit(lambda q, k, v: attend(q, k, v, implementation="splash", **kw))(q, k, v)
    )
    real = seg > 0
    np.testing.assert_allclose(got[real], expected[real], atol=ATOL)
    unchunked = dict(kw, chunk=None)
    assert np.abs(np.asarray(attend(q, k, v, **unchunked))[real] - expected[real]).max() > 1e-2


CONTEXT_CASES = [
    (2, "ring", {"chunk": 16, "softcap": 2.0}),
    pytest.param(2, "ring", {"window": 30, "sinks": True}, marks=pytest.mark.slow),
    pytest.param(2, "all_gather", {"chunk": 24, "sinks": True}, marks=pytest.mark.slow),
    pytest.param(2, "ring", {}, marks=pytest.mark.slow),
    pytest.param(4, "ring", {"chunk": 12, "window": 20, "sinks": True}, marks=pytest.mark.slow),
    pytest.param(4, "all_gather", {"chunk": 16, "softcap": 2.0}, marks=pytest.mark.slow),
]


@pytest.mark.parametrize("context,how,mask", CONTEXT_CASES, ids=str)
def test_splash_over_context_equals_xla(monkeypatch, context, how, mask):
    """Packed rows with padding, grouped-query heads, values narrower than the keys, in the
    load-balanced order over `context` devices: splash's ring (its partials merged by
    log-sum-exp, the sinks once at the end) or its gathered keys, chunks by segment ids."""
    calls = []
    splash = fused.splash

    def spy(*args, **options):
        calls.append(options.get("lse", False))
        return splash(*args, **options)

    monkeypatch.setattr(fused, "splash", spy)
    q, k, v, seg, pos, sinks = _case(dv=6)
    mask = _mask(mask, sinks)
    expected = np.asarray(attend(q, k, v, segment_ids=seg, positions=pos, **mask))
    order = context_lib.load_balanced_order(96, context)

    def fn(q, k, v, seg, pos):
        with context_lib.settings(context_lib.Settings(how)):
            return attend(q, k, v, segment_ids=seg, positions=pos, implementation="splash", **mask)

    out = _on_mesh(8 // context, context, fn, *(x[:, order] for x in (q, k, v, seg, pos)))
    real = seg[:, order] > 0
    np.testing.assert_allclose(out[real], expected[:, order][real], atol=ATOL)
    assert calls and set(calls) == {how == "ring"}  # splash ran: its partials round the ring


@pytest.mark.slow
def test_a_kernel_made_inside_the_context_axis_serves_one_device(monkeypatch):
    """The cached kernels made inside the context axis's `shard_map` (the gathered path's, at
    128-token blocks) are not the ones a model on one device then calls with the same shapes:
    before, the model's trace raised XLA's "Unhandled OpSharding type ... manual"."""
    from test_splash_lengths import test_model_with_splash_scores_a_96_token_window_like_xla

    test_splash_over_context_equals_xla(monkeypatch, 2, "all_gather", {"chunk": 24, "sinks": True})
    test_model_with_splash_scores_a_96_token_window_like_xla()
