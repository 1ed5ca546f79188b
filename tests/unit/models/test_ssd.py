"""The chunked SSD scan of Mamba2 (`ppl_jax.models.layers.ssd`) against a NumPy float64
token-by-token recurrence (scan_reference.py): several chunk sizes (dividing the length and not),
groups shared by several heads, packed rows, a row continued from its state. The whole layer against
transformers' own `Mamba2Mixer` and `FalconH1Mixer` is in test_scan_layers.py."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from ppl_jax.models.layers import ssd

import helpers
import scan_reference as ref

B, T, H, G, P, N = 2, 29, 4, 2, 3, 5
SEGMENTS = np.array([[1] * 11 + [2] * 14 + [0] * 4, [1] * T], np.int32)


def inputs(seed=0, decay=1.0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((B, T, H, P)).astype(np.float32)
    dt = rng.uniform(0.01, 1.0, (B, T, H)).astype(np.float32)
    a = (-decay * rng.uniform(0.5, 4.0, H)).astype(np.float32)
    b = rng.standard_normal((B, T, G, N)).astype(np.float32)
    c = rng.standard_normal((B, T, G, N)).astype(np.float32)
    return x, dt, a, b, c


def scan(args, segments=SEGMENTS, **options):
    return helpers.chunked_scan(ssd.ssd_scan, args, segments, **options)


@pytest.mark.parametrize("chunk", [1, 4, 7, 8, 64])
def test_matches_the_token_by_token_recurrence(chunk):
    args = inputs()
    y, state = scan(args, chunk=chunk)
    y_ref, state_ref = ref.ssd(*args, SEGMENTS)
    np.testing.assert_allclose(y, y_ref, atol=1e-5, rtol=1e-5)
    np.testing.assert_allclose(state, state_ref, atol=1e-5, rtol=1e-5)


def test_strong_and_weak_decays_stay_exact():
    for decay in (50.0, 1e-4):
        args = inputs(seed=1, decay=decay)
        y, _ = scan(args, chunk=16)
        np.testing.assert_allclose(y, ref.ssd(*args, SEGMENTS)[0], atol=1e-5, rtol=1e-5)


def test_the_chunk_size_changes_no_number():
    spread, scale = helpers.chunk_size_spread(scan, inputs(seed=2))
    assert spread <= 1e-6 * scale


def test_a_packed_row_scores_as_its_documents_alone():
    args = inputs(seed=3)
    y, _ = scan(args)
    for begin, end in ((0, 11), (11, 25)):
        alone = tuple(a if a.ndim == 1 else a[:1, begin:end] for a in args)
        y_alone, _ = scan(alone, segments=np.ones((1, end - begin), np.int32))
        np.testing.assert_allclose(y[0, begin:end], y_alone[0], atol=1e-5, rtol=0)


def test_a_row_continued_from_its_state():
    args = inputs(seed=4)
    one = np.ones((B, T), np.int32)
    whole, final = scan(args, segments=one)
    cut = 13
    part = lambda s: tuple(a if a.ndim == 1 else a[:, s] for a in args)  # noqa: E731
    first, state = scan(part(slice(None, cut)), segments=one[:, :cut])
    rest, final_rest = scan(
        part(slice(cut, None)),
        initial_state=jnp.asarray(state),
        starts=jnp.zeros((B, T - cut), bool),
    )
    np.testing.assert_allclose(np.concatenate([first, rest], 1), whole, atol=1e-5, rtol=0)
    np.testing.assert_allclose(final_rest, final, atol=1e-5, rtol=0)
