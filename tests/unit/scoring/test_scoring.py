"""The scoring step against a NumPy float64 reference; masking; one trace per shape."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ppl_jax.config.defaults import DEFAULT_RULES
from ppl_jax.models import registry
from ppl_jax.plans.layout import plan_layout
from ppl_jax.plans.windows import sliding
from ppl_jax.runtime import mesh as mesh_lib
from ppl_jax.scoring.nll import token_nll
from ppl_jax.scoring.scorer import Scorer, score_step

import helpers


def _row(tokens):
    t = np.asarray(tokens, np.int32)[None]
    return {
        "tokens": t,
        "target_mask": np.ones_like(t, bool),
        "segment_ids": np.ones_like(t),
        "positions": np.arange(t.shape[1], dtype=np.int32)[None],
    }


@pytest.mark.parametrize(
    "cfg",
    [
        helpers.TINY,
        pytest.param(
            dataclasses.replace(helpers.TINY, tie_embeddings=True, num_kv_heads=4),
            marks=pytest.mark.slow,
        ),
        pytest.param(
            dataclasses.replace(helpers.TINY, num_kv_heads=1, num_layers=3, rope_theta=500.0),
            marks=pytest.mark.slow,
        ),
    ],
    ids=["gqa-untied", "mha-tied", "mqa-3-layers"],
)
def test_per_token_nll_matches_numpy_float64(cfg):
    params = helpers.random_params(cfg, seed=3)
    model = registry.build(cfg.to_dict(), jnp.float32)
    rng = np.random.default_rng(1)
    tokens = rng.integers(0, cfg.vocab_size, size=40)
    b = _row(tokens)
    out = model.apply(params, b["tokens"][:, :-1], b["positions"][:, :-1], b["segment_ids"][:, :-1])
    nll = np.asarray(jax.jit(token_nll)(out, b["tokens"][:, 1:]))[0]
    ref = helpers.reference_token_nll(jax.device_get(params), cfg, tokens)
    np.testing.assert_allclose(nll, ref, rtol=1e-5, atol=1e-5)
    # The step's sum is the reference's sum over the scored positions.
    sums = jax.jit(lambda p, b: score_step(model.apply, p, b))(params, b)
    assert float(sums.nll_sum[0, 0]) == pytest.approx(ref.sum(), rel=1e-5)
    assert int(sums.num_tokens[0, 0]) == tokens.size - 1


def test_padding_and_context_never_count():
    cfg = helpers.TINY
    params = helpers.random_params(cfg)
    model = registry.build(cfg.to_dict(), jnp.float32)
    step = jax.jit(lambda p, b: score_step(model.apply, p, b))
    rng = np.random.default_rng(2)
    tokens = rng.integers(0, 256, size=33)
    ref = helpers.reference_token_nll(jax.device_get(params), cfg, tokens[:25])

    b = _row(tokens)
    b["segment_ids"][:, 25:] = 0  # padding after 25 real tokens
    b["target_mask"][:, 25:] = False
    b["target_mask"][:, :11] = False  # targets 1..10 are context only
    sums = step(params, b)
    assert int(sums.num_tokens[0, 0]) == 14
    assert float(sums.nll_sum[0, 0]) == pytest.approx(ref[10:].sum(), rel=1e-5)

    # Changing padding tokens changes nothing; real tokens attend to no padding.
    b2 = {k: v.copy() for k, v in b.items()}
    b2["tokens"][:, 25:] = rng.integers(0, 256, size=8)
    np.testing.assert_array_equal(np.asarray(step(params, b2).nll_sum), np.asarray(sums.nll_sum))


def test_nonfinite_log_probabilities_are_counted():
    cfg = helpers.TINY
    params = helpers.random_params(cfg)
    params["lm_head"] = params["lm_head"].at[0, 5].set(jnp.nan)
    model = registry.build(cfg.to_dict(), jnp.float32)
    b = _row(np.arange(10) + 3)
    b["target_mask"][:, :4] = False
    sums = jax.jit(lambda p, b: score_step(model.apply, p, b))(params, b)
    assert int(sums.num_nonfinite[0, 0]) == 6  # every scored position, none of the context
    assert np.isfinite(float(sums.nll_sum[0, 0]))


def _plan(tokens, seq_len):
    from ppl_jax.data.documents import Document
    from ppl_jax.plans.protocols import PlanInputs, get
    from ppl_jax.tokenizer import ByteTokenizer

    return get("sliding").plan(
        [Document(bytes(tokens.tolist()).decode("latin-1"), "x")],
        PlanInputs(ByteTokenizer(), 256, seq_len, seq_len, False),
    )


def test_step_traced_once_per_shape():
    cfg = helpers.TINY
    model = registry.build(cfg.to_dict(), jnp.float32)
    mesh = mesh_lib.make_mesh(-1, 1)
    shardings = mesh_lib.param_shardings(
        model.abstract_params, model.logical_axes, mesh, DEFAULT_RULES
    )
    params = jax.device_put(helpers.random_params(cfg), shardings)
    scorer = Scorer(model, mesh, shardings)
    rng = np.random.default_rng(0)
    for n in (300, 500, 77):  # different corpora, same batch shape
        tokens = rng.integers(0, 256, size=n).astype(np.int32)
        windows = sliding(tokens, 32, 32)
        totals = scorer.score(params, windows, plan_layout(windows, 8))
        assert totals.num_tokens == n - 1
    assert scorer.traces == 1
    windows = sliding(tokens, 16, 16)
    scorer.score(params, windows, plan_layout(windows, 8))
    assert scorer.traces == 2
    # The public hook the benchmarks read the step's temporaries from: one analysis per shape.
    analyses = scorer.memory_analysis()
    assert len({width for _, width, _ in analyses}) == len(analyses) == scorer.traces
    for analysis in analyses.values():  # in bytes; the arguments hold the params
        assert analysis.argument_size_in_bytes > 0 and analysis.temp_size_in_bytes >= 0


def test_nonfinite_is_an_error_naming_the_window():
    from ppl_jax.errors import NumericsError
    from ppl_jax.evaluation.evaluator import Evaluator
    from ppl_jax.plans.layout import plan_layout
    from ppl_jax.plans.planner import Dataset

    cfg = helpers.TINY
    model = registry.build(cfg.to_dict(), jnp.float32)
    mesh = mesh_lib.make_mesh(-1, 1)
    shardings = mesh_lib.param_shardings(
        model.abstract_params, model.logical_axes, mesh, DEFAULT_RULES
    )
    params = helpers.random_params(cfg)
    params["layers"]["1"]["mlp"]["down"] = (
        params["layers"]["1"]["mlp"]["down"].at[0, 0].set(jnp.inf)
    )
    params = jax.device_put(params, shardings)
    tokens = np.full(100, 65, np.int32)
    with pytest.raises(NumericsError, match=r"first in window 0, document 0 \(x\), token 0"):
        plan = _plan(tokens, 32)
        dataset = Dataset(None, None, plan, plan_layout(plan.windows, 8))
        Evaluator(model, mesh, [dataset], param_shardings=shardings).score(params, dataset)
