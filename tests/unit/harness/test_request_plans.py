"""`ppl_jax.plans.requests`: a loglikelihood request's window is the row HFLM scores (its own
slicing, `lm_eval/models/huggingface.py`), with exactly the continuation's targets masked; the
rolling plan's windows are lm-evaluation-harness's (`get_rolling_token_windows`,
`make_disjoint_window`); refusals name the request."""

from __future__ import annotations

import numpy as np
import pytest

from ppl_jax.errors import DataError
from ppl_jax.plans import requests

VOCAB = 100


def _hflm_row(ctx: list[int], cont: list[int], max_length: int) -> tuple[list[int], list[int]]:
    """HFLM's input row and the row positions of the targets it scores: `inp =
    (ctx + cont)[-(max_length + 1):][:-1]`, logits `[inplen - contlen : inplen]`, each logit `j`
    predicting the token at row position `j + 1`."""
    full = (ctx + cont)[-(max_length + 1) :]
    inplen = len(full) - 1
    return full, list(range(inplen - len(cont) + 1, inplen + 1))


@pytest.mark.parametrize("seq_len", [4, 8, 16])
def test_each_request_is_the_row_hflm_scores(seq_len):
    rng = np.random.default_rng(seq_len)
    ctxs, conts = [], []
    for _ in range(40):
        ctxs.append(rng.integers(0, VOCAB, rng.integers(1, 3 * seq_len)).tolist())
        conts.append(rng.integers(0, VOCAB, rng.integers(1, seq_len + 1)).tolist())
    conts[0] = conts[0][:1]  # one token
    conts[1] = rng.integers(0, VOCAB, seq_len).tolist()  # the whole window: one context token
    nbytes = rng.integers(1, 50, len(ctxs))
    plan = requests.loglikelihood_plan(ctxs, conts, nbytes, seq_len, VOCAB)
    w = plan.windows
    assert w.num_windows == len(ctxs)
    np.testing.assert_array_equal(w.document, np.arange(len(ctxs)))
    np.testing.assert_array_equal(w.num_scored(), [len(c) for c in conts])
    np.testing.assert_array_equal(plan.doc_bytes, nbytes)
    assert plan.num_bytes == nbytes.sum()
    rows = w.rows(np.arange(len(ctxs)))
    for k, (ctx, cont) in enumerate(zip(ctxs, conts, strict=True)):
        full, scored = _hflm_row(ctx, cont, seq_len)
        np.testing.assert_array_equal(rows["tokens"][k, : len(full)], full)
        assert np.flatnonzero(rows["target_mask"][k]).tolist() == scored
        np.testing.assert_array_equal(rows["tokens"][k, scored], cont)


def test_packed_rows_keep_each_request_to_itself():
    ctxs = [[1, 2, 3], [4], [5, 6]]
    conts = [[7], [8, 9], [10, 11, 12]]
    plan = requests.loglikelihood_plan(ctxs, conts, [1, 2, 3], 16, VOCAB)
    batch = plan.windows.fill([(0, 1, 2)], 17)
    np.testing.assert_array_equal(batch["tokens"][0, :12], [1, 2, 3, 7, 4, 8, 9, 5, 6, 10, 11, 12])
    np.testing.assert_array_equal(batch["segment_ids"][0, :13], [1] * 4 + [2] * 3 + [3] * 5 + [0])
    np.testing.assert_array_equal(batch["positions"][0, :12], [0, 1, 2, 3, 0, 1, 2, 0, 1, 2, 3, 4])
    assert np.flatnonzero(batch["target_mask"][0]).tolist() == [3, 5, 6, 9, 10, 11]


def test_refusals_name_the_request():
    with pytest.raises(DataError, match="request 1: its continuation is 5 tokens, longer than"):
        requests.loglikelihood_plan([[1], [1]], [[2], [2] * 5], [1, 1], 4, VOCAB)
    with pytest.raises(DataError, match="request 0 has an empty context"):
        requests.loglikelihood_plan([[]], [[2]], [1], 4, VOCAB)
    with pytest.raises(DataError, match="request 0 has an empty continuation"):
        requests.loglikelihood_plan([[1]], [[]], [1], 4, VOCAB)
    with pytest.raises(DataError, match="request 0: token id 100 is outside"):
        requests.loglikelihood_plan([[1]], [[100]], [1], 4, VOCAB)


@pytest.mark.parametrize("seq_len", [3, 8])
def test_rolling_windows_are_the_harness_windows(seq_len):
    utils = pytest.importorskip("lm_eval.utils")
    rng = np.random.default_rng(0)
    docs = [rng.integers(0, VOCAB - 1, n).tolist() for n in (1, 2, seq_len, seq_len + 1, 30, 0)]
    prefix = VOCAB - 1
    plan = requests.rolling_plan(docs, [len(d) for d in docs], seq_len, prefix, VOCAB)
    w = plan.windows
    rows = w.rows(np.arange(w.num_windows))
    for d, tokens in enumerate(docs):
        ref = [
            (ctx + cont, cont)
            for ctx, cont in map(
                utils.make_disjoint_window,
                utils.get_rolling_token_windows(tokens, prefix, seq_len, 1),
            )
        ]
        mine = np.flatnonzero(w.document == d)
        assert len(mine) == len(ref)
        for k, (full, cont) in zip(mine, ref, strict=True):
            # HFLM scores (ctx + cont)[-(L + 1):], its last len(cont) targets.
            full, scored = _hflm_row(full[: -len(cont)], cont, seq_len)
            np.testing.assert_array_equal(rows["tokens"][k, : len(full)], full)
            assert np.flatnonzero(rows["target_mask"][k]).tolist() == scored
    sums = requests.per_document(plan, np.ones(w.num_windows))
    np.testing.assert_array_equal(sums, [np.sum(w.document == d) for d in range(len(docs))])
    assert sums[-1] == 0  # an empty document: no window, log-likelihood 0
