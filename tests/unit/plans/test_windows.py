"""The sliding-window protocol: every token after the first scored once, context, tail kept."""

import itertools

import numpy as np
import pytest

from ppl_jax.plans.windows import Windows, sliding


def scored_positions(win: Windows):
    """(global target position, context length) for every scored target, from the batch rows."""
    out = []
    rows = win.rows(np.arange(win.num_windows))
    for k in range(win.num_windows):
        start = int(win.starts[k])
        for j in np.flatnonzero(rows["target_mask"][k]):
            assert rows["segment_ids"][k, j] == 1
            assert rows["tokens"][k, j] == win.tokens[start + j]
            out.append((start + j, j))  # the target at window position j sees j inputs
    return out


@pytest.mark.parametrize(
    "n,seq_len,stride",
    [
        (n, L, S)
        for n, L in itertools.product([2, 3, 7, 16, 17, 100], [1, 4, 16])
        for S in sorted({1, max(1, L // 2), max(1, L - 1), L})
    ],
)
def test_every_token_after_the_first_is_scored_once(n, seq_len, stride):
    tokens = np.arange(n, dtype=np.int32) % 251
    win = sliding(tokens, seq_len, stride)
    scored = scored_positions(win)
    positions = sorted(p for p, _ in scored)
    assert positions == list(range(1, n))  # once each, the tail included, the first never
    for pos, context in scored:
        assert context >= min(pos, seq_len - stride + 1)
    # Windows hold at most seq_len model inputs; no window is wasted.
    rows = win.rows(np.arange(win.num_windows))
    assert rows["tokens"].shape == (win.num_windows, seq_len + 1)
    assert all(rows["target_mask"][k].any() for k in range(win.num_windows))


def test_window_count_formula_and_tail():
    win = sliding(np.arange(1001, dtype=np.int32), seq_len=256, stride=256)
    # targets 1..1000: windows cover 256 each; the fourth holds the tail of 232.
    assert win.num_windows == 4
    rows = win.rows(np.arange(4))
    assert rows["target_mask"].sum(axis=1).tolist() == [256, 256, 256, 232]
    assert rows["segment_ids"][3].sum() == 233  # 232 targets + their first input


def test_padding_rows_are_fully_masked():
    win = sliding(np.arange(50, dtype=np.int32), seq_len=16, stride=8)
    rows = win.rows(np.array([win.num_windows, win.num_windows + 3]))
    assert not rows["target_mask"].any()
    assert not rows["segment_ids"].any()


def test_strided_context():
    win = sliding(np.arange(200, dtype=np.int32), seq_len=64, stride=16)
    rows = win.rows(np.arange(win.num_windows))
    # Windows after the first score only their last `stride` targets.
    assert rows["target_mask"][0].sum() == 64
    assert np.flatnonzero(rows["target_mask"][1]).tolist() == list(range(49, 65))
