"""Memory-bounded NLL: equal to the full log-softmax, and no `[batch, seq, vocab]` buffer."""

import dataclasses
import math
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ppl_jax.models import registry
from ppl_jax.models.interface import HiddenStates, Logits
from ppl_jax.scoring.nll import token_stats
from ppl_jax.scoring.scorer import score_step

import helpers


def reference(hidden, unembedding, targets):
    """NumPy float64: full logits, log-softmax, entropy, argmax."""
    logits = np.asarray(hidden, np.float64) @ np.asarray(unembedding, np.float64)
    m = logits.max(-1, keepdims=True)
    lse = m[..., 0] + np.log(np.exp(logits - m).sum(-1))
    logp = logits - lse[..., None]
    nll = -np.take_along_axis(logp, np.asarray(targets)[..., None], -1)[..., 0]
    entropy = -(np.exp(logp) * logp).sum(-1)
    return nll, entropy, logits.argmax(-1) == np.asarray(targets)


@pytest.mark.parametrize(
    "vocab,block", [(1000, 128), (1000, 1000), (1000, 4096), (257, 1), (50257, 8192)]
)
def test_blocked_equals_full_computation(vocab, block):
    rng = np.random.default_rng(vocab + block)
    hidden = jnp.asarray(rng.standard_normal((2, 7, 24)) * 2, jnp.float32)
    unembedding = jnp.asarray(rng.standard_normal((24, vocab)), jnp.float32)
    targets = jnp.asarray(rng.integers(0, vocab, (2, 7)), jnp.int32)
    targets = targets.at[0, 0].set(vocab - 1)  # the last (padded) block's edge
    stats = jax.jit(token_stats, static_argnums=2)(
        HiddenStates(hidden, unembedding), targets, block
    )
    nll, entropy, correct = reference(hidden, unembedding, targets)
    np.testing.assert_allclose(stats.nll, nll, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(stats.entropy, entropy, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(stats.correct, correct)
    # The Logits path (a model that gives logits) agrees too.
    full = token_stats(Logits(hidden @ unembedding), targets)
    np.testing.assert_allclose(full.nll, nll, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(full.entropy, entropy, rtol=1e-5, atol=1e-5)


def test_top1_counts_a_target_that_is_the_argmax():
    unembedding = jnp.eye(4, 10, dtype=jnp.float32) * 5.0
    hidden = jnp.asarray([[[1.0, 0, 0, 0], [0, 0, 1.0, 0]]], jnp.float32)
    stats = token_stats(HiddenStates(hidden, unembedding), jnp.asarray([[0, 3]]), block=3)
    assert stats.correct.tolist() == [[True, False]]
    # Uniform over the 9 other ids for position 0 except its own: entropy below log(10).
    assert float(stats.entropy[0, 0]) < math.log(10)


def _largest_buffer_elements(hlo_text: str) -> int:
    largest = 0
    for dims in re.findall(r"[fsu](?:32|16|8|64)\[([0-9,]+)\]", hlo_text):
        largest = max(largest, math.prod(int(d) for d in dims.split(",")))
    return largest


def test_compiled_step_holds_no_batch_seq_vocab_buffer():
    cfg = dataclasses.replace(helpers.TINY, vocab_size=65536, max_positions=64)
    model = registry.build(cfg.to_dict(), jnp.float32)
    b, t = 4, 32  # b * t * vocab = 8.4M elements; the unembedding is 2.1M
    abstract_batch = {
        "tokens": jax.ShapeDtypeStruct((b, t + 1), jnp.int32),
        "target_mask": jax.ShapeDtypeStruct((b, t + 1), jnp.bool_),
        "segment_ids": jax.ShapeDtypeStruct((b, t + 1), jnp.int32),
        "positions": jax.ShapeDtypeStruct((b, t + 1), jnp.int32),
    }
    compiled = (
        jax.jit(lambda p, x: score_step(model.apply, p, x))
        .lower(model.abstract_params, abstract_batch)
        .compile()
    )
    full = b * t * cfg.vocab_size
    assert _largest_buffer_elements(compiled.as_text()) < full // 2
    memory = compiled.memory_analysis()
    if memory is not None:
        assert memory.temp_size_in_bytes < full * 4 // 2
    # The check itself can fail: the unbounded computation does hold such a buffer.
    unbounded = (
        jax.jit(lambda h, w: jax.nn.log_softmax(h @ w))
        .lower(
            jax.ShapeDtypeStruct((b, t, cfg.embed_dim), jnp.float32),
            jax.ShapeDtypeStruct((cfg.embed_dim, cfg.vocab_size), jnp.float32),
        )
        .compile()
    )
    assert _largest_buffer_elements(unbounded.as_text()) >= full


def test_top_k_and_reference_hold_no_batch_seq_vocab_buffer():
    b, t, vocab = 4, 32, 65536
    abstract = HiddenStates(
        jax.ShapeDtypeStruct((b, t, 32), jnp.float32),
        jax.ShapeDtypeStruct((32, vocab), jnp.float32),
    )
    # Another hidden width. (Not bfloat16 here: XLA's CPU backend has no bfloat16 matmul and
    # hoists a float32 copy of the whole reference unembedding out of the loop.)
    reference = HiddenStates(
        jax.ShapeDtypeStruct((b, t, 48), jnp.float32),
        jax.ShapeDtypeStruct((48, vocab), jnp.float32),
    )
    targets = jax.ShapeDtypeStruct((b, t), jnp.int32)
    compiled = (
        jax.jit(lambda o, y, r: token_stats(o, y, top_k=20, reference=r))
        .lower(abstract, targets, reference)
        .compile()
    )
    full = b * t * vocab
    assert _largest_buffer_elements(compiled.as_text()) < full // 2
    memory = compiled.memory_analysis()
    if memory is not None:
        assert memory.temp_size_in_bytes < full * 4 // 2
    # The check can fail: the same options on materialised logits do hold such a buffer.
    materialised = (
        jax.jit(lambda o, y, r: token_stats(Logits(o.hidden @ o.unembedding), y, 20, 20, r))
        .lower(abstract, targets, reference)
        .compile()
    )
    assert _largest_buffer_elements(materialised.as_text()) >= full
