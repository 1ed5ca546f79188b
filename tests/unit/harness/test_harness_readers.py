"""The harness model opens checkpoints as the command line and the library do (one
`Checkpoint`, one tokenizer resolution): a hub id with `tokenizer=auto` (which failed in the
harness where the command line worked), an Orbax directory; its `--model_args` mistakes are one
sentence each, checked before any weight is read; its progress bar; its output subfolder named
after the checkpoint (issues 25 and 26)."""

from __future__ import annotations

import hashlib
import os

import numpy as np
import pytest

lm_eval = pytest.importorskip("lm_eval")

import harness_tasks as tasks  # noqa: E402
from lm_eval.api.instance import Instance  # noqa: E402

from ppl_jax.checkpoints import architecture, open_checkpoint  # noqa: E402
from ppl_jax.config import defaults, settings  # noqa: E402
from ppl_jax.errors import ConfigError  # noqa: E402
from ppl_jax.evaluation.run.setup import set_up  # noqa: E402
from ppl_jax.harness import arguments, backend  # noqa: E402
from ppl_jax.harness.model import PplJaxLM  # noqa: E402
from ppl_jax.models.interface import weight_paths  # noqa: E402
from ppl_jax.runtime import mesh as mesh_lib  # noqa: E402

LLAMA = os.path.join(tasks.MODELS, "llama")  # a Hugging Face directory with its tokenizer.json


@pytest.fixture
def hub_cache(tmp_path, monkeypatch):
    """`hf://org/tiny` in a hand-made offline hub cache: the golden Llama with its tokenizer."""
    root = tmp_path / "hub"
    monkeypatch.setenv("HF_HUB_CACHE", str(root))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    folder = root / "models--org--tiny"
    commit = hashlib.sha1(b"org/tiny@main").hexdigest()
    (folder / "refs").mkdir(parents=True)
    (folder / "refs" / "main").write_text(commit)
    snap = folder / "snapshots" / commit
    snap.mkdir(parents=True)
    (folder / "blobs").mkdir()
    for name in os.listdir(LLAMA):
        data = open(os.path.join(LLAMA, name), "rb").read()
        blob = folder / "blobs" / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        os.symlink(os.path.relpath(blob, snap), snap / name)
    return root


def _command_line(checkpoint: str, tmp_path):
    """What `ppl-jax --config.checkpoint.dir=checkpoint` builds before reading weights."""
    (tmp_path / "val.txt").write_text("hello world, the command line reads this text.")
    c = defaults.get_config()
    c.checkpoint.dir = checkpoint
    c.data.path = str(tmp_path / "val.txt")
    c.eval.seq_len = 16
    return set_up(settings.from_config(c), None)


def _params(ckpt, model):
    mesh = mesh_lib.make_mesh(-1, 1)
    return weight_paths(backend.restore(ckpt, ckpt.resolve_step(None), model, mesh, "float32"))


@pytest.mark.parametrize("where", ["hub", "orbax"])
def test_harness_command_line_and_library_open_a_checkpoint_the_same_way(
    where, hub_cache, tiny_checkpoint, tmp_path
):
    checkpoint = "hf://org/tiny" if where == "hub" else tiny_checkpoint
    library = open_checkpoint(checkpoint)
    lib_model = architecture.resolve(library).model()
    lib_tok, _ = library.tokenizer_for("auto", model=lib_model)
    cli = _command_line(checkpoint, tmp_path)
    mesh = mesh_lib.make_mesh(-1, 1)
    model, params, tok = backend.load(open_checkpoint(checkpoint), None, mesh)
    assert tok.describe() == lib_tok.describe() == cli.tok.describe()
    assert model.description == lib_model.description == cli.model.description
    want = _params(library, model)
    for name, x in weight_paths(params).items():
        np.testing.assert_array_equal(np.asarray(x), np.asarray(want[name]), err_msg=name)
    if where == "hub":  # the harness model itself, with its tokenizer=auto default
        lm = PplJaxLM(checkpoint=checkpoint, seq_len=16, batch_size=4)
        assert lm.ppl_tokenizer.describe() == lib_tok.describe()
        assert lm.loglikelihood([Instance("loglikelihood", {}, ("a", " b"), 0)])[0][0] < 0


