"""Bad `PPL_JAX_*` values and a process that never starts are one sentence, soon (issue 19)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time

import pytest

from ppl_jax.errors import ConfigError
from ppl_jax.runtime import distributed, rollcall


def free_port() -> int:
    """A port whose next one is free too (the roll call listens on port + 1)."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port < 65534:
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", port + 1))
                    return port
                except OSError:
                    continue


@pytest.mark.parametrize(
    ("env", "why"),
    [
        ({"PPL_JAX_NUM_PROCESSES": "two"}, "PPL_JAX_NUM_PROCESSES='two' is not a number"),
        ({"PPL_JAX_NUM_PROCESSES": "0"}, "PPL_JAX_NUM_PROCESSES='0' is not a number"),
        ({"PPL_JAX_DISTRIBUTED": "yes"}, "PPL_JAX_DISTRIBUTED='yes' is not 0 or 1"),
        ({"PPL_JAX_ALL_LOCAL_DEVICES": "true"}, "PPL_JAX_ALL_LOCAL_DEVICES='true' is not 0 or 1"),
        ({"PPL_JAX_NUM_PROCESSES": "2"}, "needs PPL_JAX_PROCESS_ID"),
        (
            {"PPL_JAX_NUM_PROCESSES": "2", "PPL_JAX_PROCESS_ID": "2",
             "PPL_JAX_COORDINATOR": "localhost:1234"},
            "PPL_JAX_PROCESS_ID='2' is not this process's id .0..1.",
        ),
        (
            {"PPL_JAX_NUM_PROCESSES": "2", "PPL_JAX_PROCESS_ID": "1",
             "PPL_JAX_COORDINATOR": "localhost"},
            "PPL_JAX_COORDINATOR='localhost' is not host:port",
        ),
        (
            {"PPL_JAX_DISTRIBUTED": "1", "PPL_JAX_INIT_TIMEOUT": "-5"},
            "PPL_JAX_INIT_TIMEOUT='-5' is not a whole number of seconds",
        ),
    ],
)  # fmt: skip
def test_bad_environment_values_are_one_sentence(monkeypatch, env, why):
    for name in list(os.environ):
        if name.startswith("PPL_JAX_"):
            monkeypatch.delenv(name)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ConfigError, match=why):
        distributed.initialize_from_env()


def test_the_roll_call_names_the_process_that_never_started():
    port = free_port()
    coordinator = f"127.0.0.1:{port}"
    reported = []
    one = threading.Thread(
        target=lambda: reported.append(_catch(rollcall.roll_call, coordinator, 3, 1, 2.0))
    )
    one.start()
    t0 = time.monotonic()
    with pytest.raises(ConfigError, match=r"process 2 of 3 did not start within 1.5 s"):
        rollcall.roll_call(coordinator, 3, 0, 1.5)
    assert time.monotonic() - t0 < 5
    one.join()
    assert "says not every process of 3 started" in str(reported[0])


def test_the_roll_call_lets_a_full_run_go_on():
    port = free_port()
    coordinator = f"127.0.0.1:{port}"
    results = []
    others = [
        threading.Thread(
            target=lambda i=i: results.append(_catch(rollcall.roll_call, coordinator, 3, i, 10))
        )
        for i in (1, 2)
    ]
    for t in others:
        t.start()
    rollcall.roll_call(coordinator, 3, 0, 10)
    for t in others:
        t.join()
    assert results == [None, None]


def test_a_process_without_its_coordinator_names_process_0():
    coordinator = f"127.0.0.1:{free_port()}"
    with pytest.raises(
        ConfigError, match=r"process 1 of 2: process 0 .* did not answer within 1 s"
    ):
        rollcall.roll_call(coordinator, 2, 1, 1.0)


