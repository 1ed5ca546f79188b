"""The command line end to end: the demo checkpoint on real text, and the built-in default."""

import json
import math
import os
import subprocess
import sys

import pytest

import helpers

REQUIRED_KEYS = {
    "nll_sum",
    "num_tokens",
    "perplexity",
    "bits_per_token",
    "num_bytes",
    "bits_per_byte",
    "byte_perplexity",
    "num_words",
    "word_perplexity",
    "num_documents",
    "num_windows",
    "tokens_per_second",
    "checkpoint",
    "config",
}


def run_cli(*flags, tmp_path, config=None):
    out = tmp_path / "out"
    cmd = [
        sys.executable,
        "-m",
        "ppl_jax",
        f"--config.output.dir={out}",
        "--config.output.progress=false",
        *flags,
    ]
    if config:
        cmd.insert(3, f"--config={config}")
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    env.pop("XLA_FLAGS", None)
    proc = subprocess.run(
        cmd, capture_output=True, text=True, env=env, timeout=600, cwd=helpers.REPO
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc, json.loads((out / "results.json").read_text())


@pytest.mark.skipif(
    not os.path.exists(helpers.WIKITEXT_TEST),
    reason=f"shared data folder absent ({helpers.WIKITEXT_TEST})",
)
def test_demo_checkpoint_on_wikitext2_test(tmp_path, demo_checkpoint):
    proc, r = run_cli(
        f"--config.checkpoint.dir={demo_checkpoint}",
        f"--config.data.path={helpers.WIKITEXT_TEST}",
        "--config.data.name=wikitext-2-test",
        "--config.eval.batch_size=16",
        "--config.eval.stride=256",
        tmp_path=tmp_path,
    )
    assert REQUIRED_KEYS <= set(r)
    raw = open(helpers.WIKITEXT_TEST, "rb").read()
    # Byte tokens: every byte after the first is scored, the tail included.
    assert r["num_tokens"] == len(raw) - 1
    assert r["num_bytes"] == len(raw) - 1
    assert r["num_words"] == len(raw[1:].decode("utf-8").split())
    assert r["num_documents"] == 1
    assert r["num_windows"] == 1 + math.ceil((len(raw) - 1 - 256) / 256)
    assert r["perplexity"] == pytest.approx(math.exp(r["nll_sum"] / r["num_tokens"]), rel=1e-12)
    assert r["bits_per_byte"] == pytest.approx(r["nll_sum"] / r["num_bytes"] / math.log(2))
    assert r["word_perplexity"] == pytest.approx(math.exp(r["nll_sum"] / r["num_words"]))
    # A trained model: far below the 8 bits of a uniform byte model.
    assert r["bits_per_byte"] < 4.0
    assert r["checkpoint"]["path"] == os.path.abspath(demo_checkpoint)
    assert r["config"]["data"]["path"] == helpers.WIKITEXT_TEST
    for label in ("perplexity", "bits per byte", "gzip -9", "word perplexity", "tokens/s"):
        assert label in proc.stdout


def test_default_run_scores_held_out_stdlib_modules(tmp_path):
    from ppl_jax.config import HELD_OUT_MODULES, held_out_paths

    proc, r = run_cli(tmp_path=tmp_path)
    paths = held_out_paths().split(",")
    assert r["num_documents"] == len(HELD_OUT_MODULES) == len(paths)
    texts = [open(p, encoding="utf-8").read() for p in paths]
    joined = "\n\n".join(texts).encode("utf-8")
    assert r["num_tokens"] == len(joined) - 1
    assert r["bits_per_byte"] < r["gzip_bits_per_byte"] + 1.0
    assert r["bits_per_byte"] < 4.0
    assert "gzip -9" in proc.stdout
