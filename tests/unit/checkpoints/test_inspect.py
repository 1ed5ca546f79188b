"""`ppl-jax inspect`: for every reader, which reader read the checkpoint and why (its markers), its
layout, steps and stored tree, and how the stored names become the model's weights; any
failure is one line and status 2, never a traceback (issues 25 and 26)."""

from __future__ import annotations

import os
import re
import sys

import pytest

from ppl_jax.cli import inspect as inspect_cli

import helpers

TRAINERS = os.path.join(helpers.GOLDEN, "trainers")
READERS = os.path.join(helpers.GOLDEN, "readers")
MAXTEXT = os.path.join(TRAINERS, "maxtext_llama2_scanned")


def _inspect(capsys, *argv) -> tuple[int, str, str]:
    code = inspect_cli.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    return code, out, err


def _arch(folder: str) -> str:
    with open(os.path.join(folder, "architecture.txt")) as f:
        return f.read().strip()


@pytest.fixture
def trainer_models(monkeypatch):
    monkeypatch.syspath_prepend(helpers.GOLDEN)
    sys.modules.pop("trainer_models", None)


def test_own_orbax(capsys, tiny_checkpoint):
    code, out, _ = _inspect(capsys, tiny_checkpoint)
    assert code == 0
    assert "reader: OwnOrbax (a ppl_jax Orbax checkpoint), chosen for numbered Orbax steps whose " \
        "latest (5) has ppl_jax's 'metadata' item" in out  # fmt: skip
    assert "steps: 3, 5" in out and "step 5 items: _CHECKPOINT_METADATA, checksums," in out
    assert "layers/0/attn/q" in out and "architecture: llama, 2 layers" in out
    assert "mapping: none (the stored names are the model's own)" in out


def test_maxtext_with_and_without_its_architecture(capsys):
    code, out, _ = _inspect(capsys, MAXTEXT)
    assert code == 0
    assert "reader: ForeignOrbax (another trainer's Orbax checkpoint), chosen for a run folder " \
        "whose Orbax steps are under checkpoints/ (MaxText)" in out  # fmt: skip
    assert "item: items   params: params/params" in out
    assert "architecture: " in out and "carries no architecture" in out
    assert "mapping: give --architecture" in out
    code, out, _ = _inspect(capsys, MAXTEXT, f"--architecture={_arch(MAXTEXT)}")
    assert code == 0 and "mapped weights (" in out
    wanted = r"layers/1/attn/q +<- decoder/layers/self_attention/query/kernel  \[layer 1 "
    assert re.search(wanted, out)


def test_orbax_v1_run_and_bare(capsys, trainer_models):
    run = os.path.join(READERS, "orbax_v1_run", "checkpoints")
    code, out, _ = _inspect(capsys, run, "--architecture=trainer_models:linen_model")
    assert code == 0
    assert "reader: OrbaxV1 (an Orbax v1 checkpoint), chosen for numbered steps whose latest (2) " \
        "was written by the Orbax v1 API" in out  # fmt: skip
    assert "step 2: checkpointables state (PyTreeHandler)" in out and "mapped weights (" in out
    code, out, _ = _inspect(capsys, os.path.join(READERS, "orbax_v1_bare"), "--step=1")
    assert code == 0 and "chosen for the Orbax v1 marker file 'orbax.checkpoint'" in out
    assert "steps: (none: one set of weights)" in out


def test_hugging_face_directory(capsys):
    code, out, _ = _inspect(capsys, os.path.join(READERS, "sharded_qwen3"))
    assert code == 0
    assert "reader: HFDirectory (a Hugging Face directory), chosen for a config.json" in out
    assert "config.json: model_type 'qwen3'" in out
    assert "weights: model.safetensors.index.json -> 6 shards, 36 tensors" in out
    assert "model.layers.0.self_attn.q_norm.weight" in out and "bfloat16" in out
    assert "mapped weights (36, the rules of config.json's family):" in out
    assert re.search(r"layers/0/attn/q_norm +<- model.layers.0.self_attn.q_norm.weight", out)


