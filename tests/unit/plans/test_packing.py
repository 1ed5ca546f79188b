"""Packing documents into rows: every token placed once, rows and batches within their widths and
segment limit, and the padding of log-uniform documents (the GPU benchmark's,
`benchmarks/bench_long_gpu.py --part=padding`) within its bounds. Planning only, no model."""

import numpy as np
import pytest

from ppl_jax.plans import windows
from ppl_jax.plans.layout import MAX_SEGMENTS, bucket_widths, plan_layout

SEQ, ROWS, BATCH = 2048, 256, 32


def log_uniform(seed: int, seq: int = SEQ, rows: int = ROWS) -> windows.Windows:
    """Documents of log-uniform length 2..seq until they hold `rows` rows of `seq` tokens, one
    window each; token `i` of the stream is the id `i` (each token's place is its value)."""
    rng = np.random.default_rng(seed)
    lengths = []
    while sum(lengths) < rows * seq:
        lengths.append(int(np.exp(rng.uniform(0, np.log(seq)))) + 1)
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    stream = np.arange(sum(lengths), dtype=np.int32)
    return windows.make(stream, starts, lengths, np.ones(len(lengths)), seq)


def check_layout(w: windows.Windows, layout) -> float:
    """Asserts that the layout places every token of `w` exactly once, in rows within their
    batch's width and the segment limit; returns its padding, counted from the filled batches."""
    placed = sorted(k for row in layout.rows for k in row)
    assert placed == list(range(w.num_windows))
    assert layout.max_segments == max(len(r) for r in layout.rows) <= MAX_SEGMENTS
    assert set(layout.widths) <= set(bucket_widths(w.seq_len, 8))
    seen, positions = [], 0
    for i, width in enumerate(layout.widths):
        rows = layout.batch_rows(i)
        assert len(rows) == layout.batch_size
        batch = w.fill(rows, width)  # raises if a row is longer than `width`
        seen.append(batch["tokens"][batch["segment_ids"] > 0])
        positions += batch["tokens"].size
    tokens = np.sort(np.concatenate(seen))
    np.testing.assert_array_equal(tokens, np.arange(w.tokens.size))
    padding = 1 - tokens.size / positions
    assert layout.padding_fraction == pytest.approx(padding, abs=1e-12)
    return padding


@pytest.mark.parametrize("seed", [1, 2])
def test_log_uniform_documents_fill_the_least_rows(seed):
    """One width: the rows hold the documents in the least number of rows their tokens allow
    (best fit within 64 segments from the start needed 265 rows for seed 1's 257), and what
    pads the batches is the last batch's empty rows (fewer than a batch)."""
    w = log_uniform(seed)
    layout = plan_layout(w, BATCH, pack=True)
    check_layout(w, layout)
    tokens = int(w.row_lengths().sum())
    least = -(-tokens // (SEQ + 1))
    assert least <= len(layout.rows) <= least + 1
    assert 1 - tokens / (len(layout.rows) * (SEQ + 1)) < 0.005  # padding within the rows
    assert layout.num_batches == -(-len(layout.rows) // BATCH)
    assert layout.widths == [SEQ + 1] * layout.num_batches


@pytest.mark.parametrize("seed", [1, 2])
@pytest.mark.parametrize("buckets,bound", [(4, 0.03), (8, 0.005)])
def test_length_buckets_narrow_the_last_batch(seed, buckets, bound):
    """With length buckets the last batch holds the shortest documents at a narrower width: the
    padding of every batch together (11% with one width: 256.2 rows of tokens in 9 batches of
    32) falls within `bound`, with two widths compiled, and no more batches."""
    w = log_uniform(seed)
    one = plan_layout(w, BATCH, pack=True)
    layout = plan_layout(w, BATCH, pack=True, num_buckets=buckets)
    padding = check_layout(w, layout)
    assert one.padding_fraction > 0.10
    assert padding <= bound
    assert layout.num_batches == one.num_batches
    assert layout.widths[:-1] == [SEQ + 1] * (layout.num_batches - 1)
    assert layout.widths[-1] < SEQ + 1


def test_a_corpus_smaller_than_a_batch_takes_one_narrow_batch():
    """40 short documents (2..59 tokens) at seq_len 1024 and 8 rows per batch: one batch at the
    narrowest width that holds them in 8 rows (257: 1,200 tokens do not fit 8 rows of 129)."""
    lengths = np.random.default_rng(0).integers(2, 60, 40)
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    w = windows.make(np.arange(lengths.sum(), dtype=np.int32), starts, lengths, np.ones(40), 1024)
    assert 8 * 129 < lengths.sum() <= 8 * 257
    layout = plan_layout(w, 8, pack=True, num_buckets=4)
    check_layout(w, layout)
    assert layout.widths == [257]
    assert plan_layout(w, 8, pack=True).widths == [1025]


def test_tiny_windows_beyond_the_segment_limit_open_rows():
    """Many more windows than the least rows of their tokens have segments for: rows of at most
    `MAX_SEGMENTS` windows, as few as the windows' count allows."""
    lengths = np.random.default_rng(0).integers(2, 5, 3000)
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    stream = np.arange(lengths.sum(), dtype=np.int32)
    w = windows.make(stream, starts, lengths, np.ones(3000), 1023)
    layout = plan_layout(w, 4, pack=True)
    check_layout(w, layout)
    assert -(-lengths.sum() // 1024) < 12 < len(layout.rows) == -(-3000 // MAX_SEGMENTS)
