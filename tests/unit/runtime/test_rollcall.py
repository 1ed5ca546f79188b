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


def _catch(fn, *args):
    try:
        fn(*args)
    except ConfigError as e:
        return e
    return None
