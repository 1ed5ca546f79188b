"""The chunked gated delta rule (`ppl_jax.models.layers.gated_delta`) and the pieces it shares with
the SSD scan (`ppl_jax.models.layers.recurrence`) against NumPy float64 token-by-token recurrences
(scan_reference.py); the whole layer against transformers' own `Qwen3_5GatedDeltaNet` and
`Qwen3NextGatedDeltaNet` is in test_scan_layers.py."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from ppl_jax.models.layers import gated_delta, recurrence

import helpers
import scan_reference as ref

B, T, HK, R, DK, DV = 2, 29, 2, 2, 8, 6
# Row 0: a document of 11 tokens, one of 14, then padding; row 1 one document.
SEGMENTS = np.array([[1] * 11 + [2] * 14 + [0] * 4, [1] * T], np.int32)


def inputs(seed=0, decay=1.0):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((B, T, HK, DK)).astype(np.float32)
    k = rng.standard_normal((B, T, HK, DK)).astype(np.float32)
    q = np.asarray(gated_delta.l2_normalize(jnp.asarray(q))) * DK**-0.5
    k = np.asarray(gated_delta.l2_normalize(jnp.asarray(k)))
    v = rng.standard_normal((B, T, HK * R, DV)).astype(np.float32)
    g = (-decay * rng.uniform(0.01, 1.5, (B, T, HK * R))).astype(np.float32)
    beta = rng.uniform(0.05, 1.0, (B, T, HK * R)).astype(np.float32)
    return q, k, v, g, beta


def scan(args, segments=SEGMENTS, **options):
    return helpers.chunked_scan(gated_delta.chunk_gated_delta_rule, args, segments, **options)


@pytest.mark.parametrize("chunk", [1, 4, 7, 8, 64])
def test_matches_the_token_by_token_recurrence(chunk):
    args = inputs()
    o, state = scan(args, chunk=chunk)
    o_ref, state_ref = ref.gated_delta(*args, SEGMENTS)
    np.testing.assert_allclose(o, o_ref, atol=2e-6, rtol=1e-5)
    np.testing.assert_allclose(state, state_ref, atol=2e-6, rtol=1e-5)


def test_strong_and_weak_decays_stay_exact():
    """Decays summing to -400 over a chunk (exp underflows) and to almost 0."""
    for decay in (20.0, 1e-3):
        args = inputs(seed=1, decay=decay)
        o, _ = scan(args, chunk=16)
        np.testing.assert_allclose(o, ref.gated_delta(*args, SEGMENTS)[0], atol=2e-6, rtol=1e-5)


def test_the_chunk_size_changes_no_number():
    spread, _ = helpers.chunk_size_spread(scan, inputs(seed=2))
    assert spread <= 1e-6


def test_a_packed_row_scores_as_its_documents_alone():
    """Row 0's two documents, each alone at the start of a row, give the packed numbers (the
    state does not cross the document start)."""
    args = inputs(seed=3)
    o, _ = scan(args)
    for begin, end in ((0, 11), (11, 25)):
        alone = tuple(a[:1, begin:end] for a in args)
        o_alone, _ = scan(alone, segments=np.ones((1, end - begin), np.int32))
        np.testing.assert_allclose(o[0, begin:end], o_alone[0], atol=1e-6, rtol=0)


def test_a_row_continued_from_its_state():
    """The first part's final state, given to the rest (whose first token starts nothing),
    continues the scan: the state passing that a context axis needs."""
    args = inputs(seed=4)
    one = np.ones((B, T), np.int32)
    whole, final = scan(args, segments=one, chunk=8)
    cut = 13
    first, state = scan(tuple(a[:, :cut] for a in args), segments=one[:, :cut], chunk=8)
    starts = jnp.zeros((B, T - cut), bool)
    rest, final_rest = scan(
        tuple(a[:, cut:] for a in args), chunk=8, initial_state=jnp.asarray(state), starts=starts
    )
    np.testing.assert_allclose(np.concatenate([first, rest], 1), whole, atol=1e-6, rtol=0)
    np.testing.assert_allclose(final_rest, final, atol=1e-6, rtol=0)


def test_causal_conv_restarts_at_segment_starts():
    rng = np.random.default_rng(5)
    x = rng.standard_normal((B, T, 3, 5)).astype(np.float32)
    w = rng.standard_normal((4, 3, 5)).astype(np.float32)
    bias = rng.standard_normal((3, 5)).astype(np.float32)
    starts = recurrence.segment_starts(jnp.asarray(SEGMENTS))
    for b in (None, bias):
        out = recurrence.causal_conv(jnp.asarray(x), jnp.asarray(w), b, starts)
        expected = ref.causal_conv(
            x.reshape(B, T, 15), w.reshape(4, 15), None if b is None else b.reshape(15), SEGMENTS
        )
        np.testing.assert_allclose(np.asarray(out).reshape(B, T, 15), expected, atol=1e-5)


@pytest.mark.parametrize("norm_before_gate", [True, False])
def test_gated_rms_norm(norm_before_gate):
    rng = np.random.default_rng(6)
    x, z = rng.standard_normal((2, 2, 3, 12)), rng.standard_normal((2, 2, 3, 12))
    w = rng.standard_normal(12)
    out = recurrence.gated_rms_norm(
        *(jnp.asarray(a, jnp.float32) for a in (x, z, w)),
        1e-5,
        groups=3,
        norm_before_gate=norm_before_gate,
    )
    h = x if norm_before_gate else x * ref.silu(z)
    h = h.reshape(2, 2, 3, 3, 4)
    h = (h / np.sqrt(np.mean(h * h, -1, keepdims=True) + 1e-5)).reshape(x.shape) * w
    expected = h * ref.silu(z) if norm_before_gate else h
    np.testing.assert_allclose(np.asarray(out), expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("decay", [1.0, 20.0])
def test_the_rounding_is_that_of_the_inputs(decay):
    """The chunked rule loses no digits of its own: at every chunk size its float32 output is as
    far from the float64 recurrence as the recurrence moves when its float32 inputs move by half
    an ulp (the most their own rounding moves them; the largest of 16 draws), within a factor of
    2 (measured: at most 0.42 of it here, up to 1.7 on other draws of the inputs). Per head, on
    the scale the gated RMSNorm gives the output (each vector over its rms): what reaches the
    next layer. A formulation that loses digits fails: decays taken as differences of cumulative
    sums (`exp(cum_i - cum_j)`, transformers' ordering) are 12 times the floor under decay 20."""
    args = inputs(seed=0, decay=decay)
    unit = lambda o: o / np.sqrt(np.mean(o * o, -1, keepdims=True) + 1e-6)  # noqa: E731
    exact = unit(ref.gated_delta(*args, SEGMENTS)[0])
    rng = np.random.default_rng(8)
    floor = max(
        np.abs(unit(ref.gated_delta(*(a * (1 + 2.0**-24 * rng.uniform(-1, 1, a.shape))
                                      for a in args), SEGMENTS)[0]) - exact).max()
        for _ in range(16)
    )  # fmt: skip
    for chunk in (1, 3, 8, 16, 64):
        err = np.abs(unit(scan(args, chunk=chunk)[0]) - exact).max()
        assert err < 2 * floor, (chunk, err, floor)
