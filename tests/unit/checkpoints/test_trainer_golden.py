"""Checkpoints written by other trainers' own code (tests/golden/trainers/, from
tests/golden/make_trainer_golden.py): ppl_jax's float32 logits equal the writing library's on a
fixed token batch, a sweep over the steps equals single runs, and a MaxText run converted to
ppl_jax's own layout scores identically."""

from __future__ import annotations

import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ppl_jax.checkpoints import architecture, open_checkpoint
from ppl_jax.checkpoints.formats import orbax
from ppl_jax.checkpoints.readers.foreign import ForeignOrbax
from ppl_jax.checkpoints.readers.own import OwnOrbax
from ppl_jax.config.defaults import DEFAULT_RULES
from ppl_jax.models.decoders.llama import LlamaConfig
from ppl_jax.runtime import mesh as mesh_lib

GOLDEN = os.path.join(os.path.dirname(__file__), "..", "..", "golden")
TRAINERS = os.path.join(GOLDEN, "trainers")
MAXTEXT = ["maxtext_llama2_scanned", "maxtext_llama2_unscanned", "maxtext_mistral_scanned",
           "maxtext_qwen3_scanned"]  # fmt: skip
RTOL = 1e-5  # |ppl_jax - library| <= RTOL * max |library logits|, per checkpoint and step


@pytest.fixture(autouse=True)
def _highest_precision():
    with jax.default_matmul_precision("highest"):
        yield


def _logits(model, params, tokens):
    positions = np.broadcast_to(np.arange(tokens.shape[1], dtype=np.int32), tokens.shape)
    out = model.apply(params, jnp.asarray(tokens), jnp.asarray(positions), jnp.ones_like(tokens))
    if hasattr(out, "logits"):
        return np.asarray(out.logits, np.float32)
    hidden = out.hidden.astype(jnp.float32)
    return np.asarray(jnp.einsum("btd,dv->btv", hidden, out.unembedding.astype(jnp.float32)))


def _targets(model):
    mesh = mesh_lib.make_mesh(-1, 2)
    return mesh_lib.param_targets(model.abstract_params, model.logical_axes, mesh, DEFAULT_RULES)[0]


def _arch(name: str) -> str:
    with open(os.path.join(TRAINERS, name, "architecture.txt")) as f:
        return f.read().strip()


def _check(name, ckpt, model, golden, steps):
    worst = 0.0
    for step in steps:
        want = golden[f"step_{step}"][..., : model.vocab_size]
        got = _logits(model, ckpt.restore(step, _targets(model)), golden["tokens"])
        diff = float(np.abs(got - want).max()) / float(np.abs(want).max())
        worst = max(worst, diff)
        assert diff <= RTOL, (name, step, diff)
    print(f"{name}: max |logit difference| / max |logit| = {worst:.2e}")


@pytest.mark.parametrize("name", MAXTEXT)
def test_maxtext_logits_equal_maxtext(name):
    if "qwen3" in name and "qk_norm" not in LlamaConfig.__dataclass_fields__:
        pytest.skip("the llama family has no QK-norm yet (issue 17)")
    ckpt = open_checkpoint(os.path.join(TRAINERS, name), architecture=_arch(name))
    assert isinstance(ckpt, ForeignOrbax) and ckpt.location().item == "items"
    golden = np.load(os.path.join(TRAINERS, name, "logits.npz"))
    _check(name, ckpt, architecture.resolve(ckpt).model(), golden, ckpt.steps())


def test_gemma_library_logits_equal_gemma():
    # A bare StandardCheckpointer directory (gm.ckpts.save_params), Gemma 3 with QK-norm, a
    # sliding layer and the `1+w` norms; the architecture from a config.json beside it.
    folder = os.path.join(TRAINERS, "gemma3_tiny")
    ckpt = open_checkpoint(os.path.join(folder, "params"),
                           architecture=os.path.join(folder, "config.json"))  # fmt: skip
    assert isinstance(ckpt, ForeignOrbax) and ckpt.location().bare and ckpt.steps() == []
    golden = np.load(os.path.join(folder, "logits.npz"))
    model = architecture.resolve(ckpt).model()
    want = golden["bare"]
    got = _logits(model, ckpt.restore(None, _targets(model)), golden["tokens"])
    diff = float(np.abs(got - want).max()) / float(np.abs(want).max())
    print(f"gemma3_tiny: max |logit difference| / max |logit| = {diff:.2e}")
    assert diff <= RTOL


def test_maxtext_padded_vocabulary_is_cut():
    # Score only the first 100 of MaxText's 128 ids: embedding and head are cut, logits equal.
    name = "maxtext_llama2_scanned"
    ckpt = open_checkpoint(os.path.join(TRAINERS, name),
                           architecture=_arch(name) + " model_vocab_size=100")  # fmt: skip
    model = architecture.resolve(ckpt).model()
    assert model.vocab_size == 100
    golden = dict(np.load(os.path.join(TRAINERS, name, "logits.npz")))
    golden["tokens"] = golden["tokens"] % 100
    ckpt_full = open_checkpoint(os.path.join(TRAINERS, name), architecture=_arch(name))
    full = architecture.resolve(ckpt_full).model()
    want = _logits(full, ckpt_full.restore(1, _targets(full)), golden["tokens"])[..., :100]
    got = _logits(model, ckpt.restore(1, _targets(model)), golden["tokens"])
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)


@pytest.mark.parametrize("name, entry", [("linen_trainstate", "trainer_models:linen_model"),
                                         ("nnx_state", "trainer_models:nnx_model")])  # fmt: skip
def test_flax_loops_logits_equal_their_own(name, entry, monkeypatch):
    monkeypatch.syspath_prepend(os.path.abspath(GOLDEN))
    sys.modules.pop("trainer_models", None)
    ckpt = open_checkpoint(os.path.join(TRAINERS, name, "checkpoints"), architecture=entry)
    assert ckpt.location().item == {"linen_trainstate": "default", "nnx_state": "model"}[name]
    golden = np.load(os.path.join(TRAINERS, name, "logits.npz"))
    _check(name, ckpt, architecture.resolve(ckpt).model(), golden, ckpt.steps())


@pytest.mark.slow
def test_maxtext_converted_to_own_layout_restores_bit_for_bit(tmp_path):
    # The same weights through the MaxText preset and through ppl_jax's own layout (saved with
    # their description): identical params, hence identical scores.
    name = "maxtext_llama2_scanned"
    ckpt = open_checkpoint(os.path.join(TRAINERS, name), architecture=_arch(name))
    model = architecture.resolve(ckpt).model()
    for step in ckpt.steps():
        params = ckpt.restore(step, _targets(model))
        orbax.save_train_state(str(tmp_path / "own"), step, {"step": step, "params": params,
                               "opt_state": {}}, {"model": model.description, "tokenizer": None})  # fmt: skip
    own = open_checkpoint(str(tmp_path / "own"))
    assert isinstance(own, OwnOrbax) and own.steps() == ckpt.steps()
    tokens = np.load(os.path.join(TRAINERS, name, "logits.npz"))["tokens"]
    for step in ckpt.steps():
        a = _logits(model, ckpt.restore(step, _targets(model)), tokens)
        b = _logits(
            architecture.resolve(own).model(),
            own.restore(step, _targets(architecture.resolve(own).model())),
            tokens,
        )
        np.testing.assert_array_equal(a, b)
