"""Loss by position and perplexity against context length: sums, buckets, windows (their figures:
tests/unit/outputs/test_figures.py)."""

import json
import math
import subprocess
import sys

import numpy as np
import pytest

from ppl_jax.errors import ConfigError, DataError
from ppl_jax.metrics import curves
from ppl_jax.plans.layout import plan_layout
from ppl_jax.plans.windows import context_windows

import helpers

LN2 = math.log(2.0)


def random_sums(num_positions: int, seed: int, empty_fraction: float = 0.2):
    """Per-position NLL sums (float64, nats) and counts (int64), some positions empty; position 0
    is never a target."""
    rng = np.random.default_rng(seed)
    count = rng.integers(1, 1000, num_positions).astype(np.int64)
    count[rng.random(num_positions) < empty_fraction] = 0
    count[0] = 0
    nll = count * rng.uniform(0.5, 8.0, num_positions)
    return nll, count


# ---- buckets ---------------------------------------------------------------------------------


@pytest.mark.parametrize("p", [1, 2, 7, 63, 64, 65, 100, 1025, 4097, 100_000])
@pytest.mark.parametrize("max_points", [2, 3, 16, 64])
def test_bucket_edges_cover_every_position_once(p, max_points):
    edges = curves.bucket_edges(p, max_points)
    assert edges[0] == 0 and edges[-1] == p
    assert (np.diff(edges) >= 1).all()  # strictly increasing: each position in one bucket
    assert len(edges) - 1 <= max_points
    if p <= max_points:
        assert edges.tolist() == list(range(p + 1))
    else:
        assert edges[1] == 1  # position 0 (never a target) is a bucket of its own
        widths = np.diff(edges)[1:]
        assert (np.diff(widths) >= 0).all()  # buckets only widen with position


def test_bucket_edges_are_log_spaced_for_4097_positions():
    edges = curves.bucket_edges(4097, 64)
    assert len(edges) - 1 == 64
    widths = np.diff(edges)
    # Single positions first, where the loss changes fastest ...
    assert widths[:13].tolist() == [1] * 13
    # ... then the edges grow by a near-constant ratio: (4097 / e) ** (1 / buckets left).
    wide = np.flatnonzero(widths > 1)
    ratios = edges[wide + 1] / edges[wide]
    expected = (4097 / edges[wide[0]]) ** (1 / wide.size)
    assert np.abs(ratios - expected).max() < 0.1 * expected
    # 64 linear buckets would give the first 64 positions one bucket and the last half 32; a
    # ratio of about 1.12 gives the octave 32..64 about log(2)/log(1.12) = 6 buckets, as each
    # later octave, and the 13 single positions and the octaves below 32 hold more.
    assert np.sum(edges[1:] <= 64) > 20
    assert 4 <= np.sum(edges[:-1] >= 2048) <= 8


@pytest.mark.parametrize("bad", [(0, 64), (10, 1), (10, 0)])
def test_bucket_edges_reject_bad_arguments(bad):
    with pytest.raises(ValueError):
        curves.bucket_edges(*bad)


# ---- position curve --------------------------------------------------------------------------


@pytest.mark.parametrize("p,max_points", [(17, 64), (64, 64), (257, 64), (4097, 64), (4097, 8)])
def test_position_buckets_add_up_to_the_totals(p, max_points):
    nll, count = random_sums(p, seed=p + max_points)
    curve = curves.position_curve(nll, count, max_points=max_points)
    json.dumps(curve, allow_nan=False)  # strict JSON
    buckets = curve["buckets"]
    assert curve["num_positions"] == p
    assert curve["bucketing"] == ("every position" if p <= max_points else "log")
    assert len(buckets) <= max_points
    # Totals: exactly the inputs' sums (integers exact; float64 sums within rounding).
    total = curve["total"]
    assert total["num_tokens"] == int(count.sum())
    assert total["nll_sum"] == pytest.approx(float(np.sum(nll)), rel=1e-13)
    assert sum(b["num_tokens"] for b in buckets) == total["num_tokens"]
    assert math.fsum(b["nll_sum"] for b in buckets) == pytest.approx(total["nll_sum"], rel=1e-14)
    # Every position with a scored target lies in exactly one bucket; empty buckets are omitted.
    covered = np.zeros(p, np.int64)
    for b in buckets:
        covered[b["first"] : b["last"] + 1] += 1
        assert b["num_tokens"] > 0
    assert covered.max() <= 1
    assert (covered[count > 0] == 1).all()
    firsts = [b["first"] for b in buckets]
    assert firsts == sorted(firsts)
    # Each bucket against an independent recomputation from the arrays.
    for b in buckets:
        lo, hi = b["first"], b["last"] + 1
        assert b["num_tokens"] == int(count[lo:hi].sum())
        s = float(np.sum(nll[lo:hi]))
        assert b["nll_sum"] == pytest.approx(s, rel=1e-13)
        assert b["nll_per_token"] == pytest.approx(s / b["num_tokens"], rel=1e-13)
        assert b["perplexity"] == pytest.approx(math.exp(s / b["num_tokens"]), rel=1e-12)
        assert b["bits_per_token"] == pytest.approx(s / b["num_tokens"] / LN2, rel=1e-13)
    if p <= max_points:  # one bucket per non-empty position
        assert [b["first"] for b in buckets] == np.flatnonzero(count).tolist()
        assert all(b["first"] == b["last"] for b in buckets)