def test_auto_without_a_tokenizer_names_the_key_of_the_caller(tmp_path):
    import shutil

    folder = tmp_path / "llama"
    shutil.copytree(LLAMA, folder)
    os.remove(folder / "tokenizer.json")
    with pytest.raises(ConfigError, match=r"^tokenizer=auto, but .* carries no tokenizer .*"
                       r"set tokenizer to a tokenizer.json"):  # fmt: skip
        PplJaxLM(checkpoint=str(folder), seq_len=16)
    with pytest.raises(ConfigError, match=r"^data.tokenizer=auto, but .* set data.tokenizer"):
        _command_line(str(folder), tmp_path)


@pytest.mark.parametrize(
    "key, value, words",
    [
        ("step", "abc", "model_args: step=abc is not an integer."),
        ("step", "-5", "model_args: step=-5 is not a step number (0 or more, or latest)."),
        ("seq_len", "abc", "model_args: seq_len=abc is not an integer."),
        ("mesh_data", "x", "model_args: mesh_data=x is not an integer."),
        ("mesh_model", "1.5", "model_args: mesh_model=1.5 is not an integer."),
        ("batch_size", "many", "model_args: batch_size=many is not an integer."),
        ("prefix_token_id", "bos", "model_args: prefix_token_id=bos is not an integer."),
        ("packing", "maybe", "model_args: packing=maybe is not true or false."),
    ],
)
def test_bad_model_args_are_one_sentence_before_any_weight(key, value, words, monkeypatch):
    from ppl_jax.checkpoints.readers.huggingface import HFDirectory

    def no_weights(*args, **kwargs):
        raise AssertionError("weights read before the model_args were checked")

    monkeypatch.setattr(HFDirectory, "restore", no_weights)
    with pytest.raises(ConfigError) as e:
        PplJaxLM.create_from_arg_string(f"checkpoint={LLAMA},{key}={value}")
    assert str(e.value) == words
    with pytest.raises(ConfigError) as e:  # the harness's own command line, before its tasks
        arguments.check_command_line(["--model", "ppl_jax", "--model_args",
                                      f"checkpoint={LLAMA},{key}={value}", "--tasks", "x"])  # fmt: skip
    assert str(e.value) == words


def test_no_bos_or_eos_is_checked_before_the_tasks_in_the_command_lines_words(tiny_checkpoint):
    with pytest.raises(ConfigError, match=r"give prefix_token_id=ID in --model_args\.$"):
        arguments.check_command_line(
            ["--model=ppl_jax", f"--model_args=checkpoint={tiny_checkpoint}"]
        )
    arguments.check_command_line(["--model", "hf", "--model_args", "pretrained=x"])  # not ours


def test_requests_show_a_progress_bar_unless_disabled(capfd):
    lm = PplJaxLM(checkpoint=LLAMA, seq_len=16, batch_size=4)
    requests = [Instance("loglikelihood", {}, ("a b", f" c{i}"), i) for i in range(6)]
    lm.loglikelihood(requests)
    err = capfd.readouterr().err
    assert "Running loglikelihood requests: 100%" in err and "6/6" in err, err[-500:]
    lm.loglikelihood(requests, disable_tqdm=True)
    assert "Running loglikelihood requests" not in capfd.readouterr().err
    rolling = [Instance("loglikelihood_rolling", {}, ("some text to roll over " * 4,), 0)]
    lm.loglikelihood_rolling(rolling)
    assert "Running loglikelihood_rolling requests: 100%" in capfd.readouterr().err


def test_the_output_subfolder_is_named_after_the_checkpoint(tmp_path):
    from lm_eval.loggers import EvaluationTracker

    tracker = EvaluationTracker(output_path=str(tmp_path))
    log = tracker.general_config_tracker.log_experiment_args
    # `mesh_model=1` made the name "1" (lm-eval reads `model=`); no checkpoint key, a random id.
    log(model_source="ppl_jax", model_args="checkpoint=/runs/llama/ckpt,mesh_model=1",
        system_instruction=None, chat_template=None, fewshot_as_multiturn=False)  # fmt: skip
    assert tracker.general_config_tracker.model_name_sanitized == "__runs__llama__ckpt"
    log(model_source="ppl_jax", model_args={"checkpoint": "hf://org/tiny@step1000"},
        system_instruction=None, chat_template=None, fewshot_as_multiturn=False)  # fmt: skip
    assert tracker.general_config_tracker.model_name_sanitized == "hf__org__tiny@step1000"
    log(model_source="hf", model_args="pretrained=org/name,checkpoint=x",
        system_instruction=None, chat_template=None, fewshot_as_multiturn=False)  # fmt: skip
    assert tracker.general_config_tracker.model_name_sanitized == "org__name"  # not ours
