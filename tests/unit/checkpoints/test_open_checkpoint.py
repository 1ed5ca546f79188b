"""The one checkpoint opener (`ppl_jax.checkpoints.open_checkpoint`): format detection, steps,
architecture, tokenizer and restored params of Orbax and Hugging Face directories, the same as
the format readers give, and the sweep's same-architecture check."""

import dataclasses
import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from ppl_jax import tokenizer as tokenizer_lib
from ppl_jax.checkpoints import architecture, open_checkpoint
from ppl_jax.checkpoints.formats import orbax as checkpoint
from ppl_jax.checkpoints.formats import safetensors
from ppl_jax.checkpoints.readers.own import OwnOrbax
from ppl_jax.config.defaults import DEFAULT_RULES
from ppl_jax.errors import CheckpointError, ConfigError
from ppl_jax.models.interface import weight_paths
from ppl_jax.runtime import mesh as mesh_lib

import helpers

GOLDEN_HF = os.path.join(helpers.GOLDEN, "hf")
BPE_JSON = os.path.join(helpers.GOLDEN, "tokenizers", "bytelevel_bpe.json")
TEXT = "def main():\n    return 'hello, world'  # ünïcode"


@pytest.fixture(scope="module")
def orbax_dir(tmp_path_factory) -> tuple[str, dict[int, dict]]:
    """Steps 3, 7 and 10 of the tiny Llama, each with its own random params; a BPE tokenizer."""
    path = str(tmp_path_factory.mktemp("orbax") / "ckpt")
    desc = tokenizer_lib.HFTokenizer.from_file(BPE_JSON).describe()
    params = {
        step: helpers.save_random_checkpoint(path, steps=(step,), seed=step, tokenizer=desc)
        for step in (3, 7, 10)
    }
    return path, params


def _targets(model, dtype=jnp.float32):
    mesh = mesh_lib.make_mesh(4, 2)
    return mesh_lib.param_targets(
        model.abstract_params, model.logical_axes, mesh, DEFAULT_RULES, dtype
    )


def _assert_bitwise_equal(a, b) -> None:
    a, b = weight_paths(a), weight_paths(b)
    assert list(a) == list(b)
    for name in a:
        assert a[name].dtype == b[name].dtype, name
        assert a[name].sharding == b[name].sharding, name
        np.testing.assert_array_equal(
            np.asarray(a[name]).view(np.uint8), np.asarray(b[name]).view(np.uint8), err_msg=name
        )


def test_the_format_is_detected_or_as_given(orbax_dir):
    path, _ = orbax_dir
    assert open_checkpoint(path) == OwnOrbax(path)
    llama = os.path.join(GOLDEN_HF, "llama")
    assert open_checkpoint(llama).format == "hf"
    assert open_checkpoint(llama, "orbax").format == "orbax"  # as given, not looked at
    assert open_checkpoint(path, "hf").format == "hf"
    with pytest.raises(ConfigError, match=r"checkpoint.format='pt' is not one of auto, orbax, "):
        open_checkpoint(path, "pt")


def test_a_missing_directory_names_every_layout(tmp_path):
    """Every reader's layout, not only Orbax's (a Hugging Face directory, levanter, ...)."""
    from ppl_jax.checkpoints.opener import READERS

    missing = str(tmp_path / "nowhere")
    with pytest.raises(CheckpointError) as opened:
        open_checkpoint(missing)
    assert str(opened.value).startswith(
        f"checkpoint.dir: no such directory {missing!r}. Give a checkpoint of a layout ppl_jax "
        f"reads: a Hugging Face hub repository, an Orbax v1 checkpoint, a levanter run, "
    )
    for reader in READERS:
        assert reader.layout_name.split(" (")[0] in str(opened.value)
    with pytest.raises(CheckpointError) as orbax_only:
        open_checkpoint(missing, "orbax")
    assert "a Hugging Face directory" not in str(orbax_only.value)
    assert "a ppl_jax Orbax checkpoint, another trainer's Orbax checkpoint" in str(orbax_only.value)
    with pytest.raises(CheckpointError) as opened_hf:
        open_checkpoint(missing, "hf")
    assert "config.json' is missing; a Hugging Face checkpoint directory" in str(opened_hf.value)
    assert missing in str(opened_hf.value)