def test_buckets_are_token_weighted_not_a_mean_of_means():
    # Position 1: one token at 5 nats; position 2: 99 tokens at 1 nat; one bucket holds both.
    nll = np.array([0.0, 5.0, 99.0])
    count = np.array([0, 1, 99])
    curve = curves.position_curve(nll, count, max_points=2)
    assert [(b["first"], b["last"]) for b in curve["buckets"]] == [(1, 2)]
    bucket = curve["buckets"][0]
    assert bucket["nll_per_token"] == pytest.approx(104 / 100)  # not (5 + 1) / 2 = 3
    assert bucket["perplexity"] == pytest.approx(math.exp(1.04))
    assert bucket == curve["total"] | {"first": 1, "last": 2}


def test_an_overflowing_perplexity_is_null_with_a_note():
    curve = curves.position_curve(np.array([0.0, 1.0, 5000.0]), np.array([0, 1, 1]))
    json.dumps(curve, allow_nan=False)
    assert curve["buckets"][1]["perplexity"] is None
    assert "overflow" in curve["notes"]["buckets[1].perplexity"]
    assert curve["buckets"][1]["nll_per_token"] == 5000.0
    assert curve["buckets"][0]["perplexity"] == pytest.approx(math.e)


@pytest.mark.parametrize(
    "nll,count",
    [
        (np.zeros(3), np.zeros(4, np.int64)),
        (np.zeros((2, 2)), np.zeros((2, 2), np.int64)),
        (np.zeros(3), np.array([0, -1, 2])),
        (np.zeros(3), np.array([0.0, 1.0, 2.0])),
        (np.array([0.0, np.nan, 1.0]), np.array([0, 1, 1])),
    ],
)
def test_position_curve_rejects_malformed_sums(nll, count):
    with pytest.raises(ValueError):
        curves.position_curve(nll, count)


# ---- context-length windows ------------------------------------------------------------------


def scored_by_fill(win, batch_size, pack, num_buckets):
    """(target index, context length) of every scored target, read back from `Windows.fill` over
    the batches of a layout, checking the tokens and the row masks as it goes."""
    layout = plan_layout(win, batch_size, pack=pack, num_buckets=num_buckets)
    row_lengths = win.row_lengths()
    out = []
    for i in range(layout.num_batches):
        rows = layout.batch_rows(i)
        batch = win.fill(rows, layout.widths[i])
        seen = np.zeros_like(batch["target_mask"])
        for r, ids in enumerate(rows):
            begin = 0
            for k in ids:
                end = begin + int(row_lengths[k])
                for p in range(begin, end):
                    index = int(win.starts[k]) + p - begin
                    assert batch["tokens"][r, p] == win.tokens[index]
                    scored = p - begin >= win.first_scored[k]
                    assert batch["target_mask"][r, p] == scored
                    if scored:
                        out.append((index, p - begin))
                seen[r, begin:end] = True
                begin = end
        assert not batch["target_mask"][~seen].any()  # padding is never scored
    return out


