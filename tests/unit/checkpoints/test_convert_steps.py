"""`ppl-jax convert --step N`: Hugging Face directories converted into one Orbax directory at
their own steps make a sweep (the documented way, docs/checkpoints.md); a step held already, a
folder of other files and another architecture are each one sentence, before any weight is
read, and nothing is written."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

import ppl_jax
from ppl_jax.checkpoints import architecture
from ppl_jax.cli import convert as convert_cli
from ppl_jax.errors import CheckpointError, ConfigError

import helpers

GOLDEN_HF = os.path.join(helpers.GOLDEN, "hf")


def hf_copy(tmp_path, name: str, family: str = "gpt2", scale: float = 1.0) -> str:
    """A copy of the committed `family` directory, every weight times `scale` (another step of
    the same model)."""
    path = str(tmp_path / name)
    shutil.copytree(os.path.join(GOLDEN_HF, family), path)
    if scale != 1.0:
        for file in os.listdir(path):
            if file.endswith(".safetensors"):
                weights = load_file(os.path.join(path, file))
                save_file({k: v * np.float32(scale) for k, v in weights.items()}, f"{path}/{file}")
    return path


def restored(path: str, step: int) -> dict:
    ckpt = ppl_jax.open_checkpoint(path)
    model = architecture.resolve(ckpt).model()
    from ppl_jax.runtime import mesh as mesh_lib

    target, _ = mesh_lib.param_targets(
        model.abstract_params, model.logical_axes, mesh_lib.make_mesh(-1, 1), mesh_lib.DEFAULT_RULES
    )
    return jax.device_get(ckpt.restore(step, target))


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    """Two Hugging Face directories, steps 1000 and 2000, converted into one Orbax directory by
    the command line."""
    tmp = tmp_path_factory.mktemp("sweep")
    dirs = {1000: hf_copy(tmp, "checkpoint-1000"), 2000: hf_copy(tmp, "checkpoint-2000", scale=0.5)}
    out = str(tmp / "orbax")
    for step, path in dirs.items():
        assert convert_cli.main([path, out, f"--step={step}"]) == 0
    return dirs, out


def test_converted_steps_make_a_sweep(sweep, capsys):
    dirs, out = sweep
    assert sorted(os.listdir(out)) == ["1000", "2000"]
    ckpt = ppl_jax.open_checkpoint(out)
    assert ckpt.steps() == [1000, 2000]
    first, second = restored(out, 1000), restored(out, 2000)
    for a, b in zip(jax.tree.leaves(first), jax.tree.leaves(second), strict=True):
        np.testing.assert_array_equal(b, a * np.float32(0.5))  # each step its own weights
    assert any(np.abs(a).max() > 0 for a in jax.tree.leaves(first))
    # Each step's own source is recorded.
    for step, path in dirs.items():
        with open(os.path.join(out, str(step), "metadata", "metadata"), encoding="utf-8") as f:
            assert json.load(f)["source"]["dir"] == os.path.abspath(path)


def test_a_step_held_already_is_refused_and_nothing_is_written(sweep, tmp_path, capsys):
    dirs, out = sweep
    before = sorted(os.walk(out))
    assert convert_cli.main([dirs[1000], out, "--step=2000"]) == 2
    err = capsys.readouterr().err
    assert err == (
        f"ppl-jax: error: --out={out!r} already holds step 2000; give another --step (nothing "
        f"was written).\n"
    )
    assert sorted(os.walk(out)) == before


def test_another_architecture_or_other_files_are_refused_before_any_weight(sweep, tmp_path):
    _, out = sweep
    llama = hf_copy(tmp_path, "llama", "llama")
    with pytest.raises(CheckpointError, match="holds step 2000 of another architecture"):
        convert_cli.convert(llama, out, step=3000)
    assert sorted(os.listdir(out)) == ["1000", "2000"]
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("mine")
    with pytest.raises(CheckpointError, match="holds 'notes.txt', not a step folder"):
        convert_cli.convert(llama, str(other), step=3)
    with pytest.raises(ConfigError, match=r"--step=-1: give the step as a whole number"):
        convert_cli.convert(llama, str(tmp_path / "new"), step=-1)
    assert not (tmp_path / "new").exists()


def test_a_step_past_what_a_run_reads_is_refused_before_anything_is_written(tmp_path, capsys):
    """Orbax saved it as an object array (a traceback) and left its temporary folder behind."""
    out = tmp_path / "orbax"
    step = "1000000000000000000000000000000"
    assert convert_cli.main([os.path.join(GOLDEN_HF, "gpt2"), str(out), f"--step={step}"]) == 2
    assert capsys.readouterr().err == (
        f"ppl-jax: error: --step={step}: give the step as a whole number from 0 to "
        f"9,223,372,036,854,775,807 (nothing was written).\n"
    )
    assert not out.exists()


def test_a_killed_converts_unfinished_step_is_written_again(sweep, tmp_path, capsys):
    """`kill -9` during a save leaves Orbax's temporary folder of its step: the same command
    writes the step (the folder removed), another step's is let be, finalized steps untouched."""
    dirs, out = sweep
    copy = str(tmp_path / "orbax")
    shutil.copytree(out, copy)
    for name in ("3000.orbax-checkpoint-tmp-1764633600", "4000.orbax-checkpoint-tmp-1764633601"):
        os.makedirs(os.path.join(copy, name, "state"))
        with open(os.path.join(copy, name, "state", "partial"), "wb") as f:
            f.write(b"half a save")
    finalized = {
        os.path.relpath(os.path.join(root, name), copy): open(os.path.join(root, name), "rb").read()
        for step in ("1000", "2000")
        for root, _, names in os.walk(os.path.join(copy, step))
        for name in names
    }
    assert convert_cli.main([dirs[1000], copy, "--step=3000"]) == 0, capsys.readouterr().err
    assert sorted(os.listdir(copy)) == [
        "1000",
        "2000",
        "3000",
        "4000.orbax-checkpoint-tmp-1764633601",
    ]
    assert ppl_jax.open_checkpoint(copy).steps() == [1000, 2000, 3000]
    for rel, data in finalized.items():
        with open(os.path.join(copy, rel), "rb") as f:
            assert f.read() == data, rel
    for a, b in zip(
        jax.tree.leaves(restored(copy, 3000)), jax.tree.leaves(restored(copy, 1000)), strict=True
    ):
        np.testing.assert_array_equal(a, b)