def test_the_command_line_says_who_is_missing_in_one_sentence(tmp_path):
    env = {
        **os.environ,
        "PPL_JAX_NUM_PROCESSES": "2",
        "PPL_JAX_PROCESS_ID": "0",
        "PPL_JAX_COORDINATOR": f"127.0.0.1:{free_port()}",
        "PPL_JAX_INIT_TIMEOUT": "2",
    }
    r = subprocess.run(
        [sys.executable, "-m", "ppl_jax.cli.main", f"--config.output.dir={tmp_path}"],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert r.returncode == 2, r.stderr[-2000:]
    assert r.stderr.strip().splitlines() == [
        f"ppl-jax: error: process 1 of 2 did not start within 2 s (process 0 waited for them at "
        f"{env['PPL_JAX_COORDINATOR']}); start every process with PPL_JAX_NUM_PROCESSES=2, its "
        f"own PPL_JAX_PROCESS_ID (0..1) and PPL_JAX_COORDINATOR={env['PPL_JAX_COORDINATOR']}, "
        f"or raise PPL_JAX_INIT_TIMEOUT."
    ]


def test_the_roll_call_port_is_beside_the_coordinator_and_always_valid():
    assert rollcall.roll_call_port(12355) == 12356
    assert rollcall.roll_call_port(65534) == 65535
    assert rollcall.roll_call_port(65535) == 65534  # SLURM's automatic port for job 4095
    assert rollcall.parse_address("node001:65535") == ("node001", 65535)
    assert rollcall.parse_address("[::1]:1") == ("::1", 1)
    for bad in ("node001:65536", "node001:0", "node001:", ":80", "node001"):
        with pytest.raises(ConfigError, match=r"is not host:port .* a port from 1 to 65535"):
            rollcall.parse_address(bad)


def _slurm(monkeypatch, job_id: int, task: int) -> None:
    """This process's environment as SLURM sets it for task `task` of a 2-task step on node001."""
    for name in list(os.environ):
        if name.startswith(("SLURM_", "OMPI_", "PPL_JAX_", "JAX_COORDINATOR", "KUBERNETES_")):
            monkeypatch.delenv(name)
    for name, value in dict(
        SLURM_JOB_ID=str(job_id), SLURM_STEP_NODELIST="node[001-002]", SLURM_STEP_NUM_NODES="2",
        SLURM_NTASKS="2", SLURM_PROCID=str(task), SLURM_LOCALID="0",
    ).items():  # fmt: skip
        monkeypatch.setenv(name, value)


def test_the_cluster_is_found_as_jax_finds_it(monkeypatch):
    _slurm(monkeypatch, 4095, 1)
    assert rollcall.detect_cluster(10) == ("node001:65535", 2, 1, "SLURM's variables")
    monkeypatch.setenv("JAX_COORDINATOR_PORT", "1234")
    assert rollcall.detect_cluster(10) == ("node001:1234", 2, 1, "SLURM's variables")
    monkeypatch.setenv("JAX_COORDINATOR_ADDRESS", "10.0.0.1:5678")
    assert rollcall.detect_cluster(10) == ("10.0.0.1:5678", 2, 1, "JAX_COORDINATOR_ADDRESS")


def test_no_cluster_found_or_a_failing_detection_means_no_roll_call(monkeypatch):
    from jax._src import clusters

    _slurm(monkeypatch, 4095, 1)
    monkeypatch.delenv("SLURM_PROCID")
    assert rollcall.detect_cluster(10) is None  # not a SLURM step

    def broken(*args, **kwargs):
        raise RuntimeError("the metadata server is down")

    _slurm(monkeypatch, 4095, 1)
    monkeypatch.setattr(clusters.ClusterEnv, "auto_detect_unset_distributed_params", broken)
    assert rollcall.detect_cluster(10) is None


class _Started(Exception):
    pass


@pytest.mark.parametrize("slurm", [True, False])
def test_a_detected_cluster_has_its_roll_call_before_jax_starts(monkeypatch, slurm):
    import jax

    if slurm:
        _slurm(monkeypatch, 4095, 1)
    else:
        for name in list(os.environ):
            if name.startswith(("SLURM_", "OMPI_", "PPL_JAX_", "JAX_COORDINATOR", "KUBERNETES_")):
                monkeypatch.delenv(name)
    monkeypatch.setenv("PPL_JAX_DISTRIBUTED", "1")
    monkeypatch.setenv("PPL_JAX_INIT_TIMEOUT", "7")
    calls = []
    monkeypatch.setattr(rollcall, "roll_call", lambda *a, **k: calls.append(("roll call", a, k)))

    def initialize(**kwargs):
        calls.append(("initialize", kwargs))
        raise _Started

    monkeypatch.setattr(jax.distributed, "initialize", initialize)
    with pytest.raises(_Started):
        distributed.initialize_from_env()
    timeouts = dict(
        heartbeat_timeout_seconds=10, shutdown_timeout_seconds=60, initialization_timeout=7
    )
    if not slurm:  # nothing found: JAX's start as before
        assert calls == [("initialize", timeouts)]
        return
    where = dict(coordinator_address="node001:65535", num_processes=2, process_id=1)
    assert calls == [
        ("roll call", ("node001:65535", 2, 1, 7), {"source": "SLURM's variables"}),
        ("initialize", {**where, **timeouts}),
    ]


def test_a_detected_process_without_its_coordinator_names_it_and_the_cluster():
    coordinator = f"127.0.0.1:{free_port()}"
    with pytest.raises(ConfigError) as e:
        rollcall.roll_call(coordinator, 2, 1, 0.5, source="SLURM's variables")
    assert str(e.value) == (
        f"process 1 of 2: process 0 (at {coordinator}, the coordinator from SLURM's variables) "
        f"did not answer within 0.5 s; check that it started and did not fail early, or raise "
        f"PPL_JAX_INIT_TIMEOUT."
    )


def test_another_program_on_the_roll_call_port_is_no_verdict():
    # The roll call's port (coordinator + 1) is another job's (SLURM: job ids one apart); process
    # 0, unable to listen there, went on to JAX's start, whose port is open.
    port = free_port()
    jax_service = socket.create_server(("127.0.0.1", port))
    other = socket.create_server(("127.0.0.1", port + 1))

    def answer_nonsense():
        conn, _ = other.accept()
        with conn:
            conn.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n")

    with jax_service, other:
        threading.Thread(target=answer_nonsense, daemon=True).start()
        t0 = time.monotonic()
        rollcall.roll_call(f"127.0.0.1:{port}", 2, 1, 5, source="SLURM's variables")
        assert time.monotonic() - t0 < 1


def _catch(fn, *args):
    try:
        fn(*args)
    except ConfigError as e:
        return e
    return None
