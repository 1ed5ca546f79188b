"""A NaN reaches the output of every attention kernel and merge (REVIEW item 19): a query whose
scores are NaN is not one that sees no key. Padding queries (no visible key) stay 0."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from test_attention import packed_rows
from test_context import _on_mesh
from test_split_merge import SCALE

from ppl_jax.models.layers import context as context_lib
from ppl_jax.models.layers import recurrence, split_merge
from ppl_jax.models.layers.attention import attend

T = 96
NAN_KEY = (0, 30)  # row 0, token 30: inside its first segment (tokens 0..49)


def _case(kv=2, dv=8):
    rng = np.random.default_rng(0)
    seg, pos = packed_rows([[50, 30], [T - 6], [40]], T)  # padding at the end of every row
    q = rng.standard_normal((3, T, 4, 8)).astype(np.float32)
    k = rng.standard_normal((3, T, kv, 8)).astype(np.float32)
    v = rng.standard_normal((3, T, kv, dv)).astype(np.float32)
    k[NAN_KEY + (1,)] = np.nan  # key/value head 1
    return q, k, v, seg, pos


def _sees_nan_key(seg, pos, window=None):
    """`[B, T, H]`: the queries whose visible keys include the NaN key (heads of KV head 1)."""
    r, j = NAN_KEY
    sees = np.zeros((3, T, 4), bool)
    same = (seg[r] == seg[r, j]) & (pos[r] >= pos[r, j])
    if window is not None:
        same &= pos[r] - pos[r, j] < window
    sees[r, same, 2:] = True
    return sees


def _check(out, seg, pos, window=None):
    out = np.asarray(out)
    sees = _sees_nan_key(seg, pos, window)
    assert np.isnan(out[sees]).all(), "a NaN score was swallowed"
    assert np.isfinite(out[~sees]).all(), "a NaN reached a query that does not see its key"
    assert (out[seg == 0] == 0).all(), "a padding query (no visible key) is not 0"


@pytest.mark.parametrize(
    "mask",
    [{}, {"window": 9, "sinks": True}, {"chunk": 16, "softcap": 2.0}],
    ids=str,
)
def test_xla_nan_score_propagates_and_padding_stays_zero(mask):
    q, k, v, seg, pos = _case()
    mask = dict(mask)
    if mask.get("sinks"):
        mask["sinks"] = jnp.full((4,), 0.5, jnp.float32)
    out = attend(q, k, v, segment_ids=seg, positions=pos, **mask)
    if "chunk" in mask:  # the NaN key's chunk is tokens 16..31 of its segment
        sees = np.zeros_like(_sees_nan_key(seg, pos))
        sees[0, 30:32, 2:] = True
        assert np.isnan(np.asarray(out)[sees]).all()
        assert (np.asarray(out)[seg == 0] == 0).all()
    else:
        _check(out, seg, pos, mask.get("window"))


def test_xla_nan_query_and_all_infinite_scores():
    """A NaN query gives NaN; visible scores all -inf (a softmax of 0 / 0) give NaN, not 0."""
    q, k, v, seg, pos = _case()
    k[NAN_KEY + (1,)] = 0.0
    q[1, 5, 0] = np.nan
    out = np.asarray(attend(q, k, v, segment_ids=seg, positions=pos))
    assert np.isnan(out[1, 5, 0]).all() and np.isfinite(np.delete(out[1], 5, axis=0)).all()
    k = np.ones_like(k)
    q = np.zeros_like(q)
    q[2, :, :, 0] = -np.inf  # q.k = -inf for every key of row 2
    out = np.asarray(attend(q, k, v, segment_ids=seg, positions=pos))
    assert np.isnan(out[2][seg[2] > 0]).all() and (out[2][seg[2] == 0] == 0).all()
    assert np.isfinite(out[:2]).all()


@pytest.mark.parametrize("ring", [False, True], ids=["all_gather", "ring"])
def test_context_axis_nan_propagates(ring):
    q, k, v, seg, pos = _case()
    order = context_lib.load_balanced_order(T, 8)
    settings = context_lib.Settings("ring" if ring else "all_gather")

    def fn(q, k, v, seg, pos):
        with context_lib.settings(settings):
            return attend(q, k, v, segment_ids=seg, positions=pos)

    out = _on_mesh(1, 8, fn, *(x[:, order] for x in (q, k, v, seg, pos)))
    back = np.argsort(order)
    _check(out[:, back], seg, pos)


def test_merge_propagates_nan_and_keeps_no_key_at_zero():
    out = jnp.ones((1, 4, 1, 2), jnp.float32)
    nan, inf = float("nan"), float("inf")
    lse_a = jnp.asarray([[[0.0], [nan], [-inf], [-inf]]])
    lse_b = jnp.asarray([[[1.0], [0.0], [2.0], [-inf]]])
    merged, lse = split_merge.merge((out, lse_a), (2 * out, lse_b))
    merged, lse = np.asarray(merged)[0, :, 0, 0], np.asarray(lse)[0, :, 0]
    w = 1 / (1 + np.e)  # the first query's weight of part a
    np.testing.assert_allclose(merged[0], w + 2 * (1 - w), rtol=1e-6)
    assert np.isnan(merged[1]) and np.isnan(lse[1])
    assert merged[2] == 2.0 and lse[2] == 2.0  # part a saw no key
    assert merged[3] == 0.0 and lse[3] == -inf  # neither did


def test_split_merge_nan_in_the_prefix_propagates(monkeypatch):
    """cuDNN's split into a diagonal block and a prefix (the flash kernel in its place, as in
    test_split_merge): a NaN key in the prefix reaches the queries after it."""
    monkeypatch.setitem(split_merge.PARTIALS, "cudnn", split_merge.xla_partial)
    q, k, v, seg, pos = _case()
    seg, pos = packed_rows([[T], [T - 6], [40]], T)  # one document per row: the split-merge
    got = jax.jit(
        lambda q, k, v, seg, pos: attend(
            q[:, 32:64], k, v, segment_ids=seg[:, 32:64], positions=pos[:, 32:64],
            kv_segment_ids=seg, kv_positions=pos, scale=SCALE, implementation="cudnn",
        )
    )(q, k, v, seg, pos)  # fmt: skip
    got, sees = np.asarray(got), _sees_nan_key(seg, pos)[:, 32:64]
    assert np.isnan(got[sees]).all() and np.isfinite(got[~sees]).all()
    assert (got[seg[:, 32:64] == 0] == 0).all()


def test_splash_nan_propagates():
    q, k, v, seg, pos = _case(kv=2, dv=8)
    t = 128  # the splash kernel's blocks
    pad = ((0, 0), (0, t - T))
    q, k, v = (np.pad(x, pad + ((0, 0), (0, 0))) for x in (q, k, v))
    seg, pos = np.pad(seg, pad), np.pad(pos, pad)
    out = np.asarray(attend(q, k, v, segment_ids=seg, positions=pos, implementation="splash"))
    sees = np.pad(_sees_nan_key(seg[:, :T], pos[:, :T]), pad + ((0, 0),))
    assert np.isnan(out[sees]).all()
    assert np.isfinite(out[~sees & (seg > 0)[..., None]]).all()


def test_recurrence_decay_keeps_nan():
    """A NaN log-decay (a NaN `A_log`) is NaN, not a decay below the floor (0)."""
    got = np.asarray(recurrence._exp(jnp.asarray([0.0, -100.0, float("nan"), -float("inf")])))
    assert got[0] == 1.0 and got[1] == 0.0 and np.isnan(got[2]) and got[3] == 0.0
