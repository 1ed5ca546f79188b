"""LongPPL's host arithmetic (`ppl_jax.metrics.longppl`) against the reference's rules, restated
(the reference's own numbers are in tests/unit/evaluation/test_longppl_golden.py)."""

import math

import numpy as np
import pytest

from ppl_jax.metrics import longppl


def test_key_tokens_need_both_thresholds():
    long = np.asarray([1.0, 1.0, 3.0, 1.0, 0.5, 1.0], np.float32)
    short = np.asarray([3.5, 2.9, 6.0, np.nan, 2.6, 3.0], np.float32)
    # LSD > 2 and LCL < 2: token 0 yes; 1 (LSD 1.9) no; 2 (long 3) no; 3 (no short) no;
    # 4 (LSD 2.1) yes; 5 (LSD exactly 2: not more than alpha) no.
    assert longppl.key_tokens(long, short).tolist() == [True, False, False, False, True, False]
    assert longppl.key_tokens(long, short, alpha=1.5, beta=-4).tolist() == [
        True, True, True, False, True, True,
    ]  # fmt: skip


def merge_reference(spans):
    """The reference's `merge_intervals`, restated with lists."""
    if not spans:
        return []
    out = [list(spans[0])]
    for s, e in spans[1:]:
        if s == out[-1][1]:
            out[-1][1] = e
        else:
            out.append([s, e])
    return out


def random_spans(rng, n, trim):
    """Token character spans of a text, in order: touching, or (trimmed) with gaps and some of
    no width, as tokenizers that trim spaces from offsets report them."""
    ends = np.cumsum(rng.integers(1, 5, size=n))
    starts = np.concatenate([[0], ends[:-1]])
    if trim:
        starts = np.minimum(starts + rng.integers(0, 2, size=n), ends)
    return np.stack([starts, ends], axis=1)


@pytest.mark.parametrize("trim", [False, True])
def test_merge_and_within_follow_the_reference_walk(trim):
    rng = np.random.default_rng(0)
    for _ in range(200):
        evaluator = random_spans(rng, 40, trim)
        keys = rng.random(40) < 0.3
        merged = longppl.merge_intervals(evaluator[keys])
        assert merged.tolist() == merge_reference(evaluator[keys].tolist())
        model = random_spans(rng, 30, trim)
        walk = longppl.within_walk(model.tolist(), merged.tolist())
        assert np.flatnonzero(longppl.within(model, merged)).tolist() == walk


def test_the_same_tokens_are_their_own_key_tokens():
    spans = random_spans(np.random.default_rng(1), 50, False)
    keys = np.random.default_rng(2).random(50) < 0.4
    assert (longppl.within(spans, longppl.merge_intervals(spans[keys])) == keys).all()


def test_summary_is_token_weighted_over_documents():
    rng = np.random.default_rng(3)
    docs = [rng.random(k) * 3 for k in (5, 1, 12)]
    got = longppl.summary(np.concatenate(docs), np.concatenate(docs + [np.ones(4)]), 2, -2, "m", 9)
    # perplexity.py: exp(sum_d log(LongPPL_d) n_d / sum_d n_d), LongPPL_d = exp(mean_d)
    per_doc = [math.exp(d.mean()) for d in docs]
    want = math.exp(sum(math.log(p) * d.size for p, d in zip(per_doc, docs, strict=True)) / 18)
    assert got["longppl"] == pytest.approx(want, rel=1e-12)
    assert got["num_key_tokens"] == 18 and got["num_tokens"] == 22
    empty = longppl.summary(np.zeros(0), np.ones(3), 2, -2, "m", 0)
    assert empty["longppl"] is None and "no key tokens" in empty["notes"]["longppl"]