def test_orbax_steps_latest_and_architecture(orbax_dir):
    path, _ = orbax_dir
    ckpt = open_checkpoint(path)
    assert ckpt.steps() == [3, 7, 10]
    assert ckpt.resolve_step(None) == 10
    assert ckpt.resolve_step(7) == 7
    with pytest.raises(CheckpointError, match=r"checkpoint.step=8 is not in .* \[3, 7, 10\]"):
        ckpt.resolve_step(8)
    assert ckpt.description() == helpers.TINY.to_dict()
    assert ckpt.description(3) == helpers.TINY.to_dict()
    model = architecture.resolve(ckpt).model()
    assert (model.vocab_size, model.max_positions) == (256, 128)
    assert model.description == helpers.TINY.to_dict()
    arch = architecture.resolve(ckpt)  # one resolution: the setup's, the reference's, the harness's
    assert arch.description == helpers.TINY.to_dict() and arch.family.name == "llama"
    assert arch.attention("auto", "float32") == "xla"  # CPU
    assert arch.attention("splash", "bfloat16") == "splash"
    assert arch.model().description == model.description
    bf16 = architecture.resolve(ckpt, 3).model("bfloat16", "xla")
    assert {leaf.dtype for leaf in jax.tree.leaves(bf16.abstract_params)} == {
        jnp.dtype(jnp.bfloat16)
    }
    with pytest.raises(ConfigError, match=r"model.dtype='float16' is not one of"):
        architecture.resolve(ckpt).model("float16")


def test_a_later_step_is_seen_as_latest(tmp_path):
    path = str(tmp_path / "ckpt")
    helpers.save_random_checkpoint(path, steps=(1,))
    ckpt = open_checkpoint(path)
    assert ckpt.resolve_step(None) == 1
    helpers.save_random_checkpoint(path, steps=(2,))
    assert (ckpt.steps(), ckpt.resolve_step(None)) == ([1, 2], 2)


def test_hf_has_one_set_of_weights_and_its_config(tmp_path):
    path = os.path.join(GOLDEN_HF, "gpt2")
    ckpt = open_checkpoint(path)
    assert (ckpt.steps(), ckpt.resolve_step(None), ckpt.resolve_step(5)) == ([], None, None)
    desc = safetensors.read_description(path)
    assert ckpt.description() == desc
    assert desc["family"] == "gpt2"
    model = architecture.resolve(ckpt).model()
    assert (model.vocab_size, model.max_positions) == (desc["vocab_size"], desc["max_positions"])
    assert model.description == desc


def test_orbax_tokenizer_is_the_stored_one(orbax_dir, tmp_path):
    path, _ = orbax_dir
    ckpt = open_checkpoint(path)
    original = tokenizer_lib.HFTokenizer.from_file(BPE_JSON)
    assert ckpt.tokenizer().describe() == original.describe()
    tok = ckpt.tokenizer(step=3)
    assert isinstance(tok, tokenizer_lib.HFTokenizer)
    np.testing.assert_array_equal(tok.encode([TEXT])[0], original.encode([TEXT])[0])
    assert (tok.bos_id, tok.eos_id, tok.vocab_size) == (
        original.bos_id,
        original.eos_id,
        original.vocab_size,
    )
    bare = str(tmp_path / "bare")  # metadata without a tokenizer
    params = helpers.random_params()
    state = {"step": 1, "params": params, "opt_state": optax.adamw(1e-3).init(params)}
    checkpoint.save_train_state(bare, 1, state, {"model": helpers.TINY.to_dict()})
    assert open_checkpoint(bare).tokenizer() is None


def test_hf_tokenizer_is_read_when_there(tmp_path):
    path = str(tmp_path / "gpt2")
    shutil.copytree(os.path.join(GOLDEN_HF, "gpt2"), path)
    ckpt = open_checkpoint(path)
    assert ckpt.tokenizer() is None
    shutil.copy(BPE_JSON, os.path.join(path, "tokenizer.json"))
    tok = ckpt.tokenizer()
    assert isinstance(tok, tokenizer_lib.HFTokenizer)
    expected = tokenizer_lib.HFTokenizer.from_file(BPE_JSON).encode([TEXT])[0]
    np.testing.assert_array_equal(tok.encode([TEXT])[0], expected)


