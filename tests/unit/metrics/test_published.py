"""The Hugging Face guide's loop as published (`ppl_jax.metrics.published`): a NumPy
re-implementation of the loop, line for line, on a context-dependent NumPy model, gives the same
number as ppl_jax's host arithmetic on the per-window sums of the `hf_strided` windows; and that
number differs from the exact count where the guide says it should."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest

from ppl_jax.metrics import published
from ppl_jax.plans import protocols

VOCAB = 7


def log_probs(window: np.ndarray) -> np.ndarray:
    """`[T, VOCAB]` log-probabilities of a NumPy "model" whose prediction at row t depends on the
    token there and on how many tokens of context it has (so a window's numbers depend on where
    it starts, as a real model's do)."""
    t = np.arange(window.size)
    logits = (
        np.sin(window[:, None] * 1.3 + np.arange(VOCAB)[None, :] * 0.7) * (1 + np.log1p(t))[:, None]
    )
    return logits - np.log(np.exp(logits).sum(-1, keepdims=True))


def guide_loop(ids: np.ndarray, max_length: int, stride: int) -> float:
    """The guide's loop (transformers docs, perplexity.md), with `model(input_ids,
    labels=target_ids).loss` written out: the mean NLL over the shifted labels that are not -100."""
    seq_len = ids.size
    nll_sum, n_tokens, prev_end_loc = 0.0, 0, 0
    for begin_loc in range(0, seq_len, stride):
        end_loc = min(begin_loc + max_length, seq_len)
        trg_len = end_loc - prev_end_loc
        input_ids = ids[begin_loc:end_loc]
        target_ids = input_ids.copy()
        target_ids[:-trg_len] = -100
        labels = target_ids[1:]  # the model shifts the labels by one
        keep = labels != -100
        logp = log_probs(input_ids)[:-1]
        with warnings.catch_warnings(), np.errstate(invalid="ignore"):
            warnings.simplefilter(
                "ignore", RuntimeWarning
            )  # a mean over no label: NaN, as in torch
            loss = -np.mean(logp[np.arange(labels.size)[keep], labels[keep]])
        num_valid_tokens = int((target_ids != -100).sum())
        batch_size = 1
        num_loss_tokens = num_valid_tokens - batch_size
        nll_sum += loss * num_loss_tokens
        n_tokens += num_loss_tokens
        prev_end_loc = end_loc
        if end_loc == seq_len:
            break
    return math.exp(nll_sum / n_tokens)


def ppl_jax_sums(ids: np.ndarray, max_length: int, stride: int):
    """ppl_jax's `hf_strided` windows and their exact per-window sums under the same model."""
    w = protocols.HF_STRIDED.windows(ids.astype(np.int32), max_length, stride)
    nll, count = [], []
    for k in range(w.num_windows):
        row = w.tokens[int(w.starts[k]) : int(w.starts[k]) + int(w.lengths[k])]
        logp = log_probs(row)
        targets = range(int(w.first_scored[k]), row.size)
        nll.append(-sum(logp[p - 1, row[p]] for p in targets))
        count.append(len(targets))
    return w, np.asarray(nll), np.asarray(count)


CASES = [
    (100, 16, 8),
    (100, 16, 16),
    (100, 16, 5),
    (100, 16, 1),
    (100, 16, 24),  # stride past the window: tokens between windows are never scored
    (37, 16, 8),
    (16, 16, 8),
    (5, 16, 8),
    (129, 32, 7),
]


@pytest.mark.parametrize("n, max_length, stride", CASES)
def test_host_arithmetic_equals_the_loop_as_published(n, max_length, stride):
    ids = np.random.default_rng(n + stride).integers(0, VOCAB, n)
    w, nll, count = ppl_jax_sums(ids, max_length, stride)
    valid, empty = published.hf_guide_valid_labels(w.starts, w.lengths, w.first_scored, n)
    found = published.hf_guide_loop(nll, count, valid, empty)
    expected = guide_loop(ids, max_length, stride)
    assert found["perplexity"] == pytest.approx(expected, rel=1e-12)
    assert found["name"] == "hf_guide_loop" and found["note"] is None
    exact = math.exp(nll.sum() / count.sum())
    # Windows after the first are weighted by one label fewer than they score, when the stride
    # is below the window: then, and only then, the published number is not the exact count.
    if stride < max_length and n > max_length:
        assert found["perplexity"] != pytest.approx(exact, rel=1e-9)
        assert found["weighted_tokens"] == count.sum() - (w.num_windows - 1)
    else:
        assert found["perplexity"] == pytest.approx(exact, rel=1e-12)


def test_a_last_window_of_one_token_makes_the_loop_nan():
    n, max_length = 33, 16  # windows [0, 16), [16, 32), [32, 33): one token, no label
    ids = np.random.default_rng(0).integers(0, VOCAB, n)
    assert math.isnan(guide_loop(ids, max_length, max_length))
    w, nll, count = ppl_jax_sums(ids, max_length, max_length)
    valid, empty = published.hf_guide_valid_labels(w.starts, w.lengths, w.first_scored, n)
    assert empty
    found = published.hf_guide_loop(nll, count, valid, empty)
    assert found["perplexity"] is None and "NaN in the loop as published" in found["note"]
    assert math.isfinite(math.exp(nll.sum() / count.sum()))  # ppl_jax's exact count is not
