"""A lost process ends a multi-process run quickly, with one line; `launch/local.sh` stops the rest.

Two real local processes join with `ppl_jax.runtime.distributed.initialize_from_env` (JAX's coordination
service and Gloo CPU collectives) and gather in a loop; one is killed with SIGKILL.

On a cluster that JAX detects itself (SLURM's variables, faked on this machine), a process that
never starts is named by the roll call (tests/e2e/test_launchers.py starts a full one).
"""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import sys
import textwrap
import time

import pytest

from ppl_jax.runtime import rollcall

import helpers

WORKER = textwrap.dedent(
    """
    import os, time
    from absl import app

    def main(argv):
        from ppl_jax.runtime import distributed
        assert distributed.initialize_from_env()
        import jax
        import jax.numpy as jnp
        from jax.experimental import multihost_utils
        step = 0
        while True:  # a collective every 50 ms, as a scoring loop would
            multihost_utils.process_allgather(jnp.full(4, step))
            if step == 3:
                print("ready", flush=True)
            if step == 20 and os.environ.get("RAISE") == str(jax.process_index()):
                raise RuntimeError("a deliberate bug")
            step += 1
            time.sleep(0.05)

    app.run(main)
    """
)
LIMIT_S = 30  # every surviving process ends within this after the loss


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start_pair(tmp_path, **extra: str) -> list[subprocess.Popen]:
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    port = _free_port()
    procs = []
    for i in range(2):
        env = dict(os.environ)
        env.update(
            PPL_JAX_COORDINATOR=f"127.0.0.1:{port}",
            PPL_JAX_NUM_PROCESSES="2",
            PPL_JAX_PROCESS_ID=str(i),
            XLA_FLAGS=helpers.xla_flags(2),
            JAX_PLATFORMS="cpu",
            PYTHONPATH=helpers.REPO,
            **extra,
        )
        procs.append(
            subprocess.Popen(
                [sys.executable, str(script)],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    for p in procs:  # Gloo prints its own lines on stdout first
        for line in p.stdout:
            if line.strip() == "ready":
                break
        else:
            pytest.fail(f"a worker ended before its first collectives: {p.communicate()[1]}")
    return procs


@pytest.mark.parametrize(
    "victim, lost",
    [
        (1, "process 1 of 2 stopped answering (no heartbeat for 10 s)"),
        (0, "process 0 of 2 stopped answering (it hosts the coordination service"),
    ],
)
def test_a_lost_process_ends_the_other_with_one_line(tmp_path, victim, lost):
    procs = _start_pair(tmp_path)
    survivor = procs[1 - victim]
    try:
        procs[victim].send_signal(signal.SIGKILL)
        killed = time.monotonic()
        try:
            survivor.wait(timeout=LIMIT_S)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the surviving process still runs {LIMIT_S} s after the loss")
        took = time.monotonic() - killed
        _, err = survivor.communicate(timeout=10)  # the guard's output, to its end
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.communicate()
    print(f"survivor ended {took:.1f} s after the loss, status {survivor.returncode}")
    assert survivor.returncode != 0
    lines = [
        line
        for line in err.splitlines()
        if line.strip() and "distributed.py" not in line  # jax's INFO lines at start
    ]
    assert len(lines) == 1, err[-3000:]  # no traceback, no C++ stack trace
    assert lines[0].startswith(f"ppl-jax: error: {lost}"), lines[0]
    assert lines[0].endswith("; the run is stopped. Run the same command again to resume.")
    assert took < LIMIT_S


def test_a_failing_process_ends_at_once_and_the_other_soon(tmp_path):
    # An exception in one process: it prints its traceback and exits at once, without JAX's
    # shutdown barrier (which would wait for the other until the shutdown timeout, 60 s); the
    # other, blocked in a collective with it, is told within the heartbeat timeout.
    procs = _start_pair(tmp_path, RAISE="1")
    try:
        start = time.monotonic()
        procs[1].wait(timeout=LIMIT_S)
        failed = time.monotonic() - start
        procs[0].wait(timeout=LIMIT_S)
        other = time.monotonic() - start
        errs = [p.communicate(timeout=10)[1] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.communicate()
    print(f"failing process ended after {failed:.1f} s, the other after {other:.1f} s")
    assert procs[1].returncode == 1
    assert "RuntimeError: a deliberate bug" in errs[1]
    assert failed < 5
    assert procs[0].returncode != 0
    assert "ppl-jax: error: process 1 of 2 stopped answering (no heartbeat for 10 s); " in errs[0]
    assert "Traceback" not in errs[0]


# ------------------------------------------------------------------- a cluster that JAX detects


def _slurm_env(job_id: int, **extra: str) -> dict[str, str]:
    """The environment SLURM would set for task 0 of a 2-task job step on this machine; JAX's
    SLURM detection puts the coordinator at localhost:(job_id % 4096 + 61440)."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("SLURM_", "PPL_JAX_", "JAX_COORDINATOR"))
    }
    env.update(
        PPL_JAX_DISTRIBUTED="1",
        SLURM_JOB_ID=str(job_id),
        SLURM_STEP_NODELIST="localhost",
        SLURM_STEP_NUM_NODES="1",
        SLURM_NTASKS="2",
        SLURM_PROCID="0",
        SLURM_LOCALID="0",
        XLA_FLAGS=helpers.xla_flags(2),
        JAX_PLATFORMS="cpu",
        PYTHONPATH=helpers.REPO,
        **extra,
    )
    return env


def _free_slurm_job_id() -> tuple[int, int]:
    """A SLURM job id and its coordinator port, free with the roll call's port beside it (the one
    below for 65535): job 4095 (port 65535) when it can, else another."""
    for job_id in (4095, *random.sample(range(4095), 50)):
        port = job_id % 4096 + 61440
        roll = rollcall.roll_call_port(port)
        try:
            with socket.socket() as a, socket.socket() as b:
                a.bind(("", port))
                b.bind(("", roll))
        except OSError:
            continue
        return job_id, port
    pytest.skip("no free port pair in SLURM's coordinator range 61440..65535")


def test_a_slurm_job_names_the_task_that_never_started(tmp_path):
    job_id, port = _free_slurm_job_id()
    env = _slurm_env(job_id, PPL_JAX_INIT_TIMEOUT="2")
    r = subprocess.run(
        [sys.executable, "-m", "ppl_jax.cli.main", f"--config.output.dir={tmp_path}"],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert r.returncode == 2, r.stderr[-3000:]
    assert r.stderr.strip().splitlines() == [
        f"ppl-jax: error: process 1 of 2 did not start within 2 s (process 0 waited for them at "
        f"localhost:{port}, the coordinator from SLURM's variables); check that every process "
        f"started and none failed early, or raise PPL_JAX_INIT_TIMEOUT."
    ]


# ------------------------------------------------------------------------------ launch/local.sh

FAKE_PYTHON = textwrap.dedent(
    """\
    #!/usr/bin/env bash
    # Stands in for the interpreter: `-c CODE` is real Python (local.sh's port search); `-m
    # ppl_jax ...` does what FAKE_<process id> says: fail:N (exit N after 0.5 s), kill (SIGKILL
    # itself after 0.5 s), sleep, slowstop:N (as sleep, but takes N s to stop: a first batch
    # still compiling when the signal comes, then its journal), ok.
    if [[ "$1" == "-c" ]]; then exec "$REAL_PYTHON" "$@"; fi
    what_var="FAKE_${PPL_JAX_PROCESS_ID}"
    what=${!what_var:-ok}
    # A sleeper handles SIGTERM before it says it started (as ppl_jax does before its work).
    if [[ "$what" == sleep ]]; then
      trap 'kill $child 2>/dev/null; echo "term $PPL_JAX_PROCESS_ID" >> "$FAKE_LOG"; exit 143' TERM
    fi
    if [[ "$what" == slowstop:* ]]; then
      trap 'kill $child 2>/dev/null; sleep "${what#slowstop:}"
            echo "journal $PPL_JAX_PROCESS_ID" >> "$FAKE_LOG"; exit 143' TERM
    fi
    echo "start $PPL_JAX_PROCESS_ID" >> "$FAKE_LOG"
    case "$what" in
      fail:*) sleep 0.5; exit "${what#fail:}" ;;
      kill) sleep 0.5; kill -KILL $$ ;;
      sleep|slowstop:*)
        sleep 1000 &
        child=$!
        wait ;;
      ok) exit 0 ;;
    esac
    """
)


@pytest.fixture
def launched():
    """local.sh runs in a process group of its own, killed after the test whatever happened."""
    procs: list[subprocess.Popen] = []
    yield procs
    for proc in procs:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()


LOCAL_SH = os.path.join(helpers.REPO, "launch", "local.sh")
SIGINT_DEFAULT_EXEC = (
    "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); "
    "os.execvp(sys.argv[1], sys.argv[1:])"
)


def _local_sh(tmp_path, launched, n: int, **fake: str) -> tuple[subprocess.Popen, str]:
    python = tmp_path / "python"
    python.write_text(FAKE_PYTHON)
    python.chmod(0o755)
    log = str(tmp_path / "log")
    env = dict(os.environ, PYTHON=str(python), REAL_PYTHON=sys.executable, FAKE_LOG=log)
    env.update({f"FAKE_{k[1:]}": v for k, v in fake.items()})  # p0="sleep" -> FAKE_0
    # From SIGINT's default disposition: a shell cannot trap a signal ignored when it started, and
    # pytest run as a background job (`pytest ... &`) has SIGINT ignored, as its children would.
    cmd = [sys.executable, "-c", SIGINT_DEFAULT_EXEC, "bash", LOCAL_SH, str(n)]
    launched.append(
        subprocess.Popen(cmd, env=env, start_new_session=True, stderr=subprocess.PIPE, text=True)
    )
    return launched[-1], log


def _log(log: str) -> list[str]:
    with open(log) as f:
        return sorted(f.read().split("\n")[:-1])


def test_local_sh_stops_the_others_when_one_fails(tmp_path, launched):
    proc, log = _local_sh(tmp_path, launched, 3, p0="sleep", p1="fail:3", p2="sleep")
    start = time.monotonic()
    assert proc.wait(timeout=20) == 3  # the failed process's status
    assert time.monotonic() - start < 5  # not the 1000 s the others would sleep
    assert _log(log) == ["start 0", "start 1", "start 2", "term 0", "term 2"]


def test_local_sh_names_a_killed_process(tmp_path, launched):
    proc, log = _local_sh(tmp_path, launched, 2, p0="sleep", p1="kill")
    _, err = proc.communicate(timeout=20)
    assert proc.returncode == 128 + signal.SIGKILL
    assert err == (
        "ppl-jax: error: process 1 of 2 was killed by SIGKILL; the run is stopped. Run the same "
        "command again to resume.\n"
    )
    assert _log(log) == ["start 0", "start 1", "term 0"]


def test_local_sh_succeeds_when_all_succeed(tmp_path, launched):
    proc, log = _local_sh(tmp_path, launched, 2)
    assert proc.wait(timeout=20) == 0
    assert _log(log) == ["start 0", "start 1"]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_local_sh_passes_signals_on(tmp_path, launched, sig):
    proc, log = _local_sh(tmp_path, launched, 2, p0="sleep", p1="sleep")
    deadline = time.monotonic() + 10
    while not (os.path.exists(log) and len(_log(log)) == 2) and time.monotonic() < deadline:
        time.sleep(0.05)
    proc.send_signal(sig)
    assert proc.wait(timeout=10) == 128 + sig
    assert _log(log) == ["start 0", "start 1", "term 0", "term 1"]


def test_local_sh_waits_for_the_journal_of_a_process_that_takes_long_to_stop(tmp_path, launched):
    """A SIGTERM passed on while a process compiles its first batch: it stops after the batch and
    saves its journal, 7 s later; local.sh waits for it (GRACE_S, default 30 s), where it once
    sent SIGKILL after 5 s and the journal line was lost."""
    proc, log = _local_sh(tmp_path, launched, 2, p0="slowstop:7", p1="sleep")
    deadline = time.monotonic() + 10
    while not (os.path.exists(log) and len(_log(log)) == 2) and time.monotonic() < deadline:
        time.sleep(0.05)
    start = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=40) == 128 + signal.SIGTERM
    assert 6.5 < time.monotonic() - start < 20
    assert _log(log) == ["journal 0", "start 0", "start 1", "term 1"]
