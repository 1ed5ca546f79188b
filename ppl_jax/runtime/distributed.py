"""Starting JAX's multi-process runtime (`jax.distributed`) when a run spans processes.

`launch/local.sh` sets `PPL_JAX_COORDINATOR` (host:port), `PPL_JAX_NUM_PROCESSES` and
`PPL_JAX_PROCESS_ID` for each local process. On a TPU pod or a SLURM/Open MPI GPU cluster, set
`PPL_JAX_DISTRIBUTED=1` instead and JAX discovers the cluster itself (`launch/tpu_pod.sh`,
`launch/slurm.sh`). Either way a roll call first names any process that never starts
(`ppl_jax.runtime.rollcall`). `PPL_JAX_ALL_LOCAL_DEVICES=1` (set by `launch/slurm.sh`) lets each
process use every GPU it can see, where JAX's SLURM detection would give it only GPU
`SLURM_LOCALID`.

A lost process ends the run quickly, with one line. Every process sends heartbeats to JAX's
coordination service (hosted by process 0); `PPL_JAX_HEARTBEAT_TIMEOUT` seconds (default 10)
without one, and the service declares that process dead and tells every other process, whose JAX
client then aborts; a process that loses the coordinator itself hears of it at once. The abort is
C++ (`LOG(QFATAL)` in XLA's `DistributedRuntimeClient`; the Python callback it takes cannot be
used, because jaxlib cannot pass it the status), so its report is rewritten outside: a small
guard process reads this process's stderr, passes everything through, and replaces the coordination
service's fatal report (and its C++ stack trace) with

    ppl-jax: error: process 1 of 2 stopped answering (no heartbeat for 10 s); the run is stopped.
    Run the same command again to resume.

A collective that fails first in Python (Gloo: "Connection closed by peer") waits for that verdict
instead of printing a traceback. The process exits non-zero (SIGABRT from the abort, or 1).
"""

from __future__ import annotations

import os
import re
import select
import subprocess
import sys
import time

from absl import app as absl_app

from ppl_jax.errors import ConfigError
from ppl_jax.runtime import pathways, rollcall

HEARTBEAT_TIMEOUT_S = 10  # a process silent this long is dead (JAX's default is 100)
SHUTDOWN_TIMEOUT_S = 60  # how long a finished process waits at exit for the others
INITIALIZATION_TIMEOUT_S = 120  # how long processes wait for each other at start

RESUME = "the run is stopped. Run the same command again to resume."


def _env_seconds(name: str, default: int) -> int:
    value = os.environ.get(name, "").strip()
    if not value:
        return default
    if not value.isdigit() or int(value) < 1:
        raise ConfigError(f"{name}={value!r} is not a whole number of seconds (at least 1).")
    return int(value)


def _env_int(name: str, default: int, lo: int, hi: int | None, what: str) -> int:
    value = os.environ.get(name, "").strip()
    if not value:
        return default
    if not value.lstrip("-").isdigit() or int(value) < lo or (hi is not None and int(value) > hi):
        bound = f"{lo}..{hi}" if hi is not None else f"at least {lo}"
        raise ConfigError(f"{name}={value!r} is not {what} ({bound}); unset it or fix it.")
    return int(value)


def _env_flag(name: str) -> bool:
    value = os.environ.get(name, "").strip()
    if value not in ("", "0", "1"):
        raise ConfigError(f"{name}={value!r} is not 0 or 1; unset it or set 1 to turn it on.")
    return value == "1"


