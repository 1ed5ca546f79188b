"""A user's own model in the records: results.json's `model` holds its vocabulary, positions,
parameter count and entry point, and the summary names it without question marks."""

from __future__ import annotations

import json
import os
import sys

import jax
import numpy as np
import pytest

from ppl_jax.config.defaults import get_config
from ppl_jax.config.settings import from_config
from ppl_jax.evaluation import summary
from ppl_jax.evaluation.run import evaluate
from ppl_jax.outputs import console
from ppl_jax.outputs.folder import OutputDir
from ppl_jax.outputs.model_record import describe, model_record

import helpers

TRAINERS = os.path.join(helpers.GOLDEN, "trainers")


@pytest.fixture
def trainer_models(monkeypatch):
    monkeypatch.syspath_prepend(os.path.abspath(helpers.GOLDEN))
    sys.modules.pop("trainer_models", None)
    import trainer_models

    return trainer_models


def params_of_linen(tm) -> int:
    """The Linen model's parameters counted from its own init (not from ppl_jax's tree)."""
    import jax.numpy as jnp

    variables = tm.LinenLM().init(jax.random.key(0), jnp.zeros((1, 4), jnp.int32))
    return sum(int(np.prod(x.shape)) for x in jax.tree.leaves(variables["params"]))


def params_of_nnx(tm) -> int:
    from flax import nnx

    state = nnx.state(tm.NnxLM(nnx.Rngs(0)), nnx.Param)
    return sum(int(np.prod(x.shape)) for x in jax.tree.leaves(state))


@pytest.mark.parametrize("kind", ["linen", "nnx"])
def test_an_adapter_model_is_recorded_whole(trainer_models, kind):
    tm = trainer_models
    model = tm.linen_model() if kind == "linen" else tm.nnx_model()
    record = model_record(model)
    assert record["family"] == kind
    assert (record["vocab_size"], record["max_positions"]) == (tm.VOCAB, tm.SEQ)
    expected = params_of_linen(tm) if kind == "linen" else params_of_nnx(tm)
    assert record["num_params"] == expected > 1000
    cls = "LinenLM" if kind == "linen" else "NnxLM"
    assert record["entry_point"] == f"ppl_jax.from_{kind}(trainer_models.{cls})"
    line = describe(record)
    assert "?" not in line and f"vocab {tm.VOCAB}" in line and f"{tm.SEQ} positions" in line
    json.dumps(record)


def test_a_family_keeps_its_line_and_gains_its_parameters(tiny_checkpoint):
    from ppl_jax.checkpoints import architecture, open_checkpoint

    model = architecture.resolve(open_checkpoint(tiny_checkpoint)).model()
    record = model_record(model)
    assert record["entry_point"] is None
    assert record["num_params"] == sum(
        int(np.prod(x.shape)) for x in jax.tree.leaves(model.abstract_params)
    )
    t = helpers.TINY
    assert describe(record).startswith(f"llama {t.num_layers}L d{t.embed_dim} vocab {t.vocab_size}")


def test_a_run_of_an_entry_point_records_it(trainer_models, tmp_path):
    c = get_config()
    c.checkpoint.dir = os.path.join(TRAINERS, "linen_trainstate", "checkpoints")
    c.checkpoint.architecture = "trainer_models:linen_model"
    c.checkpoint.step = "latest"
    # Bytes below 64 (digits, spaces, punctuation) read by the byte tokenizer: ids in the
    # model's 64.
    digits = " ".join(str(i * 7919 % 1000) + ("," if i % 3 else ".") for i in range(120))
    c.data.path = helpers.corpus_files(tmp_path, [digits])
    c.data.tokenizer = "byte"
    c.data.allow_tokenizer_mismatch = True
    c.eval.seq_len = trainer_models.SEQ
    c.output.dir = str(tmp_path / "out")
    c.output.progress = False
    c.output.gzip_baseline = False
    c.metrics.bootstrap_samples = 0
    s = from_config(c)
    with OutputDir.open(s.output_dir) as out:
        ev = evaluate(s, out=out)
    results = summary.results_dict(ev)
    model = results["model"]
    assert model["entry_point"] == "trainer_models:linen_model"
    assert (
        model["vocab_size"] == trainer_models.VOCAB and model["max_positions"] == trainer_models.SEQ
    )
    assert model["num_params"] == params_of_linen(trainer_models)
    table = console.summary_table(results)
    assert "?" not in table.splitlines()[0] and "trainer_models:linen_model" in table
