"""Packing and length buckets: windows placed anywhere give the same per-window sums."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ppl_jax.config.defaults import DEFAULT_RULES
from ppl_jax.data.documents import Document
from ppl_jax.models import registry
from ppl_jax.plans.layout import bucket_widths, plan_layout
from ppl_jax.plans.protocols import PlanInputs, get
from ppl_jax.runtime import mesh as mesh_lib
from ppl_jax.scoring.scorer import Scorer
from ppl_jax.tokenizer import ByteTokenizer

import helpers


class BosTokenizer(ByteTokenizer):
    vocab_size = 258
    bos_id = 256
    eos_id = 257


CFG = dataclasses.replace(helpers.TINY, vocab_size=260, max_positions=64)


@pytest.fixture(scope="module")
def setup():
    model = registry.build(CFG.to_dict(), jnp.float32)
    mesh = mesh_lib.make_mesh(4, 2)
    shardings = mesh_lib.param_shardings(
        model.abstract_params, model.logical_axes, mesh, DEFAULT_RULES
    )
    params = jax.device_put(helpers.random_params(CFG, seed=4), shardings)
    rng = np.random.default_rng(0)
    lengths = [1, 2, 3, 5, 8, 13, 21, 31, 32, 33, 70, 100, 4, 6, 9]
    docs = [
        Document("".join(chr(c) for c in rng.integers(97, 123, n)), f"d{i}")
        for i, n in enumerate(lengths)
    ]
    p = get("lm_eval_rolling").plan(docs, PlanInputs(BosTokenizer(), CFG.vocab_size, 32, 32, False))
    return model, mesh, shardings, params, p


def test_pack_places_every_window_once_within_the_width(setup):
    *_, p = setup
    layout = plan_layout(p.windows, batch_size=4, pack=True)
    placed = sorted(k for row in layout.rows for k in row)
    assert placed == list(range(p.windows.num_windows))
    lengths = p.windows.row_lengths()
    assert all(lengths[list(row)].sum() <= 33 for row in layout.rows)
    assert len(layout.rows) < p.windows.num_windows  # short windows did share rows
    assert layout.max_segments > 1
    unpacked = plan_layout(p.windows, batch_size=4, pack=False)
    assert layout.padding_fraction < unpacked.padding_fraction


def test_bucket_widths():
    assert bucket_widths(1024, 1) == [1025]
    assert bucket_widths(1024, 3) == [257, 513, 1025]
    assert bucket_widths(31, 4) == [9, 17, 32]


@pytest.mark.parametrize("pack,buckets", [(True, 1), (False, 3), (True, 3)])
def test_packed_and_bucketed_results_equal_unpacked(setup, pack, buckets):
    model, mesh, shardings, params, p = setup
    scorer = Scorer(model, mesh, shardings)
    base = scorer.score(params, p.windows, plan_layout(p.windows, 4, pack=False))
    layout = plan_layout(p.windows, 4, pack=pack, num_buckets=buckets)
    other = Scorer(model, mesh, shardings)
    got = other.score(params, p.windows, layout)
    np.testing.assert_array_equal(got.window_tokens, base.window_tokens)
    np.testing.assert_allclose(got.window_nll, base.window_nll, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got.window_entropy, base.window_entropy, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(got.window_correct, base.window_correct)
    assert got.num_tokens == p.windows.num_scored().sum()
    assert other.traces == len(set(layout.widths)) <= buckets


def test_packed_windows_match_the_numpy_reference(setup):
    """Segments see nothing of their row-mates: each equals its own sequence, scored alone."""
    model, mesh, shardings, params, p = setup
    totals = Scorer(model, mesh, shardings).score(
        params, p.windows, plan_layout(p.windows, 4, pack=True, num_buckets=2)
    )
    host = jax.device_get(params)
    rows = p.windows.rows(np.arange(p.windows.num_windows))
    for k in range(0, p.windows.num_windows, 3):
        n = int(rows["segment_ids"][k].sum())
        ref = helpers.reference_token_nll(host, CFG, rows["tokens"][k, :n])
        scored = rows["target_mask"][k, 1:n]
        assert totals.window_nll[k] == pytest.approx(ref[scored].sum(), rel=1e-5, abs=1e-5)


def _few_documents(copies: int = 1):
    docs = [Document("x" * n, f"d{i}") for i, n in enumerate((20, 25, 30))] * copies
    return get("whole_documents").plan(
        docs, PlanInputs(BosTokenizer(), CFG.vocab_size, 32, None, False)
    )


def test_a_plan_of_fewer_rows_than_a_batch_gets_a_smaller_batch():
    """Whole documents, few of them: the batch has as many rows as the plan needs, rounded up to
    the mesh's data axis (three documents in the default 8 rows were 70-80% padding); a plan of
    more rows keeps eval.batch_size."""
    from ppl_jax.plans.planner import batches
    from ppl_jax.plans.spec import BatchSpec

    few, spec = _few_documents(), BatchSpec(batch_size=8, packing=False)
    full = batches(few, spec)  # without the mesh's axis: every batch of 8 rows
    assert (full.batch_size, full.num_batches) == (8, 1)
    for multiple, rows in ((1, 3), (2, 4), (4, 4), (8, 8)):
        layout = batches(few, spec, rows_multiple=multiple)
        assert (layout.batch_size, layout.num_batches, layout.rows) == (rows, 1, full.rows)
    assert batches(few, spec, rows_multiple=1).padding_fraction < 0.3 < 0.6 < full.padding_fraction
    assert batches(_few_documents(4), spec, rows_multiple=4).batch_size == 8  # 12 rows: 2 batches


def test_the_rows_are_shared_evenly_between_the_batches_they_need():
    """18 windows (6 copies of 3 documents) in batches of 8 took 3 batches of 24 rows (25%
    padding, the last batch's empty rows): now 3 batches of 6 rows, rounded up to the mesh's
    data axis; one compiled shape and as many steps either way, the same windows in all."""
    from ppl_jax.plans.planner import batches
    from ppl_jax.plans.spec import BatchSpec

    plan, spec = _few_documents(6), BatchSpec(batch_size=8, packing=False)
    before = batches(plan, spec)  # without the mesh's axis: as before
    assert (before.batch_size, before.num_batches) == (8, 3) and before.padding_fraction > 0.25
    for multiple, rows in ((1, 6), (2, 6), (4, 8), (3, 6)):
        layout = batches(plan, spec, rows_multiple=multiple)
        assert (layout.batch_size, layout.num_batches) == (rows, 3), multiple
        assert sorted(k for r in layout.rows for k in r) == list(range(18))
        assert len(set(layout.widths)) == 1
    even = batches(plan, spec, rows_multiple=1)  # 18 rows run, not 24: a quarter fewer positions
    assert 4 * even.batch_size * sum(even.widths) == 3 * before.batch_size * sum(before.widths)
    # Packed (no two of these windows share a row of 33): the rows they fill, alike.
    packed = batches(plan, BatchSpec(batch_size=8), rows_multiple=2)
    assert (packed.batch_size, packed.num_batches) == (6, 3)


@pytest.mark.slow
def test_the_smaller_batch_scores_the_same(setup):
    from ppl_jax.plans.planner import batches
    from ppl_jax.plans.spec import BatchSpec

    model, mesh, shardings, params, _ = setup
    few, spec = _few_documents(), BatchSpec(batch_size=8, packing=False)
    for plan in (few, _few_documents(6)):  # one batch of 4 rows; 3 batches of 8 rows, not 24
        got = Scorer(model, mesh, shardings).score(
            params, plan.windows, batches(plan, spec, True, 4)
        )
        want = Scorer(model, mesh, shardings).score(params, plan.windows, batches(plan, spec))
        np.testing.assert_allclose(got.window_nll, want.window_nll, rtol=1e-6)
        np.testing.assert_array_equal(got.window_tokens, want.window_tokens)
