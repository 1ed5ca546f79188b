"""Checkpoints written by levanter (marin), EasyDeL and T5X themselves (tests/golden/trainers/
{levanter,easydel,t5x}, from tests/golden/make_{levanter,easydel,t5x}_golden.py), read in place
by their readers: ppl_jax's float32 logits equal the writer's own within 1e-5 of the largest
logit, each layout is found by its markers, incomplete steps are not steps, names that lead out
of the checkpoint are refused, a sweep over a levanter or EasyDeL run equals single runs exactly,
and `ppl-jax inspect` names each reader and maps every stored array."""

from __future__ import annotations

import json
import os
import shutil

import jax
import numpy as np
import pytest
from test_trainer_golden import RTOL, TRAINERS, _logits, _targets

from ppl_jax.checkpoints import architecture, open_checkpoint
from ppl_jax.checkpoints.formats import tensorstore_tree
from ppl_jax.checkpoints.readers.easydel import EasyDeLCheckpoint
from ppl_jax.checkpoints.readers.levanter import LevanterRun
from ppl_jax.checkpoints.readers.t5x import T5XCheckpoint
from ppl_jax.errors import CheckpointError
from ppl_jax.outputs import store

LEVANTER = os.path.join(TRAINERS, "levanter")
EASYDEL = os.path.join(TRAINERS, "easydel")
T5X = os.path.join(TRAINERS, "t5x")


@pytest.fixture(autouse=True)
def _highest_precision():
    with jax.default_matmul_precision("highest"):
        yield


def _worst(ckpt, golden) -> float:
    model = architecture.resolve(ckpt).model()
    worst = 0.0
    for step in ckpt.steps() or [None]:
        want = golden[f"step_{step}"]
        got = _logits(model, ckpt.restore(step, _targets(model)), golden["tokens"])
        worst = max(worst, float(np.abs(got - want).max()) / float(np.abs(want).max()))
    return worst


@pytest.mark.parametrize(
    "name", ["llama_scanned", "llama_unscanned", "qwen2_unscanned", "qwen3_scanned"]
)
def test_levanter_logits_equal_levanter(name):
    folder = os.path.join(LEVANTER, name)
    ckpt = open_checkpoint(
        os.path.join(folder, "run"), architecture=os.path.join(folder, "description.json")
    )
    assert isinstance(ckpt, LevanterRun)
    assert ckpt.steps() == ([1, 2] if name == "llama_scanned" else [1])
    worst = _worst(ckpt, np.load(os.path.join(folder, "logits.npz")))
    print(f"levanter {name}: max |logit difference| / max |logit| = {worst:.2e}")
    assert worst <= RTOL


def test_levanter_step_folder_alone_and_incomplete_steps(tmp_path):
    run = os.path.join(LEVANTER, "llama_scanned", "run")
    one = open_checkpoint(os.path.join(run, "step-2"))
    assert isinstance(one, LevanterRun) and one.steps() == [] and one.resolve_step(None) is None
    # A step whose metadata.json levanter has not written yet is not a step.
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    os.remove(copy / "step-2" / "metadata.json")
    ckpt = open_checkpoint(str(copy))
    assert ckpt.steps() == [1] and ckpt.resolve_step(None) == 1
    with pytest.raises(CheckpointError, match="step 2 is not a complete step"):
        ckpt.resolve_step(2)


def test_levanter_without_architecture_is_one_sentence():
    ckpt = open_checkpoint(os.path.join(LEVANTER, "llama_unscanned", "run"))
    with pytest.raises(CheckpointError, match="carries no architecture"):
        architecture.resolve(ckpt).model()
    # Only the model's params are stored names (not opt_state, training_key, step).
    assert all(not n.startswith(("opt_state", "training_key")) for n in ckpt.stored(None))
    assert "embeddings/token_embeddings/weight" in ckpt.stored(None)


@pytest.mark.parametrize("name", ["llama", "qwen3"])
def test_easydel_logits_equal_easydel(name):
    ckpt = open_checkpoint(os.path.join(EASYDEL, name, "run"))  # config.json: no architecture
    assert isinstance(ckpt, EasyDeLCheckpoint) and ckpt.steps() == [1, 2]
    assert ckpt.description()["vocab_size"] == 300
    worst = _worst(ckpt, np.load(os.path.join(EASYDEL, name, "logits.npz")))
    print(f"easydel {name}: max |logit difference| / max |logit| = {worst:.2e}")
    assert worst <= RTOL


