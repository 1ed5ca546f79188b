"""`ppl-jax --help` lists every config key, and a mistyped key is one clean line (subprocesses)."""

import os
import re
import subprocess
import sys

import pytest

from ppl_jax.config.defaults import KEY_MEANINGS, PROTOCOLS, describe_keys

import helpers


def ppl_jax(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=helpers.REPO)
    return subprocess.run(
        [sys.executable, "-m", "ppl_jax", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        cwd=helpers.REPO,
    )


@pytest.mark.parametrize(
    "flag",
    [
        "--help",
        pytest.param("--helpfull", marks=pytest.mark.slow),
        pytest.param("-h", marks=pytest.mark.slow),
    ],
)
def test_help_lists_every_key_with_default_and_meaning(flag):
    r = ppl_jax(flag)
    assert r.returncode == 0, r.stderr
    out = r.stdout
    for key, default, meaning in describe_keys():
        line = f"  {key} = {default}\n"
        assert line in out, key
        # The meaning follows its key (wrapped, so compare words).
        after = re.split(r"\n(?=  \S|\n)", out[out.index(line) + len(line) :], maxsplit=1)[0]
        assert after.split() == meaning.split(), key
    assert len(describe_keys()) == len(KEY_MEANINGS)
    for name, p in PROTOCOLS.items():
        assert f"  {name}" in out and p.note in out
    examples = out.split("examples:\n", 1)[1].split("\n\n", 1)[0]
    from ppl_jax.cli.main import EXAMPLES

    assert sum(line.startswith("  ppl-jax") for line in examples.splitlines()) == len(EXAMPLES)
    assert ("--undefok" in out) == (flag == "--helpfull")  # absl's own flags: --helpfull only


@pytest.mark.parametrize(
    ("override", "message"),
    [
        (
            "--config.eval.protocl=x",
            "unknown config key eval.protocl; did you mean eval.protocol? "
            "ppl-jax --help lists the keys.",
        ),
        (
            "--config.evl.seq_len=3",
            "unknown config key evl.seq_len; did you mean eval.seq_len? "
            "ppl-jax --help lists the keys.",
        ),
        ("--config.zzz=3", "unknown config key zzz. ppl-jax --help lists the keys."),
    ],
)
def test_a_mistyped_key_is_one_clean_line(override, message):
    r = ppl_jax("--config.output.progress=false", override)
    assert r.returncode == 2
    assert r.stdout == ""
    assert r.stderr == f"ppl-jax: error: {message}\n"


@pytest.mark.parametrize(
    ("key", "meant"),
    [("checkpoint.dtype", "model.dtype"), ("reference.step", "reference.checkpoint.step"),
     ("eval.protocl", "eval.protocol")],
)  # fmt: skip
def test_a_key_of_another_section_is_suggested_by_its_name(monkeypatch, key, meant):
    """`checkpoint.dtype` is `model.dtype` (the same name in the scored model's section), not the
    look-alike `checkpoint.step`; the sentence and its exit 2 are the command line's above."""
    from ppl_jax.cli import help as help_lib

    monkeypatch.setattr(sys, "argv", ["ppl-jax", f"--config.{key}=x"])
    assert help_lib._unknown_key(KeyError(key.rsplit(".", 1)[-1])) == (
        f"unknown config key {key}; did you mean {meant}? ppl-jax --help lists the keys."
    )


def test_a_mistyped_key_after_a_config_file_is_named_too():
    r = ppl_jax("--config=configs/default.py", "--config.eval.sq_len=3")
    assert r.returncode == 2
    assert r.stderr == (
        "ppl-jax: error: unknown config key eval.sq_len; did you mean eval.seq_len? "
        "ppl-jax --help lists the keys.\n"
    )


def test_a_tool_starts_without_the_config_and_its_layers():
    """`ppl-jax convert` of a 0.7M-parameter model took about a minute on a loaded CPU (issue
    39, item 17): the entry point imported `ppl_jax.cli.help`, and with it the config and every
    layer below (2.5 s quiet, 10 s loaded), before it looked for a tool's name."""
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "ppl_jax", "convert", "--help"],
        capture_output=True,
        text=True,
        env=dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=helpers.REPO),
        timeout=120,
        cwd=helpers.REPO,
    )
    imported = set(re.findall(r"\| +([\w.]+)$", done.stderr, re.M))
    assert done.returncode == 0 and done.stdout.startswith("usage: ppl-jax convert")
    assert not imported & {"ppl_jax.cli.help", "ppl_jax.config.defaults", "jax"}
