"""The 95% bands of the curves (`uncertainty.curve_intervals`): a plain NumPy bootstrap loop gives
the same intervals, one column equals the run's own interval, and the band behaves as a band."""

from __future__ import annotations

import math

import numpy as np
import pytest

from ppl_jax.metrics import uncertainty


def unit_sums(u: int, k: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, 50, (u, k))
    nll = tokens * rng.uniform(1.0, 5.0, (u, k))
    return nll, tokens


def numpy_bootstrap(nll, tokens, samples, seed, block):
    """The circular block bootstrap written out one replicate at a time (float64, no chunks): a
    block starts at any unit and runs on past the last at the first."""
    u = nll.shape[0]
    draws = math.ceil(u / block)
    rng = np.random.default_rng(seed)
    ratios = []
    for _ in range(samples):
        picks = rng.integers(0, u, size=draws)
        rows = np.concatenate([np.arange(p, p + block) % u for p in picks])
        with np.errstate(invalid="ignore", divide="ignore"):
            ratios.append(nll[rows].sum(axis=0) / tokens[rows].sum(axis=0))
    ratios = np.asarray(ratios)
    out = []
    for j in range(nll.shape[1]):
        if np.count_nonzero(tokens[:, j]) < 2:
            out.append(None)
            continue
        r = ratios[:, j]
        r = r[np.isfinite(r)]
        lo, hi = np.quantile(r, [0.025, 0.975])
        out.append([math.exp(lo), math.exp(hi)])
    return out


@pytest.mark.parametrize("u, k, block", [(40, 3, 1), (97, 64, 1), (200, 5, 6), (30, 130, 4)])
def test_curve_intervals_equal_a_plain_numpy_bootstrap(u, k, block):
    nll, tokens = unit_sums(u, k)
    tokens[:, 0] = np.maximum(tokens[:, 0], 1)
    found = uncertainty.curve_intervals(nll, tokens, 300, 7, block)
    expected = numpy_bootstrap(nll.astype(float), tokens.astype(float), 300, 7, block)
    for j in range(k):
        if expected[j] is None:
            assert found[j] is None
        else:
            np.testing.assert_allclose(found[j], expected[j], rtol=1e-12)


def test_one_column_is_the_runs_own_interval():
    nll, tokens = unit_sums(500, 1, seed=3)
    tokens = np.maximum(tokens, 1)
    units = uncertainty.Units("window", nll[:, 0], tokens[:, 0], tokens[:, 0] * 4, 8)
    own = uncertainty.intervals(units, 1000, 11)["perplexity"]
    (found,) = uncertainty.curve_intervals(nll, tokens, 1000, 11, 8)
    np.testing.assert_allclose(found, own, rtol=1e-12)


def test_the_band_holds_the_estimate_and_narrows_with_more_units():
    rng = np.random.default_rng(5)

    def width(u: int) -> float:
        tokens = np.full((u, 1), 100)
        nll = tokens * (3.0 + rng.normal(0, 0.3, (u, 1)))
        (iv,) = uncertainty.curve_intervals(nll, tokens, 1000, 0)
        point = math.exp(nll.sum() / tokens.sum())
        assert iv[0] < point < iv[1]
        return iv[1] - iv[0]

    assert width(1000) < 0.5 * width(50)


def test_points_without_two_units_have_no_interval_and_bad_shapes_are_refused():
    nll = np.array([[1.0, 2.0], [0.0, 3.0], [0.0, 1.0]])
    tokens = np.array([[1, 1], [0, 1], [0, 1]])
    found = uncertainty.curve_intervals(nll, tokens, 100, 0)
    assert found[0] is None and found[1] is not None
    with pytest.raises(ValueError):
        uncertainty.curve_intervals(nll[:, 0], tokens[:, 0], 100, 0)
    with pytest.raises(ValueError):
        uncertainty.curve_intervals(nll[:0], tokens[:0], 100, 0)