def test_t5x_logits_equal_the_model_t5x_saved():
    ckpt = open_checkpoint(
        os.path.join(T5X, "model_dir"),
        architecture=os.path.join(T5X, "description.json"),
        mapping=os.path.join(T5X, "mapping.yaml"),
    )
    assert isinstance(ckpt, T5XCheckpoint) and ckpt.steps() == [1, 2]
    worst = _worst(ckpt, np.load(os.path.join(T5X, "logits.npz")))
    print(f"t5x: max |logit difference| / max |logit| = {worst:.2e}")
    assert worst <= RTOL


def test_t5x_spec_leading_out_of_the_step_is_refused(tmp_path):
    from flax import serialization

    copy = tmp_path / "model_dir"
    shutil.copytree(os.path.join(T5X, "model_dir"), copy)
    shutil.rmtree(copy / "checkpoint_1")
    path = copy / "checkpoint_2" / "checkpoint"
    state = serialization.msgpack_restore(path.read_bytes())
    leaf = state["optimizer"]["target"]["token_embedder"]["embedding"]
    leaf["kvstore"]["path"] = "../../elsewhere/"
    path.write_bytes(serialization.msgpack_serialize(state))
    os.makedirs(copy / "checkpoint_3.tmp-123")  # a save in progress is not a step
    ckpt = open_checkpoint(str(copy), mapping=os.path.join(T5X, "mapping.yaml"))
    assert ckpt.steps() == [2]
    with pytest.raises(CheckpointError, match="leads outside the checkpoint"):
        ckpt.stored(2)


@pytest.mark.parametrize("name", ["a/../b", "/abs", "gs://x/y", "a//b", ""])
def test_names_leading_out_are_refused(name):
    with pytest.raises(CheckpointError, match="leads outside"):
        tensorstore_tree.check_inside(name, "here")


@pytest.mark.parametrize("layout", ["levanter", "easydel"])
def test_a_sweep_over_a_trainers_steps_equals_single_runs(tmp_path, layout):
    from test_one_job import config, run, without_timings

    import helpers

    (tmp_path / "data").mkdir()
    corpus = helpers.corpus_files(tmp_path / "data", [helpers.stdlib_text(600)])
    extra = dict(data__tokenizer="byte", data__allow_tokenizer_mismatch=True, eval__seq_len=16)
    if layout == "levanter":
        folder = os.path.join(LEVANTER, "llama_scanned")
        extra["checkpoint__architecture"] = os.path.join(folder, "description.json")
    else:  # EasyDeL's milestones carry their config.json
        folder = os.path.join(EASYDEL, "qwen3")
    _, sweep_dir = run(config(os.path.join(folder, "run"), corpus, tmp_path / "sweep",
                              checkpoint__step="all", **extra))  # fmt: skip
    swept = {r["step"]: r for r in store.ResultsStore.in_dir(sweep_dir).records()}
    assert set(swept) == {1, 2}
    for step in (1, 2):
        _, one_dir = run(config(os.path.join(folder, "run"), corpus, tmp_path / f"one{step}",
                                checkpoint__step=str(step), **extra))  # fmt: skip
        (one,) = store.ResultsStore.in_dir(one_dir).records()
        assert without_timings(one) == without_timings(swept[step])
    assert swept[1]["metrics"]["perplexity"] != swept[2]["metrics"]["perplexity"]
    with open(os.path.join(sweep_dir, "results.json")) as f:
        assert json.load(f)["checkpoint"]


@pytest.mark.parametrize(
    "layout, reader, args, stored",
    [
        ("levanter/llama_scanned/run", "LevanterRun",
         ["--architecture", "levanter/llama_scanned/description.json"],
         "transformer/layers/stacked/self_attn/q_proj/weight  [layer 1 of axis 0"),
        ("easydel/qwen3/run", "EasyDeLCheckpoint", [], "model/layers/1/self_attn/q_proj/kernel"),
        ("t5x/model_dir", "T5XCheckpoint",
         ["--architecture", "t5x/description.json", "--mapping", "t5x/mapping.yaml"],
         "decoder/layers_1/self_attention/query/kernel"),
    ],
)  # fmt: skip
def test_inspect_names_the_trainer_reader_and_maps_every_stored_array(
    capsys, layout, reader, args, stored
):
    from ppl_jax.cli import inspect as inspect_cli

    argv = [os.path.join(TRAINERS, layout)]
    argv += [a if a.startswith("--") else os.path.join(TRAINERS, a) for a in args]
    assert inspect_cli.main(argv) == 0
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    assert f"reader: {reader} (" in out and "steps: 1, 2" in out
    assert "every stored array used" in out
    assert any(line.strip().startswith("layers/1/attn/q") and stored in line
               for line in out.splitlines())  # fmt: skip
