"""Top-k alternatives and the divergence from a reference model (`token_stats(top_k=,
reference=)`), against NumPy float64 computed from the full logits."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ppl_jax.models.interface import HiddenStates, Logits
from ppl_jax.scoring import nll

# Compiled once per shape and option set: eager dispatch of the blocked scan is slow on a CPU.
token_stats = jax.jit(nll.token_stats, static_argnames=("block", "top_k"))


def numpy_stats(logits, ref_logits, targets, k):
    """Float64: top-k ids (stable argsort of -logits) and log-probs, KL(ref || model), the
    reference's NLL of the target, and whether both argmaxes (lowest id among ties) agree."""
    logits = np.asarray(logits, np.float64)
    ref_logits = np.asarray(ref_logits, np.float64)
    targets = np.asarray(targets)

    def log_softmax(x):
        m = x.max(-1, keepdims=True)
        return x - (m + np.log(np.exp(x - m).sum(-1, keepdims=True)))

    logp, ref_logp = log_softmax(logits), log_softmax(ref_logits)
    ids = np.argsort(-logits, axis=-1, kind="stable")[..., :k]
    return {
        "top_ids": ids,
        "top_logprobs": np.take_along_axis(logp, ids, -1),
        # 0 log 0 = 0: an id the reference rules out adds nothing.
        "kl": (np.exp(ref_logp) * np.where(np.isneginf(ref_logp), 0, ref_logp - logp)).sum(-1),
        "reference_nll": -np.take_along_axis(ref_logp, targets[..., None], -1)[..., 0],
        "same_top1": logits.argmax(-1) == ref_logits.argmax(-1),
    }


def grid(rng, shape, scale):
    """Small multiples of a power of two: float32 (and bfloat16) matmuls of them are exact, so
    the float64 logits are the device's, and equal logits (ties) are common."""
    return rng.integers(-2, 3, shape).astype(np.float32) * scale


def models(vocab, seed, *, batch=2, seq=7, dim=24, extra=8):
    """The model, a nearby reference (wider hidden states: the model's plus `extra` dims with a
    small unembedding, in bfloat16) and a far one (an independent random unembedding)."""
    rng = np.random.default_rng(seed)
    hidden = grid(rng, (batch, seq, dim), 1.0)
    unembedding = grid(rng, (dim, vocab), 1 / 8)
    near_hidden = np.concatenate([hidden, grid(rng, (batch, seq, extra), 1.0)], -1)
    near_unembedding = np.concatenate([unembedding, grid(rng, (extra, vocab), 1 / 64)], 0)
    far_hidden = grid(rng, (batch, seq, extra), 1.0)
    far_unembedding = grid(rng, (extra, vocab), 1 / 4)
    targets = rng.integers(0, vocab, (batch, seq)).astype(np.int32)
    targets[0, 0] = vocab - 1  # the remainder block's last column
    model = HiddenStates(jnp.asarray(hidden), jnp.asarray(unembedding))
    near = HiddenStates(
        jnp.asarray(near_hidden, jnp.bfloat16), jnp.asarray(near_unembedding, jnp.bfloat16)
    )
    far = HiddenStates(jnp.asarray(far_hidden), jnp.asarray(far_unembedding))
    return model, near, far, jnp.asarray(targets)


def full(output):
    return np.asarray(output.hidden, np.float64) @ np.asarray(output.unembedding, np.float64)


def check(stats, expected, k):
    assert stats.top_ids.shape == expected["top_ids"].shape and stats.top_ids.dtype == jnp.int32
    np.testing.assert_array_equal(stats.top_ids, expected["top_ids"])
    np.testing.assert_allclose(stats.top_logprobs, expected["top_logprobs"], rtol=0, atol=1e-5)
    np.testing.assert_allclose(stats.kl, expected["kl"], rtol=0, atol=1e-5)
    np.testing.assert_allclose(stats.reference_nll, expected["reference_nll"], rtol=0, atol=1e-5)
    np.testing.assert_array_equal(stats.same_top1, expected["same_top1"])
    for name in ("top_logprobs", "kl", "reference_nll"):
        assert getattr(stats, name).dtype == jnp.float32


