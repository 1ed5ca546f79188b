"""The command line's last words: a reader that stops early (`ppl-jax report DIR | head -3`)
gets no BrokenPipeError traceback, and a word that is neither a flag nor a tool
(`ppl-jax some/dir`) is one sentence, not absl's usage text."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from test_report_cli import make_store

import helpers


def closed_stdout(*args: str, cwd: str = helpers.REPO) -> subprocess.CompletedProcess:
    """`python -m ppl_jax ARGS` whose stdout's reader is gone before it writes (as `| head`
    leaves it once it has its lines; closing the read end first makes every write fail)."""
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=helpers.REPO)
    env["XLA_FLAGS"] = helpers.xla_flags()
    proc = subprocess.Popen(
        [sys.executable, "-m", "ppl_jax", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        cwd=cwd,
    )
    proc.stdout.close()
    err = proc.stderr.read().decode()
    proc.wait(timeout=600)
    return subprocess.CompletedProcess(proc.args, proc.returncode, "", err)


def test_a_tool_whose_reader_stops_early_ends_quietly(tmp_path):
    make_store(tmp_path)
    r = closed_stdout("report", str(tmp_path), "--figure", "none")
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stderr and "BrokenPipe" not in r.stderr, r.stderr
    assert r.stderr == ""
    assert (tmp_path / "report.csv").exists()


def test_a_run_whose_reader_stops_early_still_writes_its_results(tmp_path):
    out = tmp_path / "out"
    corpus = helpers.corpus_files(tmp_path, [helpers.stdlib_text(2000)])  # the demo model, briefly
    r = closed_stdout(
        f"--config.output.dir={out}",
        "--config.output.progress=false",
        f"--config.data.path={corpus}",
    )
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stderr and "BrokenPipe" not in r.stderr, r.stderr
    assert json.loads((out / "results.json").read_text())["num_tokens"] > 0


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


SLOW = pytest.mark.slow


@pytest.mark.parametrize(
    "word, hint",
    [  # one case in the default tiers, the other three (a process each) in the slow tier
        pytest.param("some/dir", "ppl-jax --help lists the config keys and the tools.", marks=SLOW),
        ("reprot", "did you mean ppl-jax report?"),
        pytest.param("{run}", "to read that run's results: ppl-jax report {run}.", marks=SLOW),
        pytest.param(
            "{empty}",
            "to score a checkpoint there: ppl-jax --config.checkpoint.dir={empty}.",
            marks=SLOW,
        ),
    ],
)
def test_a_word_that_is_no_flag_nor_tool_is_one_sentence(tmp_path, word, hint):
    (tmp_path / "run").mkdir()
    make_store(tmp_path / "run")
    (tmp_path / "empty").mkdir()
    where = {"run": str(tmp_path / "run"), "empty": str(tmp_path / "empty")}
    word, hint = word.format(**where), hint.format(**where)
    r = ppl_jax("--config.output.progress=false", word)
    assert r.returncode == 2
    assert r.stdout == ""
    assert r.stderr == (
        f"ppl-jax: error: unexpected argument {word!r}: ppl-jax takes --config=FILE and "
        f"--config.KEY=VALUE, or a tool first (report, compare, view, convert, inspect); {hint}\n"
    )
    assert "USAGE" not in r.stderr
