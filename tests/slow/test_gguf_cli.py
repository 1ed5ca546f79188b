"""A GGUF file on the command line: `--config.checkpoint.dir=model.gguf` scores by the path alone
(architecture and tokenizer from the file; the results name the reader and the file, and the
perplexity is the library's on the same windows), and a truncated file is one line with exit 2."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from ppl_jax.config.defaults import get_config
from ppl_jax.config.settings import from_config
from ppl_jax.evaluation.run import evaluate

import helpers

pytestmark = pytest.mark.slow
GOLDEN = os.path.join(helpers.GOLDEN, "gguf", "qwen3.gguf")
TEXT = "On the fifth day the rain stopped; the water fell by 12 inches before noon.\n" * 6


def _cli(*flags, tmp_path):
    env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS=helpers.xla_flags())
    cmd = [sys.executable, "-m", "ppl_jax", f"--config.output.dir={tmp_path / 'out'}",
           "--config.output.progress=false", *flags]  # fmt: skip
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600,
                          cwd=helpers.REPO)  # fmt: skip


def test_scores_a_gguf_file_by_its_path(tmp_path):
    corpus = tmp_path / "doc.txt"
    corpus.write_text(TEXT)
    proc = _cli(f"--config.checkpoint.dir={GOLDEN}", f"--config.data.path={corpus}",
                "--config.eval.seq_len=64", tmp_path=tmp_path)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    r = json.loads((tmp_path / "out" / "results.json").read_text())
    assert r["checkpoint"]["format"] == "gguf" and r["checkpoint"]["path"].endswith("qwen3.gguf")
    c = get_config()
    c.checkpoint.dir, c.data.path, c.eval.seq_len = GOLDEN, str(corpus), 64
    c.output.dir, c.output.progress = str(tmp_path / "lib"), False
    lib = evaluate(from_config(c))
    assert np.isclose(r["perplexity"], lib.metrics["perplexity"], rtol=1e-6)


def test_a_truncated_file_is_one_line_and_exit_2(tmp_path):
    bad = tmp_path / "model.gguf"
    shutil.copy(GOLDEN, bad)
    bad.write_bytes(bad.read_bytes()[:-500])
    corpus = tmp_path / "doc.txt"
    corpus.write_text(TEXT)
    proc = _cli(f"--config.checkpoint.dir={bad}", f"--config.data.path={corpus}",
                tmp_path=tmp_path)  # fmt: skip
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    line = proc.stderr.strip().splitlines()[-1]
    assert line.startswith("ppl-jax: error: ") and "truncated" in line