def test_an_evaluator_without_a_tokenizer_is_one_sentence(tmp_path):
    """The README's library example on a checkpoint that carries no tokenizer: `ckpt.tokenizer()`
    is None, and the Evaluator said only "needs the tokenizer" (a bare ValueError; issue 39,
    item 9); now one sentence naming the dataset, `load_tokenizer` and `data.tokenizer`."""
    import ppl_jax

    ckpt = open_checkpoint(os.path.join(GOLDEN_HF, "gpt2"))
    assert ckpt.tokenizer() is None
    web = ppl_jax.DatasetSpec(name="web", path=helpers.corpus_files(tmp_path, ["text"]))
    with pytest.raises(ConfigError) as e:
        ppl_jax.Evaluator(
            architecture.resolve(ckpt).model(), mesh_lib.make_mesh(-1, 1), [web], ckpt.tokenizer()
        )
    message = str(e.value)
    assert message.startswith("dataset 'web': the Evaluator has no tokenizer to prepare it with")
    assert "ppl_jax.load_tokenizer(PATH)" in message and "data.tokenizer" in message
    assert message.count(". ") == 0 and message.endswith(").")


@pytest.mark.parametrize("dtype", ["float32", pytest.param("bfloat16", marks=pytest.mark.slow)])
def test_orbax_restore_is_restore_params(orbax_dir, dtype):
    path, saved = orbax_dir
    ckpt = open_checkpoint(path)
    model = architecture.resolve(ckpt).model(dtype)
    target, _ = _targets(model, jnp.dtype(dtype))
    for step, expected_step in ((None, 10), (3, 3)):
        params = ckpt.restore(step, target)
        _assert_bitwise_equal(params, checkpoint.restore_params(path, expected_step, target))
        if dtype == "float32":  # the very params saved at that step
            for name, x in weight_paths(saved[expected_step]).items():
                np.testing.assert_array_equal(np.asarray(weight_paths(params)[name]), x)


def test_hf_restore_is_load_params():
    path = os.path.join(GOLDEN_HF, "llama")  # sharded safetensors
    ckpt = open_checkpoint(path)
    target, _ = _targets(architecture.resolve(ckpt).model())
    _assert_bitwise_equal(ckpt.restore(None, target), safetensors.load_params(path, target))


def _save(path: str, step: int, description: dict, cfg=helpers.TINY) -> None:
    params = helpers.random_params(cfg, seed=step)
    state = {"step": step, "params": params, "opt_state": optax.adamw(1e-3).init(params)}
    checkpoint.save_train_state(path, step, state, {"model": description})


def test_steps_saved_without_a_default_key_are_the_same_architecture(tmp_path):
    path = str(tmp_path / "ckpt")
    stored = {k: v for k, v in helpers.TINY.to_dict().items() if k != "rope_theta"}
    for step in (1, 2):
        _save(path, step, stored)
    ckpt = open_checkpoint(path)
    model = architecture.resolve(ckpt, 1).model()
    assert ckpt.description(2) != model.description  # the raw dict lacks the default
    architecture.check_same(ckpt, 2, model)
    architecture.check_same(ckpt, 1, model)


def test_a_step_of_another_architecture_is_refused(tmp_path):
    path = str(tmp_path / "ckpt")
    deeper = dataclasses.replace(helpers.TINY, num_layers=3)
    _save(path, 1, helpers.TINY.to_dict())
    _save(path, 2, deeper.to_dict(), deeper)
    ckpt = open_checkpoint(path)
    model = architecture.resolve(ckpt, 1).model()
    with pytest.raises(CheckpointError) as e:
        architecture.check_same(ckpt, 2, model)
    assert str(e.value) == (
        f"step 2 of {path!r} holds another architecture than the model being scored; a sweep "
        f"scores the steps of one model."
    )