def test_hub_repository(capsys, tmp_path, monkeypatch):
    sys.path.insert(0, os.path.dirname(__file__))
    from test_hub import HF_LLAMA, add_revision

    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    files = {n: os.path.join(HF_LLAMA, n) for n in os.listdir(HF_LLAMA)}
    commit = add_revision(tmp_path / "hub", "org/tiny", "step1000", files)
    code, out, _ = _inspect(capsys, "hf://org/tiny@step1000")
    assert (
        code == 0 and "reader: HubRepo (a Hugging Face hub repository), chosen for a hub id" in out
    )
    assert f"repository org/tiny, revision step1000 = commit {commit}" in out


@pytest.mark.parametrize(
    "argv, said",
    [
        (["{tmp}/nowhere"], "checkpoint.dir: no such directory"),
        ([MAXTEXT, "--architecture=maxtext:nosuchmodel"], "MaxText model 'nosuchmodel'"),
        ([MAXTEXT, "--mapping={tmp}/missing.yaml"], "missing.yaml"),
        ([MAXTEXT, "--step=7"], "checkpoint.step=7 is not in"),
        ([MAXTEXT, "--architecture=trainer_models:broken"], "cannot be inspected (RuntimeError"),
        (["{tmp}/ckpt", "--format=pt"], "checkpoint.format='pt' is not one of auto, orbax, "),
    ],
)
def test_every_failure_is_one_line(capsys, tmp_path, trainer_models, monkeypatch, argv, said):
    import trainer_models as tm

    def broken():
        raise RuntimeError("a model of the user's own that cannot be built")

    monkeypatch.setattr(tm, "broken", broken, raising=False)
    monkeypatch.setattr(
        inspect_cli, "inspect", _raising(inspect_cli.inspect), raising=True
    )  # any exception: one line
    code, out, err = _inspect(capsys, *[a.format(tmp=tmp_path) for a in argv])
    assert code == 2, out
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ppl-jax: error: ") and said in lines[0], err


def _raising(inspect):
    """`inspect` with the architecture's entry point's errors let through (not wrapped in
    ConfigError), as a reader's or library's own failure would be."""

    def wrapped(directory, args, out=None):
        if args.architecture == "trainer_models:broken":
            import trainer_models

            trainer_models.broken()
        return inspect(directory, args, out)

    return wrapped


def test_layers_in_natural_order_the_head_and_the_bos_policy(capsys, tmp_path):
    """Issue 39, item 17: the stored names listed blk.10 before blk.2 (as strings); inspect also
    says whether the output head is tied and whether BOS is added."""
    import json
    import shutil

    from safetensors.numpy import load_file, save_file

    src = os.path.join(helpers.GOLDEN, "hf", "llama")
    weights = {}
    for name in sorted(os.listdir(src)):
        if name.endswith(".safetensors"):
            weights.update(load_file(os.path.join(src, name)))
    layer0 = {k: v for k, v in weights.items() if k.startswith("model.layers.0.")}
    for i in range(1, 12):
        weights.update({k.replace(".0.", f".{i}.", 1): v for k, v in layer0.items()})
    with open(os.path.join(src, "config.json")) as f:
        config = json.load(f) | {"num_hidden_layers": 12}
    (tmp_path / "config.json").write_text(json.dumps(config))
    save_file(weights, str(tmp_path / "model.safetensors"))
    shutil.copy(
        os.path.join(helpers.GOLDEN, "tokenizers", "llama_bpe.json"), tmp_path / "tokenizer.json"
    )
    code, out, _ = _inspect(capsys, tmp_path)
    assert code == 0
    listed = re.findall(r"^  model\.layers\.(\d+)\.input_layernorm\.weight ", out, re.M)
    assert listed == [str(i) for i in range(12)]
    assert "output head: its own (lm_head)" in out
    assert re.search(r"^tokenizer: .*, BOS \d+ added by default \(eval.add_bos=auto\)$", out, re.M)


def test_natural_key_and_the_head_of_a_tied_model(capsys):
    names = ["blk.10.a", "blk.2.b", "blk.2.a", "output", "blk.1"]
    assert sorted(names, key=inspect_cli.natural_key) == [
        "blk.1", "blk.2.a", "blk.2.b", "blk.10.a", "output",
    ]  # fmt: skip
    code, out, _ = _inspect(capsys, os.path.join(helpers.REPO, "ppl_jax", "demo", "checkpoint"))
    assert code == 0 and "output head: tied to the embedding" in out  # the demo's
    assert "tokenizer: byte, no BOS token (eval.add_bos=auto adds none)" in out