@pytest.mark.parametrize(
    "vocab,block,k,far",
    [
        (1000, 128, 20, False),  # vocab not a multiple of block
        (257, 1, 20, True),  # block = 1, k > block
        (50, 16, 20, False),  # k > block, a remainder block narrower than k
        (10, 3, 10, True),  # k = vocab
        (20, 4096, 20, False),  # k = vocab, block > vocab
    ],
)
def test_blocked_top_k_and_reference_equal_numpy(vocab, block, k, far):
    model, near_ref, far_ref, targets = models(vocab, seed=vocab + block + k)
    reference = far_ref if far else near_ref
    logits = full(model)
    assert (np.sort(logits, -1)[..., 1:] == np.sort(logits, -1)[..., :-1]).any()  # ties occur
    expected = numpy_stats(logits, full(reference), targets, k)
    step = jax.jit(nll.token_stats, static_argnames=("block", "top_k"))
    check(step(model, targets, block=block, top_k=k, reference=reference), expected, k)
    # The cases really are near and far.
    if far:
        assert expected["kl"].min() > 0.1 and not expected["same_top1"].all()
    else:
        assert 0 < expected["kl"].min() and expected["kl"].max() < 0.1


def test_logits_paths_agree_with_numpy():
    """A model or a reference that gives `Logits`, in each combination."""
    model, near, far, targets = models(50, seed=2)
    logits = full(model)
    as_logits = Logits(jnp.asarray(logits, jnp.float32))
    for reference in (near, far):
        expected = numpy_stats(logits, full(reference), targets, 20)
        check(token_stats(as_logits, targets, top_k=20, reference=reference), expected, 20)
        ref_logits = Logits(jnp.asarray(full(reference)))
        check(token_stats(as_logits, targets, top_k=20, reference=ref_logits), expected, 20)
    # Reference logits in bfloat16 (rounded: the expectation uses the rounded ones), sliced in
    # the blocked scan.
    rounded = Logits(jnp.asarray(full(near), jnp.bfloat16))
    expected = numpy_stats(logits, np.asarray(rounded.logits, np.float64), targets, 20)
    check(token_stats(model, targets, block=16, top_k=20, reference=rounded), expected, 20)


def test_options_keep_the_three_statistics_and_agree_with_each_other():
    model, near, _, targets = models(1000, seed=3)
    targets = targets.at[1].set(jnp.argmax(model.hidden[1] @ model.unembedding, axis=-1))
    plain = token_stats(model, targets, block=128)
    assert plain.top_ids is None and plain.kl is None and plain.same_top1 is None
    stats = token_stats(model, targets, block=128, top_k=20, reference=near)
    for name in ("nll", "entropy", "correct"):
        np.testing.assert_array_equal(getattr(stats, name), getattr(plain, name))
    # Where the target is the most probable id, its top-1 log-probability is exactly -NLL.
    first = np.asarray(stats.top_ids[..., 0]) == np.asarray(targets)
    assert first.any()
    np.testing.assert_array_equal(-np.asarray(stats.top_logprobs[..., 0])[first], plain.nll[first])
    assert np.all(np.diff(np.asarray(stats.top_logprobs), axis=-1) <= 0)


def test_gaussian_logits_keep_kl_within_tolerance():
    """Unquantised float32 weights at the scale of a trained model's logits."""
    rng = np.random.default_rng(7)
    hidden = rng.standard_normal((2, 9, 32)).astype(np.float32)
    unembedding = rng.standard_normal((32, 5000)).astype(np.float32)
    noise = rng.standard_normal((32, 5000)).astype(np.float32) * 0.1
    targets = jnp.asarray(rng.integers(0, 5000, (2, 9)), jnp.int32)
    model = HiddenStates(jnp.asarray(hidden), jnp.asarray(unembedding))
    reference = HiddenStates(jnp.asarray(hidden), jnp.asarray(unembedding + noise))
    stats = token_stats(model, targets, block=512, top_k=20, reference=reference)
    expected = numpy_stats(full(model), full(reference), targets, 20)
    assert expected["kl"].min() > 0 and expected["kl"].max() > 1e-2
    np.testing.assert_allclose(stats.kl, expected["kl"], rtol=0, atol=1e-5)
    np.testing.assert_allclose(stats.top_logprobs, expected["top_logprobs"], rtol=0, atol=1e-5)
    np.testing.assert_allclose(stats.reference_nll, expected["reference_nll"], atol=1e-5)


