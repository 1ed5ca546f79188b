"""Hub revisions swept as steps on two processes, each with its own hub cache (as two hosts have):
the same numbers as one process; a revision missing from one host's cache is one sentence naming
the commit and the cache, not a traceback or a hang."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import helpers

sys.path.insert(0, os.path.join(helpers.REPO, "tests", "unit", "checkpoints"))
from test_hub import HF_LLAMA, add_revision  # noqa: E402

FILES = {n: os.path.join(HF_LLAMA, n) for n in os.listdir(HF_LLAMA)}
ARGS = [
    "--config.data.path=val.txt",
    "--config.data.tokenizer=byte",
    "--config.data.allow_tokenizer_mismatch=true",
    "--config.eval.seq_len=32",
    "--config.checkpoint.dir=hf://org/tiny",
    "--config.checkpoint.step=step1000,step2000",
    "--config.output.progress=false",
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def sweep(tmp_path, out: str, caches: list) -> list[subprocess.CompletedProcess]:
    """The sweep on `len(caches)` processes, process i reading the hub cache `caches[i]`."""
    port, n = free_port(), len(caches)
    procs = []
    for i, cache in enumerate(caches):
        env = helpers.process_env(i, n, port)
        env.update(HF_HUB_CACHE=str(cache), HF_HUB_OFFLINE="1", PPL_JAX_HEARTBEAT_TIMEOUT="5")
        procs.append(
            subprocess.Popen(
                [sys.executable, "-m", "ppl_jax.cli.main", *ARGS, f"--config.output.dir={out}"],
                cwd=tmp_path,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )  # fmt: skip
        )
    done = []
    for p in procs:
        stdout, stderr = p.communicate(timeout=300)
        done.append(subprocess.CompletedProcess(p.args, p.returncode, stdout, stderr))
    return done


def nll_sums(out) -> dict[int, float]:
    records = [json.loads(x) for x in open(out / "results.jsonl")]
    return {r["step"]: r["sums"]["nll_sum"] for r in records if r["kind"] == "dataset"}


def test_two_processes_sweep_hub_revisions_from_their_own_caches(tmp_path):
    (tmp_path / "val.txt").write_text(helpers.stdlib_text(1500))
    caches = [tmp_path / "host0", tmp_path / "host1"]
    for cache in caches:
        for branch in ("step1000", "step2000"):
            add_revision(cache, "org/tiny", branch, FILES)
    one = sweep(tmp_path, "one", caches[:1])
    assert one[0].returncode == 0, one[0].stderr[-3000:]
    two = sweep(tmp_path, "two", caches)
    assert [p.returncode for p in two] == [0, 0], two[1].stderr[-3000:]
    assert nll_sums(tmp_path / "two") == nll_sums(tmp_path / "one")
    assert sorted(nll_sums(tmp_path / "two")) == [1000, 2000]


def test_two_processes_a_revision_missing_from_one_host_is_one_sentence(tmp_path):
    (tmp_path / "val.txt").write_text(helpers.stdlib_text(1500))
    caches = [tmp_path / "host0", tmp_path / "host1"]
    add_revision(caches[0], "org/tiny", "step1000", FILES)
    step2000 = add_revision(caches[0], "org/tiny", "step2000", FILES)
    add_revision(caches[1], "org/tiny", "step1000", FILES)  # host 1 lacks step2000
    two = sweep(tmp_path, "two", caches)
    for p in two:
        assert p.returncode != 0
        assert "Traceback" not in p.stderr, p.stderr[-3000:]
    errors = [line for line in two[1].stderr.splitlines() if line.startswith("ppl-jax: error:")]
    assert len(errors) == 1, two[1].stderr[-3000:]
    assert f"process 0 scores commit {step2000} of 'org/tiny'" in errors[0], errors[0]
    assert f"({caches[1]}) does not hold" in errors[0], errors[0]
    lost = [line for line in two[0].stderr.splitlines() if line.startswith("ppl-jax: error:")]
    assert len(lost) == 1 and "process 1 of 2" in lost[0], two[0].stderr[-3000:]
    assert not (tmp_path / "two" / "results.json").exists()
