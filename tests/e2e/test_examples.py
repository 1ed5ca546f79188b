"""examples/ runs as a user runs it, and gives the command line's numbers."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

import helpers

pytestmark = pytest.mark.slow  # trains a model, then a sweep of the command line


def test_the_training_loop_example_equals_the_command_line(tmp_path):
    script = os.path.join(helpers.REPO, "examples", "training_loop.py")
    r = subprocess.run(
        [sys.executable, script, str(tmp_path)], capture_output=True, text=True, timeout=600
    )
    assert r.returncode == 0, r.stderr[-3000:]
    found = {int(s): float(v) for s, v in re.findall(r"step (\d+): bits per byte (\S+)", r.stdout)}
    assert sorted(found) == [100, 200, 300]
    out = tmp_path / "cli"
    cli = subprocess.run(
        [
            sys.executable, "-m", "ppl_jax", f"--config.checkpoint.dir={tmp_path / 'run'}",
            "--config.checkpoint.step=all", f"--config.data.path={tmp_path / 'prose' / 'doc0.txt'}",
            "--config.data.name=prose", "--config.eval.seq_len=64", "--config.eval.batch_size=8",
            f"--config.output.dir={out}", "--config.output.progress=false",
        ],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert cli.returncode == 0, cli.stderr[-3000:]
    records = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    for r in records:
        assert round(r["metrics"]["bits_per_byte"], 4) == found[r["step"]]