@pytest.mark.slow
@pytest.mark.skipif(not hasattr(signal, "SIGTERM"), reason="POSIX signals")
def test_a_convert_stopped_by_sigterm_says_what_is_true_and_the_same_command_finishes(tmp_path):
    """A real SIGTERM while the step is being saved: the line says what is left and what the
    same command does, and the same command then writes the step."""
    hf, out = os.path.join(GOLDEN_HF, "gpt2"), tmp_path / "orbax"
    command = [sys.executable, "-m", "ppl_jax", "convert", hf, str(out), "--step=5"]
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    proc = subprocess.Popen(command, stderr=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                            env=env)  # fmt: skip
    deadline = time.monotonic() + 120
    while proc.poll() is None and time.monotonic() < deadline:
        if out.is_dir() and any(n.startswith("5.orbax-checkpoint-tmp") for n in os.listdir(out)):
            proc.send_signal(signal.SIGTERM)
            break
        time.sleep(0.001)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM, err  # caught mid-save
    assert err.splitlines() == [f"ppl-jax: stopped by SIGTERM; {convert_cli.STOPPED}."]
    assert [n for n in os.listdir(out) if n.startswith("5.orbax-checkpoint-tmp")]
    again = subprocess.run(command, capture_output=True, text=True, env=env, timeout=120)
    assert again.returncode == 0, again.stderr
    assert sorted(os.listdir(out)) == ["5"]
