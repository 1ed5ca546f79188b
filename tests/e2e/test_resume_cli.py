"""Real command-line runs killed halfway (SIGTERM, SIGINT, SIGKILL) and run again with the same
command end with the results of an uninterrupted run, bit for bit (on two processes:
tests/multiprocess/test_resume_processes.py)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from ppl_jax.config.defaults import held_out_paths
from ppl_jax.outputs import journal

import helpers

pytestmark = pytest.mark.slow  # each case is two command-line runs

# What may differ between two runs of the same command: clocks, and the command's own words.
TIMING_KEYS = {
    "tokens_per_second",
    "scoring_seconds",
    "host_seconds",
    "prepare_seconds",
    "compile_seconds",
    "wall_seconds",
    "resumed_batches",
    "timing",
}


def flags(out) -> list[str]:
    corpus = ",".join(held_out_paths().split(",")[:2])  # two held-out modules, ~40 batches
    return [
        f"--config.output.dir={out}",
        "--config.output.progress=false",
        "--config.output.journal_every=1",
        f"--config.data.path={corpus}",
    ]


def start(
    out, process_id: int = 0, num_processes: int = 1, port: int = 0, extra: tuple = ()
) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "ppl_jax", *flags(out), *extra],
        env=helpers.process_env(process_id, num_processes, port),
        cwd=helpers.REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def run(out, num_processes: int = 1, extra: tuple = ()) -> list[subprocess.CompletedProcess]:
    port = helpers.free_port()
    procs = [start(out, i, num_processes, port, extra) for i in range(num_processes)]
    return [finish(p) for p in procs]


def finish(proc: subprocess.Popen, timeout: float = 300) -> subprocess.CompletedProcess:
    stdout, stderr = proc.communicate(timeout=timeout)
    return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)


def wait_for_batches(out, at_least: int, procs, timeout: float = 120) -> None:
    """Waits until the journal holds `at_least` finished batches."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert all(p.poll() is None for p in procs), "the run ended before it was interrupted"
        try:
            with np.load(out / journal.NAME) as z:
                if z["batch_done"].sum() >= at_least:
                    return
        except (OSError, ValueError, KeyError):
            pass
        time.sleep(0.05)
    raise AssertionError("no journal appeared")


def results(out) -> dict:
    r = json.loads((out / "results.json").read_text())
    del r["config"]["output"]["dir"]  # the tests' runs write to different folders
    for key in ("started_utc", "finished_utc", "command"):
        del r["run"][key]
    del r["results_jsonl"], r["averages"]  # its path; no averages for one dataset
    for record in r.pop("datasets").values():  # the one dataset's record: the same numbers
        assert record["metrics"]["perplexity"] == r["perplexity"]
        assert record["sums"]["nll_sum"] == r["nll_sum"]
    return {k: v for k, v in r.items() if k not in TIMING_KEYS}


def whole_run(tmp_path_factory, num_processes: int) -> dict:
    """The results of an uninterrupted run on `num_processes` processes."""
    out = tmp_path_factory.mktemp(f"whole{num_processes}")
    done = run(out, num_processes)
    assert all(p.returncode == 0 for p in done), done[0].stderr[-2000:]
    assert not (out / journal.NAME).exists()  # removed once the results are written
    return results(out)


def killed_then_resumed(tmp_path, uninterrupted: dict, sig: int, num_processes: int) -> None:
    """A run killed halfway by `sig` (on two processes: only the last one gets it), then run
    again: its results are `uninterrupted`'s."""
    out = tmp_path / "out"
    port = helpers.free_port()
    procs = [start(out, i, num_processes, port) for i in range(num_processes)]
    wait_for_batches(out, 5, procs)
    procs[-1].send_signal(sig)
    ended = [finish(p, timeout=60) for p in procs]
    with np.load(out / journal.NAME) as z:
        done = z["batch_done"]
    assert 5 <= done.sum() < done.size
    if sig != signal.SIGKILL:
        # Every process stops at the same batch, with the signal's exit status; process 0 says
        # where and how to resume, in one line and without a traceback.
        assert [p.returncode for p in ended] == [128 + sig] * num_processes
        message = ended[0].stderr.strip().splitlines()
        assert "Traceback" not in ended[0].stderr
        assert message[-1].startswith(f"ppl-jax: stopped by {signal.Signals(sig).name} with ")
        assert message[-1].endswith("Run the same command again to resume.")
    assert not (out / "results.json").exists()

    if sig == signal.SIGTERM:
        # Another setting: the journal is refused, on every process at once, with the reason.
        t0 = time.monotonic()
        refused = run(out, num_processes, extra=("--config.eval.seq_len=128",))
        assert time.monotonic() - t0 < 60
        assert [p.returncode for p in refused] == [2] * num_processes
        assert "protocol.seq_len: 256 -> 128" in refused[0].stderr
        if num_processes == 2:
            assert "process 0 refused the journal" in refused[1].stderr

    again = run(out, num_processes)
    assert all(p.returncode == 0 for p in again), again[0].stderr[-2000:]
    assert results(out) == uninterrupted
    assert not (out / journal.NAME).exists()


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> dict:
    return whole_run(tmp_path_factory, 1)


SIGNALS = [signal.SIGTERM, signal.SIGINT, signal.SIGKILL]


@pytest.mark.parametrize("sig", SIGNALS, ids=[s.name for s in SIGNALS])
def test_killed_halfway_then_the_same_command_resumes(tmp_path, uninterrupted, sig):
    killed_then_resumed(tmp_path, uninterrupted, sig, 1)
