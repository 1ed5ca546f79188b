"""The NLL's own chunk (`model.token_chunk=0`): each block of logits stays within a bound that
the vocabulary and the tokens per device set, with the same numbers."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ppl_jax.config.defaults import DEFAULT_RULES
from ppl_jax.models import registry
from ppl_jax.runtime import mesh as mesh_lib
from ppl_jax.scoring.nll import VOCAB_BLOCK
from ppl_jax.scoring.scorer import Scorer, StepOptions, logits_budget, nll_chunk
from ppl_jax.scoring.step import LOGITS_BUDGET, logits_chunk

import helpers


@pytest.mark.parametrize(
    "rows,tokens,vocab", [(1, 4096, 50257), (4, 4096, 50257), (8, 1024, 128256), (1, 3000, 300)]
)
def test_the_chunk_is_the_largest_power_of_two_whose_block_fits(rows, tokens, vocab):
    budget = 16 * 2**20
    chunk = logits_chunk(rows, tokens, vocab, budget)
    block = rows * min(VOCAB_BLOCK, vocab) * 4  # bytes per token of the chunk
    if tokens * block <= budget:
        assert chunk == 0
    else:
        assert chunk & (chunk - 1) == 0 and chunk * block <= budget < 2 * chunk * block


def test_the_chunk_counts_the_tokens_and_rows_of_one_device():
    # 32,768 targets over 8 devices on `context`: 4,096 each; 16 rows over 8 on `data`: 2 each.
    assert nll_chunk(1, 32769, 50257, context=8, budget=16 * 2**20) == 1024
    assert nll_chunk(16, 1025, 50257, data=8, budget=16 * 2**20) == 512
    assert nll_chunk(16, 1025, 256, data=8, budget=16 * 2**20) == 0
    assert nll_chunk(1, 32769, 50257, context=8, token_chunk=300) == 300  # the user's, as set


def test_cpu_devices_share_the_host_budget():
    devices = jax.devices()
    assert logits_budget(mesh_lib.make_mesh(1, 1, devices=devices[:1])) == LOGITS_BUDGET
    assert logits_budget(mesh_lib.make_mesh(-1, 1)) == LOGITS_BUDGET // len(devices)


def _scorer(vocab, options=None, devices=1):
    cfg = dataclasses.replace(helpers.TINY, vocab_size=vocab, max_positions=4097)
    model = registry.build(cfg.to_dict(), jnp.float32)
    mesh = mesh_lib.make_mesh(-1, 1, devices=jax.devices()[:devices])
    shardings = mesh_lib.param_shardings(
        model.abstract_params, model.logical_axes, mesh, DEFAULT_RULES
    )
    return cfg, model, shardings, Scorer(model, mesh, shardings, options or StepOptions())


@pytest.mark.slow  # two compiled steps over 50,257 ids: 20 s on 2 loaded cores
def test_the_default_step_holds_no_logits_block_over_the_budget():
    """GPT-2's vocabulary: 4 rows of 4,096 targets on one device take 2,048 tokens at once (the
    whole batch's block of one vocabulary block would be 256 MiB); compiled at a smaller scale
    (4 rows of 512, a 1 MiB budget), the temporaries shrink tenfold
    against the same step with every token at once (XLA's compiled memory analysis)."""
    _, _, _, scorer = _scorer(50257)
    assert scorer.logits_budget == LOGITS_BUDGET and scorer.nll_chunk(4, 4097) == 2048
    b, t = 4, 512
    temp = {}
    for budget in (2**20, 2**40):
        scorer.logits_budget = budget
        compiled = scorer.lowered(b, t + 1).compile()
        temp[budget] = compiled.memory_analysis().temp_size_in_bytes
    assert scorer.nll_chunk(b, t + 1) == 0
    # The check can fail: with every token at once the step holds the whole block, and more.
    # (9.8 MB against 110 MB when written).
    assert 3 * temp[2**20] < b * t * VOCAB_BLOCK * 4 < temp[2**40], temp


def test_the_chunked_nll_gives_the_same_numbers():
    """Per-token NLL, entropy and top-1 of the NLL in chunks of 16 tokens against all at once
    (4 rows of 64 targets, 1,000 ids, 2 rows on each of 2 devices)."""
    cfg, model, shardings, scorer = _scorer(1000, StepOptions(per_token=True), devices=2)
    params = jax.device_put(helpers.random_params(cfg), shardings)
    rng = np.random.default_rng(0)
    batch = {
        "tokens": rng.integers(0, 1000, (4, 65)).astype(np.int32),
        "target_mask": np.arange(65)[None].repeat(4, 0) > 0,
        "segment_ids": np.ones((4, 65), np.int32),
        "positions": np.arange(65, dtype=np.int32)[None].repeat(4, 0),
    }
    found = {}
    for budget in (2**40, 16 * 2 * 1000 * 4):  # all at once; 16 tokens of 2 rows per device
        scorer.logits_budget, scorer._compiled = budget, {}
        found[budget] = scorer.compiled(4, 65)(params, batch).extras
    assert scorer.nll_chunk(4, 65) == 16
    for name in ("nll", "entropy"):
        np.testing.assert_allclose(found[16 * 8000][name], found[2**40][name], rtol=1e-6)
    np.testing.assert_array_equal(found[16 * 8000]["correct"], found[2**40]["correct"])
