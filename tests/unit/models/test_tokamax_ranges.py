"""The key ranges the tokamax kernel is called with (`tokamax_kernel.key_ranges`, plain JAX: no
tokamax needed) against `attend`'s mask (`flash.visible`): each query's visible keys are exactly
`[k_start, k_end)`, for packed rows with windows and chunks, for a chunk of queries against the
row's keys, and for the two chunks of a row a device holds on the context axis (a gap in the
positions between them); a query that sees nothing gets an empty range."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from test_attention import packed_rows

from ppl_jax.models.layers import context as context_lib
from ppl_jax.models.layers import flash, tokamax_kernel

LENGTHS = [[40, 30, 26], [96], [50], [7, 60], []]


def _check(q_seg, q_pos, k_seg, k_pos, window, chunk):
    ranges = jax.jit(tokamax_kernel.key_ranges, static_argnums=(4, 5))
    start, end = ranges(*map(jnp.asarray, (q_seg, q_pos, k_seg, k_pos)), window, chunk)
    start, end = np.asarray(start), np.asarray(end)
    visible = np.asarray(flash.visible(q_seg, q_pos, k_seg, k_pos, window, chunk))
    j = np.arange(k_seg.shape[1])[None, None, :]
    ranges = (j >= start[..., None]) & (j < end[..., None])
    np.testing.assert_array_equal(ranges, visible)
    assert np.all(start <= end)
    return start, end


@pytest.mark.parametrize("window,chunk", [(None, None), (20, None), (None, 16), (9, 7)])
def test_each_querys_range_is_its_visible_keys(window, chunk):
    seg, pos = packed_rows(LENGTHS, 96)
    start, end = _check(seg, pos, seg, pos, window, chunk)
    # Padding's empty range sits where the row's last real query's ended: no key block skipped
    # less for it.
    assert start[3, -1] == end[3, -1] == 67 and start[4, 0] == end[4, 0] == 0
    assert end[3, 6] == 7 and start[3, 7] == 7  # the second document starts afresh


@pytest.mark.parametrize("window,chunk", [(None, None), (30, 12)])
def test_queries_apart_and_a_devices_chunks_of_the_row(window, chunk):
    seg, pos = packed_rows(LENGTHS, 96)
    _check(seg[:, 32:64], pos[:, 32:64], seg, pos, window, chunk)  # a chunk of queries
    order = context_lib.load_balanced_order(96, 4)
    for device in range(4):  # the ring: the keys of one device's two chunks, a gap between
        block = order[device * 24 : (device + 1) * 24]
        _check(seg, pos, seg[:, block], pos[:, block], window, chunk)


def test_padding_inside_a_row_is_passed_over():
    seg, pos = packed_rows([[5, 6]], 16)
    seg = np.concatenate([seg[:, :5], np.zeros((1, 2), np.int32), seg[:, 5:14]], axis=1)
    pos = np.concatenate([pos[:, :5], np.zeros((1, 2), np.int32), pos[:, 5:14]], axis=1)
    start, end = _check(seg, pos, seg, pos, None, None)
    assert (start[0, 7], end[0, 7]) == (7, 8)  # the second document's first token
