"""The scorer with a context axis (`mesh.context`, ATTENTION.md section 2), on 8 CPU devices: a
window's tokens split over devices in the load-balanced order give per-token NLLs equal to
transformers (a committed golden) and to one device, the same sums and per-token outputs in row
order, for every family and option; a model that cannot run under it is refused before its
weights are read."""

import dataclasses
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from test_one_job import config, run

from ppl_jax.checkpoints.formats import safetensors
from ppl_jax.config.defaults import DEFAULT_RULES
from ppl_jax.errors import ConfigError
from ppl_jax.evaluation import checks
from ppl_jax.models import registry
from ppl_jax.models.families.gpt2 import GPT2Config
from ppl_jax.models.families.gpt_neox import GPTNeoXConfig
from ppl_jax.models.family import Limit
from ppl_jax.plans import windows
from ppl_jax.plans.layout import plan_layout
from ppl_jax.runtime import mesh as mesh_lib
from ppl_jax.scoring.scorer import Scorer, StepOptions
from ppl_jax.testing import TINY, random_params

import helpers

CONTEXT_GOLDEN = os.path.join(helpers.GOLDEN, "context")


def score(model, params_host, wins, layout, mesh_shape, **options):
    """`(totals, per-token arrays by name)` of scoring `wins` on a (data, context, model) mesh."""
    data, context, model_axis = mesh_shape
    mesh = mesh_lib.make_mesh(data, model_axis, context=context)
    shardings = mesh_lib.param_shardings(
        model.abstract_params, model.logical_axes, mesh, DEFAULT_RULES
    )
    params = jax.device_put(params_host, shardings)
    scorer = Scorer(model, mesh, shardings, StepOptions(per_token=True, **options))
    keep = KeepTokens()
    totals = scorer.score(params, wins, layout, observers=[keep])
    return totals, {k: np.concatenate(v) for k, v in keep.tokens.items()}


class KeepTokens:
    """An observer of the loop (`ppl_jax.scoring.observers.ScoreObserver`) that keeps each
    batch's per-token arrays by name."""

    def __init__(self):
        self.tokens: dict[str, list] = {}

    def should_stop(self, i):
        return False

    def on_batch(self, i, rows, host):
        for name, value in host.extras.items():
            self.tokens.setdefault(name, []).append(np.asarray(value))

    def close(self):
        pass


@pytest.fixture(scope="module")
def golden():
    with open(os.path.join(CONTEXT_GOLDEN, "log_probs.json"), encoding="utf-8") as f:
        return json.load(f)


def _hf_model(name):
    path = os.path.join(CONTEXT_GOLDEN, name)
    description = safetensors.read_description(path)
    model = registry.build(description, jnp.float32, "xla")
    mesh = mesh_lib.make_mesh(-1, 1)
    target, _ = mesh_lib.param_targets(
        model.abstract_params, model.logical_axes, mesh, DEFAULT_RULES, jnp.float32
    )
    params = jax.device_get(safetensors.load_params(path, target))
    return model, params