@pytest.mark.parametrize(
    "n,lengths,block",
    [
        (40, [1, 2, 4, 8], 3),
        (64, [4, 16], 16),
        (101, [3, 5, 7, 32], 5),
        (33, [32], 1),
        (50, [8, 16, 24], 40),  # one window per length, clipped at the end
    ],
)
@pytest.mark.parametrize("pack,num_buckets", [(False, 1), (True, 3)])
def test_every_context_length_scores_the_same_targets(n, lengths, block, pack, num_buckets):
    tokens = (np.arange(n, dtype=np.int32) * 7919) % 50257
    first = max(lengths)
    results, masks = [], []
    for length in lengths:
        win = context_windows(tokens, length, block, first)
        assert win.seq_len == length + block - 1
        assert (win.first_scored == length).all() and (win.prefix == -1).all()
        masks.append(win.scored_token_mask())
        assert int(win.num_scored().sum()) == n - first
        assert win.num_windows == math.ceil((n - first) / block)
        scored = scored_by_fill(win, batch_size=2, pack=pack, num_buckets=num_buckets)
        indices = sorted(i for i, _ in scored)
        assert indices == list(range(first, n))  # tokens[first:], each exactly once
        for index, context in scored:
            assert length <= context <= length + block - 1
            assert context == length + (index - first) % block
        # Position sums as the step returns them: a target's position is its context length.
        count = np.zeros(win.seq_len + 1, np.int64)
        nll = np.zeros(win.seq_len + 1)
        for _, context in scored:
            count[context] += 1
            nll[context] += 3.0 / math.sqrt(context)
        curve = curves.position_curve(nll, count)
        assert curve["total"]["num_tokens"] == n - first
        assert curve["buckets"][0]["first"] == length
        results.append((length, curve["total"]["nll_sum"], curve["total"]["num_tokens"]))
    for mask in masks:
        assert np.array_equal(mask, np.arange(n) >= first)
    table = curves.context_curve(results, targets_per_window=block)
    assert table["num_targets"] == n - first
    # Loss falling with context gives perplexity falling with the context length.
    ppl = [row["perplexity"] for row in table["context_lengths"]]
    assert ppl == sorted(ppl, reverse=True)


@pytest.mark.parametrize("n,first", [(8, 8), (5, 8), (0, 1)])
def test_a_stream_too_short_for_the_sweep_is_a_data_error(n, first):
    with pytest.raises(DataError, match=rf"holds {n:,} tokens.*{first:,}"):
        context_windows(np.zeros(n, np.int32), 1, 4, first)


@pytest.mark.parametrize("length,block,first", [(0, 4, 8), (4, 0, 8), (9, 4, 8)])
def test_context_windows_reject_bad_settings(length, block, first):
    with pytest.raises(ConfigError, match="eval.context_lengths"):
        context_windows(np.zeros(100, np.int32), length, block, first)


# ---- context-length curve and table ----------------------------------------------------------


def test_context_curve_sorts_and_derives_each_length():
    results = [(1024, 3000.0, 1000), (256, 3500.0, 1000), (512, 3200.0, 1000)]
    curve = curves.context_curve(results, targets_per_window={256: 256, 512: 128, 1024: 64})
    json.dumps(curve, allow_nan=False)
    rows = curve["context_lengths"]
    assert [r["context_length"] for r in rows] == [256, 512, 1024]
    assert [(r["min_context"], r["max_context"]) for r in rows] == [
        (256, 511),
        (512, 639),
        (1024, 1087),
    ]
    for row, (_, nll_sum, tokens) in zip(rows, sorted(results), strict=True):
        assert row["num_tokens"] == tokens and row["nll_sum"] == nll_sum
        assert row["perplexity"] == pytest.approx(math.exp(nll_sum / tokens), rel=1e-14)
        assert row["bits_per_token"] == pytest.approx(nll_sum / tokens / LN2, rel=1e-14)
    table = curves.context_table(curve)
    lines = table.splitlines()
    assert len(lines) == 4 and "perplexity" in lines[0] and "context seen" in lines[0]
    assert lines[1].split() == ["256", "256..511", "1,000", "3.5000", "5.0494", "33.1155"]
    assert f"{math.exp(3.0):.4f}" in lines[3]


def test_context_table_without_ranges_and_with_a_null_perplexity():
    curve = curves.context_curve([(8, 9000.0, 1), (16, 2.0, 1)])
    assert "min_context" not in curve["context_lengths"][0]
    assert curve["context_lengths"][0]["perplexity"] is None
    assert "overflow" in curve["notes"]["context_lengths[0].perplexity"]
    lines = curves.context_table(curve).splitlines()
    assert "context seen" not in lines[0]
    assert lines[1].split()[-1] == "n/a"
    assert lines[2].split()[-1] == f"{math.exp(2.0):.4f}"


@pytest.mark.parametrize(
    "results",
    [[], [(0, 1.0, 1)], [(8, 1.0, 5), (8, 2.0, 5)], [(8, 1.0, 5), (16, 1.0, 6)]],
)
def test_context_curve_rejects_an_unfair_or_empty_sweep(results):
    with pytest.raises(ValueError):
        curves.context_curve(results)


def test_importing_curves_does_not_import_matplotlib():
    code = "import sys, ppl_jax.metrics.curves; assert 'matplotlib' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=helpers.REPO)
