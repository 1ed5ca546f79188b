"""A sweep over the steps of the golden MaxText run (tests/golden/trainers, written by MaxText's
own trainer) from the command line gives each step's single-run numbers exactly."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import helpers


def _run(args, cwd):
    return subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=600)


def test_maxtext_sweep_equals_single_runs(tmp_path):
    # The golden MaxText run (tests/golden/trainers): a sweep over its steps gives each step's
    # single-run numbers exactly.
    name = os.path.join(helpers.GOLDEN, "trainers", "maxtext_llama2_scanned")
    arch = open(os.path.join(name, "architecture.txt")).read().strip()
    (tmp_path / "val.txt").write_text("".join(c for c in helpers.stdlib_text(2000) if ord(c) < 128))
    common = [f"--config.checkpoint.dir={name}", f"--config.checkpoint.architecture={arch}",
              "--config.data.path=val.txt", "--config.data.tokenizer=byte",
              "--config.data.allow_tokenizer_mismatch=true", "--config.eval.seq_len=16"]  # fmt: skip
    runs = {}
    for step in ("all", "0", "1"):
        out = tmp_path / f"out_{step}"
        run = _run([sys.executable, "-m", "ppl_jax.cli.main", *common,
                    f"--config.checkpoint.step={step}", f"--config.output.dir={out}"], tmp_path)  # fmt: skip
        assert run.returncode == 0, run.stderr[-3000:]
        runs[step] = out
    sweep = [json.loads(x) for x in open(runs["all"] / "results.jsonl")]
    sums = {r["step"]: r["sums"] for r in sweep if r["kind"] == "dataset"}
    assert sorted(sums) == [0, 1]
    for step in (0, 1):
        single = json.load(open(runs[str(step)] / "results.json"))
        text = json.dumps(single)
        assert str(sums[step]["nll_sum"]) in text, (step, sums[step])
