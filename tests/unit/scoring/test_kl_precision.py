"""KL(reference || model) accurate to about 1e-9 absolute between nearly identical models
(issue 19): the per-token KL of both paths (vocabulary-blocked scan, full logits) against float64
computed from the same float32 logits."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from ppl_jax.models.interface import HiddenStates, Logits
from ppl_jax.scoring import nll

N, V, BLOCK = 64, 5003, 1024  # tokens; a vocabulary of four full blocks and a remainder


def kl_float64(r: np.ndarray, m: np.ndarray) -> np.ndarray:
    def log_softmax(x):
        x = x.astype(np.float64)
        m = x.max(-1, keepdims=True)
        return x - (m + np.log(np.exp(x - m).sum(-1, keepdims=True)))

    lr, ll = log_softmax(r), log_softmax(m)
    p = np.exp(lr)
    with np.errstate(invalid="ignore"):  # 0 * -inf where p is 0: masked out by the where
        return np.where(p > 0, p * (lr - np.where(p > 0, ll, 0)), 0).sum(-1)


def kl_naive_float32(r: np.ndarray, m: np.ndarray) -> np.ndarray:
    """The former formula: E_p[r - m] - (logsumexp(r) - logsumexp(m)), in float32."""
    lse = lambda x: x.max(-1) + np.log(np.exp(x - x.max(-1, keepdims=True)).sum(-1))  # noqa: E731
    p = np.exp(r - lse(r)[:, None])
    return (p * (r - m)).sum(-1, dtype=np.float32) - (lse(r) - lse(m))


def both_paths(r: np.ndarray, m: np.ndarray) -> dict[str, np.ndarray]:
    """The per-token KL of the blocked scan (the model's logits made exactly by a one-hot
    `hidden` times an unembedding that holds them) and of the full-logits path."""
    targets = jnp.zeros((1, N), jnp.int32)
    hidden = jnp.eye(N, dtype=jnp.float32)[None]
    blocked = nll.token_stats(
        HiddenStates(hidden, jnp.asarray(m)), targets, block=BLOCK, reference=Logits(r[None])
    )
    full = nll.token_stats(Logits(m[None]), targets, reference=Logits(r[None]))
    return {"blocked": np.asarray(blocked.kl[0]), "full": np.asarray(full.kl[0])}


@pytest.mark.slow
@pytest.mark.parametrize("sigma", [1.5e-3, 1.5e-2])
def test_nearly_identical_models_kl_within_1e_8(sigma):
    rng = np.random.default_rng(0)
    r = (rng.normal(size=(N, V)) * 3).astype(np.float32)
    model = (r + rng.normal(size=(N, V)) * sigma).astype(np.float32)
    want = kl_float64(r, model)
    assert 1e-7 < want.mean() < 2e-4  # the quantization studies' range
    for path, got in both_paths(r, model).items():
        err = np.abs(got - want)
        assert err.max() < 1e-8, (path, err.max())
        assert np.corrcoef(got, want)[0, 1] > 0.9999, path
    # The former float32 formula misses by far more than this (the test can fail).
    assert np.abs(kl_naive_float32(r, model) - want).max() > 2e-8


@pytest.mark.slow
def test_different_models_kl_within_float32_rounding():
    rng = np.random.default_rng(1)
    r = (rng.normal(size=(N, V)) * 3).astype(np.float32)
    model = (r + rng.normal(size=(N, V)) * 0.5).astype(np.float32)
    want = kl_float64(r, model)
    assert 0.05 < want.mean() < 0.5
    for path, got in both_paths(r, model).items():
        np.testing.assert_allclose(got, want, rtol=2e-5, err_msg=path)


def test_a_model_against_itself_is_exactly_zero_and_excluded_ids_add_nothing():
    rng = np.random.default_rng(2)
    r = (rng.normal(size=(N, V)) * 3).astype(np.float32)
    for got in both_paths(r, r).values():
        assert np.all(got == 0.0)
    ruled_out = r.copy()
    ruled_out[:, ::7] = -np.inf  # the reference rules out every seventh id
    model = (r + rng.normal(size=(N, V)) * 1e-2).astype(np.float32)
    want = kl_float64(ruled_out, model)
    assert 0.05 < want.mean() < 1  # the model's mass on the ruled-out ids counts
    for path, got in both_paths(ruled_out, model).items():
        assert np.all(np.isfinite(got)), path
        np.testing.assert_allclose(got, want, rtol=1e-5, err_msg=path)
    # The model ruling out an id the reference allows: KL is infinite, as it is (full logits; a
    # matmul gives no -inf).
    l_out = model.copy()
    l_out[0, 3] = -np.inf
    got = both_paths(r, l_out)["full"]
    assert got[0] == np.inf and np.all(np.isfinite(got[1:]))


def test_series_match_float64():
    x = np.concatenate(
        [-np.logspace(-8, np.log10(0.249), 50), np.logspace(-8, np.log10(0.249), 50)]
    )
    g = np.asarray(nll._g_series(jnp.asarray(x, jnp.float32)), np.float64)
    h = np.asarray(nll._h(jnp.asarray(x, jnp.float32)), np.float64)
    x32 = x.astype(np.float32).astype(np.float64)
    np.testing.assert_allclose(g, x32 + np.expm1(-x32), rtol=1e-6)
    np.testing.assert_allclose(h, np.log1p(x32) - x32, rtol=2e-5, atol=1e-9)