@pytest.mark.parametrize("as_logits", [False, True])
def test_a_model_against_itself_has_no_divergence(as_logits):
    model, _, _, targets = models(1000, seed=5)
    rng = np.random.default_rng(5)
    gaussian = HiddenStates(
        jnp.asarray(rng.standard_normal((2, 7, 24)), jnp.float32),
        jnp.asarray(rng.standard_normal((24, 1000)), jnp.float32),
    )
    for output in (model, gaussian):
        if as_logits:
            output = Logits(output.hidden @ output.unembedding)
        copy = jax.tree.map(jnp.array, output)  # another buffer holding the same numbers
        step = jax.jit(nll.token_stats, static_argnames=("block", "top_k"))
        for reference in (output, copy):
            stats = step(output, targets, block=128, reference=reference)
            assert np.abs(np.asarray(stats.kl)).max() <= 1e-6
            assert np.asarray(stats.same_top1).all()
            np.testing.assert_allclose(stats.reference_nll, stats.nll, rtol=0, atol=1e-6)


def test_jit_traces_once_per_option_set():
    model, near, _, targets = models(300, seed=11)
    traces = []

    def counted(output, targets, reference):
        traces.append(1)
        return token_stats(output, targets, block=64, top_k=4, reference=reference)

    step = jax.jit(counted)
    first = step(model, targets, near)
    second = step(model, targets + 0, near)
    assert len(traces) == 1
    np.testing.assert_array_equal(first.top_ids, second.top_ids)
    check(first, numpy_stats(full(model), full(near), targets, 4), 4)


def test_a_reference_that_rules_out_ids_adds_nothing_for_them():
    """Reference logits of -inf (masked ids): p_ref = 0 there, so KL stays finite."""
    model, near, _, targets = models(50, seed=4)
    ref_logits = full(near)
    ref_logits[..., 30:] = -np.inf  # ids 30..49, spanning blocks
    ref_logits[..., 3] = -np.inf
    targets = jnp.minimum(targets, 29).at[0, 0].set(7)
    expected = numpy_stats(full(model), ref_logits, targets, 3)
    assert np.isfinite(expected["kl"]).all() and expected["kl"].min() > 0
    for output in (model, Logits(jnp.asarray(full(model), jnp.float32))):
        stats = token_stats(output, targets, block=16, top_k=3, reference=Logits(ref_logits))
        check(stats, expected, 3)


def test_top_k_may_be_a_numpy_integer():
    model, _, _, targets = models(10, seed=1)
    stats = token_stats(model, targets, top_k=np.int64(3))
    np.testing.assert_array_equal(
        stats.top_ids, numpy_stats(full(model), full(model), targets, 3)["top_ids"]
    )


@pytest.mark.parametrize("top_k", [-1, 21, 11, True, 2.0])
def test_top_k_out_of_range_is_refused(top_k):
    model, _, _, targets = models(10, seed=1)  # a vocabulary of 10 < 11
    with pytest.raises(ValueError, match="top_k"):
        token_stats(model, targets, top_k=top_k)


def test_a_reference_of_another_vocabulary_or_shape_is_refused():
    model, _, _, targets = models(10, seed=1)
    other, _, _, _ = models(11, seed=1)
    with pytest.raises(ValueError, match="11 token ids"):
        token_stats(model, targets, reference=other)
    with pytest.raises(ValueError, match="11 token ids"):
        token_stats(Logits(model.hidden @ model.unembedding), targets, reference=other)
    shorter = HiddenStates(model.hidden[:, :3], model.unembedding)
    with pytest.raises(ValueError, match="same batch"):
        token_stats(model, targets, reference=shorter)