def initialize_from_env() -> bool:
    """Calls `jax.distributed.initialize` if the environment asks for several processes.

    Must run before any other JAX call that touches devices. Returns whether it initialized.
    Heartbeat, shutdown and start timeouts (seconds) come from `PPL_JAX_HEARTBEAT_TIMEOUT`
    (default 10), `PPL_JAX_SHUTDOWN_TIMEOUT` (60) and `PPL_JAX_INIT_TIMEOUT` (120). In a
    multi-process run, a lost process makes every other one exit non-zero with one line on
    stderr (see the module docstring).

    A roll call names any process that does not start within `PPL_JAX_INIT_TIMEOUT` seconds
    before JAX's own start would abort (`ppl_jax.runtime.rollcall`): with `PPL_JAX_COORDINATOR`,
    and with `PPL_JAX_DISTRIBUTED=1` where JAX's cluster detection finds the processes (SLURM,
    Open MPI, Cloud TPU VMs, Kubernetes; elsewhere JAX's start reports as before).

    Under Pathways (`JAX_PLATFORMS` names `proxy`) this process is the one controller: it
    registers the proxy backend and joins nothing (`ppl_jax.runtime.pathways.start`), whatever
    `PPL_JAX_DISTRIBUTED` or the cluster's variables say, and returns False.

    Raises:
      ConfigError: a `PPL_JAX_*` value out of range (a process count or id that is not a whole
        number, a flag other than 0 or 1, a coordinator that is not host:port, a timeout that is
        not a positive whole number of seconds), or a process that did not start; under
        Pathways, several processes asked for, or `pathwaysutils` missing.
    """
    num = _env_int("PPL_JAX_NUM_PROCESSES", 1, 1, None, "a number of processes")
    distributed = _env_flag("PPL_JAX_DISTRIBUTED")
    all_local = _env_flag("PPL_JAX_ALL_LOCAL_DEVICES")
    if pathways.in_use():
        pathways.start(num)
        return False
    if num <= 1 and not distributed:
        return False
    if num > 1:
        if "PPL_JAX_PROCESS_ID" not in os.environ or "PPL_JAX_COORDINATOR" not in os.environ:
            raise ConfigError(
                f"PPL_JAX_NUM_PROCESSES={num} needs PPL_JAX_PROCESS_ID (0..{num - 1}) and "
                f"PPL_JAX_COORDINATOR (process 0's host:port) too; launch/local.sh sets all three."
            )
        process_id = _env_int("PPL_JAX_PROCESS_ID", 0, 0, num - 1, "this process's id")
        coordinator = os.environ["PPL_JAX_COORDINATOR"].strip()
        rollcall.parse_address(coordinator)
    import jax

    timeouts = dict(
        heartbeat_timeout_seconds=_env_seconds("PPL_JAX_HEARTBEAT_TIMEOUT", HEARTBEAT_TIMEOUT_S),
        shutdown_timeout_seconds=_env_seconds("PPL_JAX_SHUTDOWN_TIMEOUT", SHUTDOWN_TIMEOUT_S),
        initialization_timeout=_env_seconds("PPL_JAX_INIT_TIMEOUT", INITIALIZATION_TIMEOUT_S),
    )
    if num > 1:
        _join_given(coordinator, num, process_id, timeouts)
    else:
        _join_detected(timeouts, all_local)
    _guard_stderr(jax.process_count(), timeouts["heartbeat_timeout_seconds"])
    sys.excepthook = _make_excepthook(sys.excepthook, timeouts["heartbeat_timeout_seconds"])
    absl_app.install_exception_handler(_FailFast(timeouts["heartbeat_timeout_seconds"]))
    return True


def _join_given(coordinator: str, num: int, process_id: int, timeouts: dict[str, int]) -> None:
    """Joins the `num` processes `PPL_JAX_*` names (`launch/local.sh`): a roll call, then
    `jax.distributed.initialize` with CPU collectives (gloo) for runs on CPU."""
    import jax

    rollcall.roll_call(coordinator, num, process_id, timeouts["initialization_timeout"])
    # CPU collectives across processes (real multi-process tests run on CPU).
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(
        coordinator_address=coordinator,
        num_processes=num,
        process_id=process_id,
        **timeouts,
    )


def _join_detected(timeouts: dict[str, int], all_local: bool) -> None:
    """Joins the processes JAX's cluster detection finds (SLURM, Open MPI, Cloud TPU VMs,
    Kubernetes; `PPL_JAX_DISTRIBUTED=1`), after a roll call where it finds several; with
    `all_local` (`PPL_JAX_ALL_LOCAL_DEVICES=1`), each process drives every GPU it sees."""
    import jax

    cluster = rollcall.detect_cluster(timeouts["initialization_timeout"])
    if cluster is None or cluster.num_processes == 1:
        jax.distributed.initialize(**timeouts)
    else:
        rollcall.roll_call(
            cluster.coordinator,
            cluster.num_processes,
            cluster.process_id,
            timeouts["initialization_timeout"],
            source=cluster.source,
        )
        # The addresses the roll call used (JAX still takes local_device_ids from the
        # cluster, and does not ask for the coordinator again).
        jax.distributed.initialize(
            coordinator_address=cluster.coordinator,
            num_processes=cluster.num_processes,
            process_id=cluster.process_id,
            **timeouts,
        )
    if all_local and not os.environ.get("JAX_LOCAL_DEVICE_IDS"):
        # JAX's SLURM detection restricts each process to the GPU numbered SLURM_LOCALID
        # (one process per GPU, each seeing all of its node's GPUs). `launch/slurm.sh` runs
        # one process per node, or one per GPU that sees only its own GPU: either way a
        # process drives every GPU it can see. Applies before the backend starts.
        jax.config.update("jax_cuda_visible_devices", "all")
        jax.config.update("jax_rocm_visible_devices", "all")


