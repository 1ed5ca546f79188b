"""`hf_strided` reports the Hugging Face guide's loop as published beside its exact count
(`protocol.published` in results.json): against the guide's loop replayed in NumPy over the
reference's own per-window numbers (tests/golden/references, written by transformers in
PyTorch); tests/reference/test_references_live.py runs the loop itself, `outputs.loss` and all."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest

from ppl_jax.outputs import console

from test_references import GOLDEN, case_ids, family_dir, rel, run, stream_corpus  # noqa: F401


def replay(ref: dict, max_length: int, stride: int) -> float:
    """The guide's loop over the reference's tokens, each window's `outputs.loss` being its NLL
    sum over its scored labels divided by their count (what the mean is), weighted as published
    by `num_valid_tokens - batch_size`."""
    n = len(ref["ids"])
    windows = iter(zip(ref["window_nll"], ref["window_tokens"], strict=True))
    nll_sum, n_tokens, prev_end_loc = 0.0, 0, 0
    for begin_loc in range(0, n, stride):
        end_loc = min(begin_loc + max_length, n)
        trg_len = end_loc - prev_end_loc
        width = end_loc - begin_loc
        scored = min(trg_len, width - 1)  # the labels after the shift that are not -100
        loss = math.nan
        if scored:
            nll, count = next(windows)
            assert count == scored
            loss = nll / count
        num_valid_tokens = min(trg_len, width)
        nll_sum += loss * (num_valid_tokens - 1)
        n_tokens += num_valid_tokens - 1
        prev_end_loc = end_loc
        if end_loc == n:
            break
    return math.exp(nll_sum / n_tokens)


@pytest.mark.parametrize(
    "case",
    GOLDEN["hf_strided"],
    ids=case_ids(GOLDEN["hf_strided"], "family", "max_length", "stride"),
)
def test_hf_strided_reports_the_guides_loop_as_published(stream_corpus, case):  # noqa: F811
    m, s = case["max_length"], case["stride"]
    ev, results = run(
        family_dir(case["family"]), "hf_strided", stream_corpus["jsonl"], seq_len=m, stride=s
    )
    found = results["protocol"]["published"]
    expected = replay(case, m, s)
    assert found["name"] == "hf_guide_loop"
    assert rel(found["perplexity"], expected) < 1e-5  # the NLL sums agree to 1e-5 (golden)
    exact = results["perplexity"]
    assert exact == pytest.approx(math.exp(ev.sums.nll_sum / ev.sums.num_tokens), rel=1e-12)
    if s < m and ev.sums.num_windows > 1:  # later windows weighted by one label fewer
        assert rel(found["perplexity"], exact) > 1e-7
        assert found["weighted_tokens"] == ev.sums.num_tokens - (ev.sums.num_windows - 1)
    table = console.summary_table(results)
    assert re.search(rf"\n  as published +{found['perplexity']:.4f}   \(the guide's loop", table)


def test_other_protocols_report_no_published_loop(stream_corpus):  # noqa: F811
    case = GOLDEN["hf_strided"][0]
    _, results = run(
        family_dir(case["family"]), "sliding", stream_corpus["jsonl"], seq_len=16, stride=8
    )
    assert results["protocol"]["published"] is None
    assert "as published" not in console.summary_table(results)
    assert np.isfinite(results["perplexity"])