@pytest.mark.parametrize(
    "name,mesh_shape", [("llama", (1, 8, 1)), ("mistral", (2, 4, 1))], ids=str
)  # the other two pairs: tests/slow/test_context_grid.py
def test_one_window_over_the_context_axis_equals_transformers(golden, name, mesh_shape):
    """A 2,047-token window (padded to 2,048 in the step) split over `context`: per-token NLL
    within 1e-5 relative of transformers float32 and within 1e-6 of one device."""
    model, params = _hf_model(name)
    tokens = np.asarray(golden["tokens"], np.int32)
    n = tokens.size - 1
    wins = windows.make(np.tile(tokens, 2), [0, tokens.size], [tokens.size] * 2, [1, 1], n)
    layout = plan_layout(wins, 2)
    ref = -np.asarray(golden[name], np.float64)
    totals, ours = score(model, params, wins, layout, mesh_shape)
    _, single = score(model, params, wins, layout, (2, 1, 4))
    nll = ours["nll"][0][ours["scored"][0]]
    assert nll.shape == (n,)
    np.testing.assert_allclose(nll, ref, rtol=1e-5)
    np.testing.assert_allclose(ours["nll"], single["nll"], rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(totals.window_nll, [ref.sum()] * 2, rtol=1e-6)


def _packed_case():
    """Stream windows of several lengths, packed several to a row (segments 1..4)."""
    rng = np.random.default_rng(4)
    stream = rng.integers(0, 256, 3000).astype(np.int32)
    starts = [0, 400, 450, 900, 1700, 2100, 2180, 2600]
    lengths = [400, 50, 450, 800, 400, 80, 420, 390]
    wins = windows.make(stream, starts, lengths, [1] * 8, 999)
    return wins, plan_layout(wins, 4, pack=True)


PACKED_CASES = [
    ((1, 8, 1), {}),
    ((2, 4, 1), {"context_attention": "ring"}),
    ((1, 4, 2), {"token_chunk": 96}),
    ((1, 2, 4), {"context_attention": "ring", "token_chunk": 64}),
]  # the last two: tests/slow/test_context_grid.py


@pytest.mark.parametrize("mesh_shape,options", PACKED_CASES[:2], ids=str)
def test_packed_rows_and_every_output_in_row_order(mesh_shape, options):
    """Packed rows (several documents per row), the position curve, top-k and the per-token
    arrays: the same as one device, the per-token arrays back in row order."""
    cfg = dataclasses.replace(TINY, max_positions=1024)
    model = registry.build(cfg.to_dict(), jnp.float32, "xla")
    params = random_params(cfg, seed=3)
    wins, layout = _packed_case()
    assert layout.max_segments > 1
    opts = dict(positions=1001, top_k=3)
    base_totals, base = score(model, params, wins, layout, (4, 1, 2), **opts)
    totals, got = score(model, params, wins, layout, mesh_shape, **opts, **options)
    np.testing.assert_allclose(totals.window_nll, base_totals.window_nll, rtol=1e-6)
    np.testing.assert_array_equal(totals.window_tokens, base_totals.window_tokens)
    np.testing.assert_allclose(totals.nll_by_position, base_totals.nll_by_position, rtol=1e-5)
    np.testing.assert_array_equal(totals.tokens_by_position, base_totals.tokens_by_position)
    for name in ("scored", "slot", "top_ids"):
        np.testing.assert_array_equal(got[name], base[name])
    for name in ("nll", "entropy", "top_logprobs"):
        np.testing.assert_allclose(got[name], base[name], rtol=1e-6, atol=2e-6)


@pytest.mark.parametrize(
    "description",
    [
        GPT2Config(vocab_size=256, embed_dim=32, num_layers=2, num_heads=4, mlp_dim=64,
                   max_positions=1024).to_dict(),
        GPTNeoXConfig(vocab_size=256, embed_dim=32, num_layers=2, num_heads=4, mlp_dim=64, rotary_dim=4,
                      max_positions=1024).to_dict(),
        dataclasses.replace(TINY, max_positions=1024, moe_layers=(1,), moe_experts=4,
                            moe_mlp_dim=32, moe_top_k=2).to_dict(),
    ],
    ids=["gpt2", "gpt_neox", "mixture"],
)  # fmt: skip
def test_every_family_runs_under_context(description):
    """GPT-2 (learned positions), GPT-NeoX (parallel residual) and a mixture of experts (routed
    per (data, context) shard) under context=4, their MLPs in chunks of 96 tokens, equal one
    device."""
    model = registry.build(description, jnp.float32, "xla")
    assert model.context_parallel
    rng = np.random.default_rng(0)
    params = jax.tree.map(
        lambda a: (0.3 * rng.standard_normal(a.shape)).astype(np.float32), model.abstract_params
    )
    wins, layout = _packed_case()
    base_totals, base = score(model, params, wins, layout, (4, 1, 2))
    totals, got = score(model, params, wins, layout, (2, 4, 1), token_chunk=96)
    np.testing.assert_allclose(totals.window_nll, base_totals.window_nll, rtol=1e-6)
    np.testing.assert_allclose(got["nll"], base["nll"], rtol=1e-6, atol=2e-6)


def test_a_model_not_built_for_context_is_refused():
    model = registry.build(TINY.to_dict(), jnp.float32, "xla")
    own = dataclasses.replace(model, context_parallel=False)
    mesh = mesh_lib.make_mesh(2, 1, context=4)
    shardings = mesh_lib.param_shardings(own.abstract_params, own.logical_axes, mesh, DEFAULT_RULES)
    with pytest.raises(ConfigError, match=r"mesh.context=4 .* set mesh.context=1\.$"):
        Scorer(own, mesh, shardings)
    with pytest.raises(ConfigError, match="the reference model"):
        Scorer(model, mesh, shardings, StepOptions(reference=True), reference=(own, shardings))
    Scorer(own, mesh_lib.make_mesh(8, 1), shardings)  # without a context axis: fine


def test_a_family_with_a_context_limit_is_refused_with_its_reason(monkeypatch):
    """A family opts out of the context axis by a `Limit("context", reason)`: its models are
    built with `context_parallel=False` and the scorer's sentence gives the family's reason."""
    llama = registry.families()["llama"]
    limited = dataclasses.replace(
        llama, limits=(*llama.limits, Limit("context", "its toy layer runs in row order"))
    )
    monkeypatch.setitem(registry.families(), "llama", limited)
    model = registry.build(TINY.to_dict(), jnp.float32, "xla")
    assert not model.context_parallel
    mesh = mesh_lib.make_mesh(2, 1, context=4)
    shardings = mesh_lib.param_shardings(
        model.abstract_params, model.logical_axes, mesh, DEFAULT_RULES
    )
    with pytest.raises(ConfigError, match=r"^mesh.context=4 is refused for the model \(family "
                       r"'llama'\): its toy layer runs in row order; set mesh.context=1\.$"):  # fmt: skip
        checks.check_context(model, mesh)  # the run's check, before any weight is read
    with pytest.raises(ConfigError, match=r"^mesh.context=4 splits"):
        Scorer(model, mesh, shardings)  # the library's own check, without the family's reason


def test_the_command_line_runs_a_context_axis(tiny_checkpoint, tmp_path):
    """`mesh.context` and `model.context_attention` through the config: the same numbers as
    without; a user's own model is refused before any weight is read."""
    corpus = helpers.corpus_files(tmp_path, [helpers.stdlib_text(2500)])
    found = {}
    for name, overrides in {
        "plain": {},
        "context": {"mesh__context": 4, "mesh__data": 2},
        "ring": {"mesh__context": -1, "mesh__data": 2, "model__context_attention": "ring"},
    }.items():
        c = config(tiny_checkpoint, corpus, tmp_path / name, **overrides)
        found[name], _ = run(c)
    for name in ("context", "ring"):
        assert found[name].results["num_tokens"] == found["plain"].results["num_tokens"]
        np.testing.assert_allclose(
            found[name].results["nll_sum"], found["plain"].results["nll_sum"], rtol=1e-6
        )
    assert found["ring"].results["mesh"]["context"] == 4
    c = config(tiny_checkpoint, corpus, tmp_path / "bad", mesh__context=4, mesh__data=2)
    c.model.context_attention = "spiral"
    with pytest.raises(ConfigError, match="model.context_attention='spiral'"):
        run(c)
