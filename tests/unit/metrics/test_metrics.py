"""Metrics: the perplexity primers' worked examples, and the formulas against NumPy float64."""

import math

import numpy as np
import pytest

from ppl_jax.metrics.sums import Sums, derive, gzip_bits_per_byte, perplexity_of_probabilities


def test_three_token_example():
    # P = 0.2, 0.1, 0.4: (0.2 * 0.1 * 0.4) ** (-1/3) = 0.008 ** (-1/3) = 5.
    assert perplexity_of_probabilities([0.2, 0.1, 0.4]) == pytest.approx(5.0, rel=1e-12)


def test_red_fox_sentence():
    # "a red fox ." with 0.4 * 0.27 * 0.55 * 0.79 -> 2.15 (Jurafsky & Martin style example).
    assert round(perplexity_of_probabilities([0.4, 0.27, 0.55, 0.79]), 2) == 2.15


def test_uniform_model_over_six_words():
    assert perplexity_of_probabilities([1 / 6] * 17) == pytest.approx(6.0, rel=1e-12)


def test_mean_nll_1_2_nats():
    m = derive(Sums(nll_sum=1.2 * 10, num_tokens=10))
    assert round(m["perplexity"], 2) == 3.32
    assert m["nll_per_token"] == pytest.approx(1.2)


def test_one_bit_per_token_is_perplexity_two():
    n = 1000
    m = derive(Sums(nll_sum=n * math.log(2), num_tokens=n))
    assert m["bits_per_token"] == pytest.approx(1.0, rel=1e-12)
    assert m["perplexity"] == pytest.approx(2.0, rel=1e-12)


def test_derived_metrics_against_numpy_float64():
    rng = np.random.default_rng(0)
    nll = rng.gamma(2.0, 1.0, size=5000)  # per-token NLL, nats
    num_bytes, num_words = 17_123, 3_456
    m = derive(
        Sums(
            nll_sum=float(nll.sum()), num_tokens=nll.size, num_bytes=num_bytes, num_words=num_words
        )
    )
    assert m["perplexity"] == pytest.approx(np.exp(nll.mean()), rel=1e-12)
    assert m["bits_per_token"] == pytest.approx(nll.mean() / np.log(2), rel=1e-12)
    # Bits per byte are weighted by bytes: total nats over total bytes, not a mean of ratios.
    assert m["bits_per_byte"] == pytest.approx(nll.sum() / num_bytes / np.log(2), rel=1e-12)
    assert m["byte_perplexity"] == pytest.approx(2 ** m["bits_per_byte"], rel=1e-12)
    assert m["word_perplexity"] == pytest.approx(np.exp(nll.sum() / num_words), rel=1e-12)


def test_merge_is_exact_and_not_a_mean_of_means():
    a = Sums(nll_sum=10.0, num_tokens=2, num_bytes=5, num_words=1, num_documents=1, num_windows=1)
    b = Sums(nll_sum=1.0, num_tokens=8, num_bytes=9, num_words=3, num_documents=2, num_windows=4)
    total = Sums.merge([a, b])
    assert total == Sums(11.0, 10, 14, 4, 3, 5)
    # Token-weighted: exp(11 / 10), not exp(mean(10/2, 1/8)).
    assert derive(total)["perplexity"] == pytest.approx(math.exp(1.1), rel=1e-12)
    assert derive(total)["perplexity"] != pytest.approx(math.exp((5 + 0.125) / 2))


def test_zero_denominators_are_none_with_a_reason():
    m = derive(Sums(nll_sum=3.0, num_tokens=3))
    assert m["perplexity"] == pytest.approx(math.e, rel=1e-12)
    assert m["bits_per_byte"] is None and m["byte_perplexity"] is None
    assert m["word_perplexity"] is None
    assert m.notes == {
        "bits_per_byte": "undefined (no bytes)",
        "byte_perplexity": "undefined (no bytes)",
        "word_perplexity": "undefined (no words)",
    }


def test_overflowing_word_perplexity_is_inf_with_a_note():
    # Chinese, base64 or minified code: thousands of tokens, a handful of words. exp(5000 / 1)
    # is beyond float64 (max ~1.8e308 = exp(709.8)); the other metrics stay exact.
    sums = Sums(nll_sum=5000.0, num_tokens=1000, num_bytes=2500, num_words=1)
    m = derive(sums)
    assert m["word_perplexity"] == math.inf
    assert m.notes["word_perplexity"].startswith("inf (overflow: exp(nll_sum / num_words) = exp(5")
    assert "few whitespace-separated words" in m.notes["word_perplexity"]
    assert m["perplexity"] == pytest.approx(np.exp(5.0), rel=1e-12)
    assert m["byte_perplexity"] == pytest.approx(np.exp(2.0), rel=1e-12)
    assert set(m.notes) == {"word_perplexity"}
    # The boundary: exp(709) is finite, exp(710) is not.
    assert math.isfinite(derive(Sums(nll_sum=709.0, num_tokens=1))["perplexity"])
    assert derive(Sums(nll_sum=710.0, num_tokens=1))["perplexity"] == math.inf


@pytest.mark.parametrize(
    "sums",
    [
        Sums(),
        Sums(nll_sum=math.nan, num_tokens=4, num_bytes=4, num_words=1),
        Sums(nll_sum=math.inf, num_tokens=4, num_bytes=4, num_words=1),
        Sums(nll_sum=1e308, num_tokens=1, num_bytes=1, num_words=1, entropy_sum=1e308),
    ],
    ids=["empty", "nan", "inf", "huge"],
)
def test_derive_never_raises_and_every_non_finite_value_has_a_note(sums):
    m = derive(sums)
    assert list(m) == [
        "nll_per_token",
        "perplexity",
        "bits_per_token",
        "bits_per_byte",
        "byte_perplexity",
        "word_perplexity",
        "entropy_per_token",
        "predictive_perplexity",
        "top1_accuracy",
    ]
    for name, value in m.items():
        assert (value is None or math.isinf(value)) == (name in m.notes), name
        assert value is None or not math.isnan(value), name


def test_gzip_baseline_matches_the_gzip_module():
    import gzip

    raw = b"def f(x):\n    return x + 1\n" * 200
    expected = 8 * len(gzip.compress(raw, compresslevel=9)) / len(raw)
    assert gzip_bits_per_byte(raw) == pytest.approx(expected, abs=8 * 8 / len(raw))
    assert gzip_bits_per_byte(raw) < 1.0  # repetitive text compresses well


def test_gzip_baseline_streams_the_joined_text_and_samples_a_prefix():
    from ppl_jax.metrics import sums as metrics

    texts = [f"document {i}: " + "abc def ghi " * (i + 1) + "✓" for i in range(40)]
    joined = "\n\n".join(texts).encode("utf-8")
    bpb, seen = metrics.gzip_bits_per_byte_of(iter(texts), "\n\n")
    assert seen == len(joined) and bpb == metrics.gzip_bits_per_byte(joined)
    bpb, seen = metrics.gzip_bits_per_byte_of(iter(texts), "\n\n", limit=1000)
    assert seen == 1000 and bpb == metrics.gzip_bits_per_byte(joined[:1000])
