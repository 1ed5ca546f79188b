"""Signals are answered from the first instruction: a run holds one set of handlers from before
its setup to its end, so that a SIGTERM between two pairs of a sweep (right after a step's line
is printed) stops it with one sentence, never by the default action; and the command line
answers a signal during its imports with one sentence and 128 + the signal. local.sh's grace
period: tests/multiprocess/test_distributed.py."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time

import pytest
from test_one_job import config

from ppl_jax.config.settings import from_config
from ppl_jax.errors import Interrupted
from ppl_jax.evaluation import run as run_lib
from ppl_jax.outputs.folder import OutputDir

import helpers


@pytest.fixture
def own_handler():
    """A SIGTERM handler of the test's own, where the default action would end pytest: a signal
    that no handler of the run took lands here."""
    landed: list[int] = []

    def handler(sig, frame):
        landed.append(sig)

    previous = signal.signal(signal.SIGTERM, handler)
    yield landed, handler
    signal.signal(signal.SIGTERM, previous)


def test_a_sigterm_right_after_a_steps_line_stops_the_sweep_in_one_sentence(
    tiny_checkpoint, tmp_path, own_handler
):
    landed, handler = own_handler
    corpus = helpers.corpus_files(tmp_path, [helpers.stdlib_text(400)])
    spec = from_config(config(tiny_checkpoint, corpus, tmp_path / "out", checkpoint__step="all"))
    lines: list[str] = []

    def printer(line: str) -> None:  # the console's line of step 3: SIGTERM at once
        lines.append(line)
        if len(lines) == 1:
            os.kill(os.getpid(), signal.SIGTERM)

    with OutputDir.open(spec.output_dir) as out, pytest.raises(Interrupted) as e:
        run_lib.run(spec, out, printer=printer)
    assert landed == []  # the run's handler took it (once, the default action)
    assert e.value.exit_code == 143
    assert str(e.value) == (
        "stopped by SIGTERM before step 5; every finished (step, dataset) is in results.jsonl; "
        "run the same command again to resume."
    )
    with open(os.path.join(spec.output_dir, "results.jsonl")) as f:
        assert [json.loads(x)["step"] for x in f] == [3]
    assert signal.getsignal(signal.SIGTERM) is handler  # the test's own, restored


def _caught_signals(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return int(next(x for x in f if x.startswith("SigCgt:")).split()[1], 16)


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads /proc (Linux)")
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_the_command_line_answers_a_signal_during_its_imports(tmp_path, sig):
    """The handlers are the command line's first instruction: a signal while jax is still being
    imported (seconds) is one sentence and 128 + the signal, not a silent end or a traceback."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "ppl_jax", f"--config.output.dir={tmp_path / 'out'}"],
        stderr=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "JAX_PLATFORMS": "cpu"},
    )
    deadline = time.monotonic() + 30
    # Python catches SIGINT from its start; SIGTERM caught means both are the command line's.
    while (
        not _caught_signals(proc.pid) & (1 << (signal.SIGTERM - 1)) and time.monotonic() < deadline
    ):
        time.sleep(0.005)
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + sig, err
    assert err.splitlines() == [
        f"ppl-jax: stopped by {signal.Signals(sig).name}; nothing is left half-written, and a run "
        f"goes on from what it finished when the same command runs again."
    ]
    assert out == "" and not (tmp_path / "out" / "results.json").exists()


# A batch the main thread waits for in C, as it waits in XLA: Python runs no signal handler until
# the call returns (OpenSSL's PBKDF2 releases the GIL and never looks at signals).
_BLOCKED = """
import hashlib, sys, time
from ppl_jax.runtime import preemption
preemption.answer_at_once()
with preemption.StopRequest() as stop:
    if sys.argv[1] == "loop":
        for i in range(2):  # two batches fetched, a third in flight
            stop.should_stop(i)
            time.sleep(0.3)
            stop.on_batch(i, [], None)
        stop.should_stop(2)
    print("ready", flush=True)
    t = time.monotonic()
    while time.monotonic() - t < 20:
        hashlib.pbkdf2_hmac("sha256", b"batch", b"salt", 2_000_000)
    print("finished", flush=True)
"""


@pytest.mark.parametrize(
    "where, sig, answer",
    [
        ("loop", signal.SIGINT, "ppl-jax: SIGINT: stopping after this batch (about 1 s); press "
         "Ctrl-C again to stop now."),
        ("setup", signal.SIGTERM, "ppl-jax: SIGTERM: stopping at the next safe point; send "
         "SIGTERM again to stop now."),
    ],
)  # fmt: skip
def test_a_signal_is_answered_at_once_while_a_batch_runs(where, sig, answer):
    """Ctrl-C or SIGTERM while the main thread waits for a batch: silence until the batch ended
    (145 s under load; issue 39, item 11). Now the answer comes at once, and a second signal
    ends the process at once with 128 + the signal."""
    proc = subprocess.Popen(
        [sys.executable, "-c", _BLOCKED, where],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "JAX_PLATFORMS": "cpu"},
    )
    assert proc.stdout.readline() == "ready\n"
    time.sleep(0.2)  # inside the first PBKDF2 call
    proc.send_signal(sig)
    # At once: before the batch (PBKDF2 calls for 20 s) ends; the old handler said nothing.
    ready, _, _ = select.select([proc.stderr], [], [], 5)
    assert ready and proc.stderr.readline() == "\n"
    assert proc.stderr.readline() == answer + "\n" and proc.poll() is None
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=10)
    assert proc.returncode == 128 + sig and "finished" not in out
    assert err.strip() == (
        f"ppl-jax: {signal.Signals(sig).name} again: stopped at once; the journal keeps the "
        f"batches of its last flush."
    )