# ------------------------------------------------------------------------- lost processes

# absl log lines of XLA's coordination service and its client ("E1122 21:16:10.761874 20369
# coordination_service_agent.cc:289] ..."): their arrival starts a hold on stderr.
_COORDINATION_LOG = re.compile(
    rb"^[WEF]\d{4} [\d:.]+ +\d+ (coordination_service\w*|preemption_sync_manager|client|"
    rb"service)\.(cc|h):\d+\]",
    re.M,
)
_FATAL = b"Terminating process because the JAX distributed service detected fatal errors"
_HOLD_S = 5.0  # coordination errors not followed by the fatal report within this are shown


def lost_process_message(report: str, num_processes: int, heartbeat_timeout: int) -> str:
    """The one line for the coordination service's fatal report `report` (its log text).

    Names the processes whose heartbeats stopped ("Task 1 heartbeat timeout", "stopped sending
    heartbeats): 1"), or process 0 when the coordinator it hosts cannot be reached.
    """
    ids = re.findall(r"Task (\d+) heartbeat timeout", report)
    unhealthy = re.search(r"stopped sending heartbeats\):\s*((?:\d+[\s,]*)+)", report)
    if unhealthy:
        ids += re.findall(r"\d+", unhealthy.group(1))
    ids = sorted(set(ids), key=int)
    if ids:
        who = "processes " + ", ".join(ids) if len(ids) > 1 else f"process {ids[0]}"
        why = f"no heartbeat for {heartbeat_timeout} s"
        return f"ppl-jax: error: {who} of {num_processes} stopped answering ({why}); {RESUME}"
    if "Failed to send RPC to coordination service" in report or "Socket closed" in report:
        return (
            f"ppl-jax: error: process 0 of {num_processes} stopped answering (it hosts the "
            f"coordination service, and its connection closed); {RESUME}"
        )
    status = report[report.find(_FATAL.decode()) :].split("absl::Status:", 1)[-1]
    status = " ".join(status.split())[:300]
    return f"ppl-jax: error: the JAX distributed service stopped the run ({status}); {RESUME}"


def _guard_main(num_processes: int, heartbeat_timeout: int) -> None:
    """The guard process: copies stdin to stdout, rewriting the coordination service's abort."""
    held, hold_since, fatal, last = b"", None, False, b"\n"
    while True:
        timeout = None if hold_since is None else max(0.0, hold_since + _HOLD_S - time.time())
        ready, _, _ = select.select([0], [], [], timeout)
        chunk = os.read(0, 65536) if ready else None
        if chunk == b"":
            break
        if fatal:
            continue  # the rest of the abort: its C++ stack trace, the unwinding
        if chunk is None:  # the hold expired without a fatal report: show what was held
            os.write(1, held)
            last = held[-1:]
            held, hold_since = b"", None
            continue
        if hold_since is None:
            match = _COORDINATION_LOG.search(chunk)
            if match is None:
                os.write(1, chunk)
                last = chunk[-1:]
                continue
            os.write(1, chunk[: match.start()])
            last = chunk[: match.start()][-1:] or last
            chunk, hold_since = chunk[match.start() :], time.time()
        held += chunk
        if _FATAL in held:
            # The whole fatal line (its status may span lines) arrives within a moment.
            time.sleep(0.2)
            if select.select([0], [], [], 0)[0]:
                held += os.read(0, 65536)
            message = lost_process_message(
                held.decode("utf-8", "replace"), num_processes, heartbeat_timeout
            )
            # On a line of its own, also after a progress bar's carriage return.
            os.write(1, (b"" if last == b"\n" else b"\n") + message.encode() + b"\n")
            fatal = True
    if held and not fatal:
        os.write(1, held)


