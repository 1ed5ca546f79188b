"""The same run gives the same counts and NLL sum whatever the batch size, mesh and processes."""

import json
import os
import subprocess
import sys

import pytest

from ppl_jax.config.defaults import get_config
from ppl_jax.config.settings import from_config
from ppl_jax.evaluation.run import evaluate
from ppl_jax.evaluation.spec import RunSpec

import helpers


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> str:
    """60,000 characters of real text (standard-library source: prose and code), as `lines`
    documents."""
    path = tmp_path_factory.mktemp("corpus") / "stdlib.txt"
    path.write_text(helpers.stdlib_text(60_000), encoding="utf-8")
    return str(path)


def settings(checkpoint: str, corpus: str, **overrides) -> RunSpec:
    c = get_config()
    c.checkpoint.dir = checkpoint
    c.data.path = corpus
    c.data.format = "lines"
    c.eval.seq_len = 64
    c.eval.stride = 48
    c.output.progress = False
    c.output.gzip_baseline = False
    for key, value in overrides.items():
        section, name = key.split("__")
        setattr(getattr(c, section), name, value)
    return from_config(c)


@pytest.fixture(scope="module")
def reference(tiny_checkpoint, corpus):
    return evaluate(settings(tiny_checkpoint, corpus, eval__batch_size=8))


@pytest.mark.parametrize(
    "overrides",
    [
        {"eval__batch_size": 16},
        {"eval__batch_size": 24, "mesh__data": 8, "mesh__model": 1},
        {"eval__batch_size": 8, "mesh__data": 2, "mesh__model": 4},
        {"eval__batch_size": 2, "mesh__data": 2, "mesh__model": 4},
        {"eval__batch_size": 4, "mesh__data": 1, "mesh__model": 8},
    ],
    ids=["batch16", "batch24-8x1", "batch8-2x4", "batch2-2x4", "batch4-1x8"],
)
def test_batch_size_and_mesh_do_not_change_the_result(
    tiny_checkpoint, corpus, reference, overrides
):
    ev = evaluate(settings(tiny_checkpoint, corpus, **overrides))
    assert ev.sums.num_tokens == reference.sums.num_tokens
    assert ev.sums.num_windows == reference.sums.num_windows
    assert ev.sums.num_bytes == reference.sums.num_bytes
    assert ev.sums.nll_sum == pytest.approx(reference.sums.nll_sum, rel=1e-6)
    mesh = ev.mesh_shape
    assert (mesh["data"], mesh["model"]) == (
        overrides.get("mesh__data", 8),
        overrides.get("mesh__model", 1),
    )


def test_counts_are_those_of_the_stream(reference):
    ev = reference
    n = ev.plan.windows.tokens.size
    assert ev.sums.num_tokens == n - 1  # every token after the first, tail included
    assert ev.sums.num_windows == 1 + -(-(n - 1 - 64) // 48)


def test_two_real_processes_match_one(tiny_checkpoint, corpus, reference, tmp_path):
    env = dict(os.environ)
    env.update(
        {
            "XLA_FLAGS": "--xla_force_host_platform_device_count=4",
            "JAX_PLATFORMS": "cpu",
            "PYTHON": sys.executable,
        }
    )
    out = tmp_path / "out"
    cmd = [
        "bash",
        os.path.join(helpers.REPO, "launch", "local.sh"),
        "2",
        f"--config.checkpoint.dir={tiny_checkpoint}",
        f"--config.data.path={corpus}",
        "--config.data.format=lines",
        "--config.eval.seq_len=64",
        "--config.eval.stride=48",
        "--config.eval.batch_size=8",
        "--config.mesh.model=2",
        "--config.output.progress=false",
        f"--config.output.dir={out}",
    ]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads((out / "results.json").read_text())
    assert results["num_processes"] == 2
    assert results["mesh"] == {"data": 4, "model": 2}
    assert results["num_tokens"] == reference.sums.num_tokens
    assert results["nll_sum"] == pytest.approx(reference.sums.nll_sum, rel=1e-6)
