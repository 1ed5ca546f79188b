"""The long-context position curve (`ppl_jax.metrics.position`): buckets that add up, bands of a
bootstrap over documents (restated here), context gains that are the exact difference of sums."""

import math

import numpy as np
import pytest

from ppl_jax.metrics import curves, position


def corpus(seed=0, docs=(300, 40, 1000, 7, 1000)):
    """Per-token NLLs (float32) of documents scored whole: positions 1..n-1 of each."""
    rng = np.random.default_rng(seed)
    nll, pos, doc = [], [], []
    for d, n in enumerate(docs):
        p = np.arange(1, n)
        nll.append((3.0 / np.sqrt(p) + rng.gamma(2.0, 0.7, size=p.size)).astype(np.float32))
        pos.append(p)
        doc.append(np.full(p.size, d))
    return np.concatenate(nll), np.concatenate(pos), np.concatenate(doc)


def test_buckets_add_up_to_the_total():
    nll, pos, doc = corpus()
    curve = position.document_curve(nll, pos, doc, 1024, samples=0)
    buckets = curve["buckets"]
    assert curve["bucketing"] == "log" and len(buckets) <= 64
    assert sum(b["num_tokens"] for b in buckets) == curve["total"]["num_tokens"] == nll.size
    total = math.fsum(nll.astype(np.float64).tolist())
    assert curve["total"]["nll_sum"] == total  # the exactly rounded sum of the tokens
    assert math.fsum(b["nll_sum"] for b in buckets) == pytest.approx(total, rel=1e-15, abs=0)
    edges = curves.bucket_edges(1024)
    for b in buckets:
        mine = (pos >= b["first"]) & (pos <= b["last"])
        assert b["nll_sum"] == math.fsum(nll[mine].astype(np.float64).tolist())
        assert b["documents"] == np.unique(doc[mine]).size
        assert b["first"] in edges
    # far buckets: only the two longest documents reach them
    assert buckets[-1]["documents"] == 2 and buckets[0]["documents"] == 5


def test_bands_are_a_bootstrap_over_documents():
    nll, pos, doc = corpus()
    samples, seed = 200, 7
    curve = position.document_curve(nll, pos, doc, 1024, samples=samples, seed=seed)
    edges = curves.bucket_edges(1024)
    # The bootstrap restated: draw 5 documents with replacement, 200 times, one generator.
    draws = np.random.default_rng(seed).integers(0, 5, size=(samples, 5))
    for b in curve["buckets"]:
        k = int(np.searchsorted(edges, b["first"]))
        mine = (pos >= edges[k]) & (pos < edges[k + 1])
        per_doc = np.asarray([nll[mine & (doc == d)].astype(np.float64).sum() for d in range(5)])
        counts = np.asarray([(mine & (doc == d)).sum() for d in range(5)])
        s, c = per_doc[draws].sum(1), counts[draws].sum(1)
        ratio = s[c > 0] / c[c > 0]
        want = np.exp(np.quantile(ratio, [0.025, 0.975]))
        np.testing.assert_allclose(b["perplexity_interval"], want, rtol=1e-12)
        lo, hi = b["perplexity_interval"]
        assert lo <= hi
    assert curve["intervals"]["unit"] == "document" and curve["intervals"]["units"] == 5


def test_a_bucket_of_one_document_has_no_band():
    nll, pos, doc = corpus(docs=(50, 2000))
    curve = position.document_curve(nll, pos, doc, 2048, samples=100)
    last = curve["buckets"][-1]
    assert last["documents"] == 1 and last["perplexity_interval"] is None
    assert curve["buckets"][0]["perplexity_interval"] is not None
    off = position.document_curve(nll, pos, doc, 2048, samples=0)
    assert all(b["perplexity_interval"] is None for b in off["buckets"])
    assert off["intervals"] is None


def test_context_gains_are_the_exact_difference_of_the_sums():
    nll, pos, doc = corpus(seed=1)
    rng = np.random.default_rng(2)
    c = 64
    short = np.where(pos >= c, nll + rng.normal(0.05, 0.3, size=nll.size), np.nan)
    short = short.astype(np.float32)
    curve = position.document_curve(nll, pos, doc, 1024, short, samples=0)
    gain = curve["context_gain"]
    again = pos >= c
    long64, short64 = nll[again].astype(np.float64), short[again].astype(np.float64)
    assert gain["num_tokens"] == int(again.sum())
    per_token = short64 - long64  # exact: float32 values of like magnitude
    assert gain["gain_sum"] == math.fsum(per_token.tolist())  # bit for bit
    assert gain["gain_sum"] == math.fsum(np.concatenate([short64, -long64]).tolist())
    assert gain["long_nll_sum"] == math.fsum(long64.tolist())
    assert gain["short_nll_sum"] == math.fsum(short64.tolist())
    assert gain["gain_per_token"] == pytest.approx(per_token.mean(), rel=1e-12)
    rows = [b for b in curve["buckets"] if b["context_gain"]["num_tokens"]]
    assert (
        rows[0]["first"] <= c <= rows[0]["last"]
        and sum(b["context_gain"]["num_tokens"] for b in rows) == gain["num_tokens"]
    )
    assert math.fsum(b["context_gain"]["gain_sum"] for b in rows) == pytest.approx(
        gain["gain_sum"], rel=1e-12
    )
    below = [b for b in curve["buckets"] if b["last"] < c]
    assert below and all(b["context_gain"]["num_tokens"] == 0 for b in below)


def test_bad_input_is_refused():
    nll, pos, doc = corpus()
    with pytest.raises(ValueError, match="position outside"):
        position.document_curve(nll, pos + 2000, doc, 1024)
    bad = nll.copy()
    bad[3] = np.inf
    with pytest.raises(ValueError, match="non-finite"):
        position.document_curve(bad, pos, doc, 1024)
