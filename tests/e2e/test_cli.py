"""The command line end to end: the built-in default (the demo checkpoint on its held-out text,
shipped with the package: the figure the README quotes, on every Python), and the WikiText-2
config file without its data. The demo checkpoint on WikiText-2
itself is in tests/shared_data/."""

import json
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
    env["XLA_FLAGS"] = helpers.xla_flags(optimized=True)  # one CPU device, as a user's machine
    proc = subprocess.run(
        cmd, capture_output=True, text=True, env=env, timeout=600, cwd=helpers.REPO
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc, json.loads((out / "results.json").read_text())


# The demo's figure on its shipped text (CPython 3.11.7's held-out modules), the same on every
# Python: bits per byte, and gzip -9's on the same text. The README quotes both to 3 decimals.
DEMO_BITS_PER_BYTE, DEMO_GZIP_BITS_PER_BYTE = 1.9176, 2.1735


def test_default_run_scores_the_shipped_held_out_text(tmp_path):
    import re

    from ppl_jax.config.defaults import HELD_OUT_MODULES, held_out_paths

    proc, r = run_cli(tmp_path=tmp_path)
    paths = held_out_paths().split(",")
    assert r["num_documents"] == len(HELD_OUT_MODULES) == len(paths)
    texts = [open(p, encoding="utf-8").read() for p in paths]
    joined = "\n\n".join(texts).encode("utf-8")
    assert r["num_tokens"] == len(joined) - 1 == 177_500
    assert "gzip -9" in proc.stdout
    assert round(r["bits_per_byte"], 4) == DEMO_BITS_PER_BYTE, r["bits_per_byte"]
    assert round(r["gzip_bits_per_byte"], 4) == DEMO_GZIP_BITS_PER_BYTE
    # The README's and the docs' figure is this run's.
    quoted = f"({r['bits_per_byte']:.3f} against {r['gzip_bits_per_byte']:.3f}"
    assert quoted == "(1.918 against 2.173"
    for page in ("README.md", "docs/index.md"):
        with open(os.path.join(helpers.REPO, page), encoding="utf-8") as f:
            text = re.sub(r"\s+", " ", f.read())
        assert quoted in text, page


def test_wikitext2_config_takes_its_path_from_the_command_line(tmp_path, demo_checkpoint):
    text = tmp_path / "wiki.test.tokens"
    text.write_text(helpers.stdlib_text(4000), encoding="utf-8")
    _, r = run_cli(
        f"--config.checkpoint.dir={demo_checkpoint}",
        tmp_path=tmp_path,
        config=f"configs/wikitext2.py:{text}",
    )
    assert r["config"]["data"]["path"] == str(text)
    assert (r["config"]["data"]["name"], r["config"]["data"]["format"]) == (
        "wikitext-2-test",
        "text",
    )
    assert r["num_documents"] == 1 and r["num_tokens"] == len(text.read_bytes()) - 1


def test_wikitext2_config_without_its_data_says_where_it_comes_from(tmp_path):
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "wikitext2", os.path.join(helpers.REPO, "configs", "wikitext2.py")
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    with pytest.raises(FileNotFoundError, match="no WikiText-2 test file given; WikiText-2 "):
        module.get_config()
    missing = str(tmp_path / "wiki.test.tokens")
    proc = subprocess.run(
        [sys.executable, "-m", "ppl_jax", f"--config=configs/wikitext2.py:{missing}"],
        capture_output=True,
        text=True,
        env=dict(os.environ, JAX_PLATFORMS="cpu"),
        timeout=300,
        cwd=helpers.REPO,
    )
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.startswith("ppl-jax: error: ") and "Traceback" not in proc.stderr
    assert proc.stderr.count("\n") == 1  # one paragraph
    assert f"configs/wikitext2.py: no such file '{missing}'" in proc.stderr
    assert "Salesforce/wikitext" in proc.stderr