def _guard_stderr(num_processes: int, heartbeat_timeout: int) -> None:
    """Routes this process's stderr (fd 2, C++ included) through a guard process."""
    import resource

    # An abort must not leave a core file per process.
    resource.setrlimit(resource.RLIMIT_CORE, (0, resource.getrlimit(resource.RLIMIT_CORE)[1]))
    sys.stderr.flush()
    read, write = os.pipe()
    guard = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys; from ppl_jax.runtime.distributed import _guard_main; "
            "_guard_main(int(sys.argv[1]), int(sys.argv[2]))",
            str(num_processes),
            str(heartbeat_timeout),
        ],
        stdin=read,
        stdout=os.dup(2),
        close_fds=True,
        start_new_session=True,  # a terminal's signals go to the worker, not the guard
    )
    os.close(read)
    os.dup2(write, 2)
    os.close(write)
    del guard  # it ends at end of input, when this process has exited


def _is_lost_peer(e: BaseException) -> bool:
    text = str(e)
    return type(e).__name__ in ("JaxRuntimeError", "XlaRuntimeError") and any(
        s in text for s in ("Gloo", "Connection closed by peer", "Connection reset by peer")
    )


def _fail_fast(value: BaseException, heartbeat_timeout: int, show) -> None:
    """Ends this process now, without JAX's shutdown barrier at exit.

    At exit JAX waits (up to the shutdown timeout) for every process to reach a barrier; the
    others, blocked in a collective with this one, never do. Exiting at once lets them see the
    loss within the heartbeat timeout. A collective that failed because a peer vanished waits
    instead for the coordination service, which names the lost process within
    `heartbeat_timeout` seconds and aborts this one (the guard prints the line); if it does not,
    one line says that a collective failed.
    """
    if _is_lost_peer(value):
        sys.stderr.flush()
        time.sleep(heartbeat_timeout + 5)
        reason = " ".join(str(value).split())[:300]
        print(
            f"ppl-jax: error: a collective with another process failed ({reason}); {RESUME}",
            file=sys.stderr,
        )
        status = 1
    else:
        show()
        status = 1
    exit_now(status)


def exit_now(status: int) -> None:
    """Ends the process with `status` at once: flushes stdout and stderr, skips exit handlers.

    In a multi-process run, call this instead of `sys.exit` after a failure: `sys.exit` runs
    JAX's shutdown barrier, which waits for processes that are blocked in a collective with this
    one, until the shutdown timeout. Single-process runs may call it too.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


def _make_excepthook(previous, heartbeat_timeout: int):
    """An uncaught exception ends the process at once (see `_fail_fast`)."""

    def hook(kind, value, tb):
        _fail_fast(value, heartbeat_timeout, lambda: previous(kind, value, tb))

    return hook


class _FailFast(absl_app.ExceptionHandler):
    """absl's exception handler (`app.install_exception_handler`): `app.run` calls it for an
    `Exception` that ends `main` (not for `SystemExit`: see `exit_now`)."""

    def __init__(self, heartbeat_timeout: int):
        self.heartbeat_timeout = heartbeat_timeout

    def handle(self, exc: BaseException) -> None:
        import traceback

        _fail_fast(exc, self.heartbeat_timeout, lambda: traceback.print_exception(exc))


def flags_of_all(flag: bool) -> list[bool]:
    """Every process's `flag`, by process index (`multihost_utils.process_allgather`); every
    process must call this at the same point, so it is also a barrier. One process: `[flag]`."""
    import jax

    if jax.process_count() == 1:
        return [bool(flag)]
    import numpy as np
    from jax.experimental import multihost_utils

    mine = np.asarray([int(flag)], np.int32)
    return [bool(x) for x in np.asarray(multihost_utils.process_allgather(mine)).reshape(-1)]


def check_same_plan(digest: str, what: str) -> None:
    """Stops every process with one sentence if the processes planned different windows.

    Every process calls this with the SHA-256 (hex) of its plan (`protocols.plan_digest`); on one
    process it does nothing. The digests are gathered (`multihost_utils.process_allgather`), so
    all processes raise together and none waits in a later collective.

    Raises:
      ConfigError: on every process, naming the first process whose plan differs from process
        0's.
    """
    import jax

    if jax.process_count() == 1:
        return
    import numpy as np
    from jax.experimental import multihost_utils

    mine = np.frombuffer(bytes.fromhex(digest), np.uint8)
    everyone = np.asarray(multihost_utils.process_allgather(mine)).reshape(-1, mine.size)
    differ = [i for i in range(everyone.shape[0]) if not np.array_equal(everyone[i], everyone[0])]
    if differ:
        raise ConfigError(
            f"process {differ[0]} planned other windows than process 0 for {what}; every process "
            f"must read the same text with the same settings (check that data.path names the "
            f"same files with the same contents on every host)."
        )
