"""A roll call before `jax.distributed.initialize`, so that a process that never starts is named.

JAX's own start waits `initialization_timeout` seconds for every process to register with the
coordination service, then aborts each process in C++ with a stack trace and no word of which
process is missing (`DEADLINE_EXCEEDED ... RegisterTask`). So, first, process 0 listens on the
port beside the coordinator's (`roll_call_port`: `port + 1`, or `port - 1` for 65535) and every
other process reports there with its id and the process count; process 0 waits for all of them,
at most `timeout` seconds, and then:

- every process answered: it tells each one so, and all go on to `jax.distributed.initialize`;
- some did not: process 0 stops with one sentence naming them; the others, told nothing, stop
  with one sentence naming process 0 (which holds the list).

The coordinator, the process count and this process's id come from `PPL_JAX_COORDINATOR` and its
companions (`launch/local.sh`), or, with `PPL_JAX_DISTRIBUTED=1`, from JAX's own cluster detection
(`detect_cluster`: SLURM, Open MPI, Cloud TPU VMs, Kubernetes), which the roll call asks first the
way `jax.distributed.initialize()` would; when that finds nothing, there is no roll call.

A process whose id or count disagrees with process 0's is named too. When process 0 cannot
listen on the roll call's port (taken), the roll call is skipped and the others, finding the
coordinator's own port open, go on; JAX's start then reports as before. An answer on the roll
call's port that is not process 0's (another program holds that port) is not taken for a verdict.
"""

from __future__ import annotations

import contextlib
import os
import socket
import time
from typing import NamedTuple

from ppl_jax.errors import ConfigError

_HELLO = b"ppl-jax roll call"
OWN = "PPL_JAX_COORDINATOR"  # the source of addresses the user set
# JAX's cluster environments (`jax._src.clusters`), by class name, as a message names them.
_SOURCES = {
    "SlurmCluster": "SLURM's variables",
    "OmpiCluster": "Open MPI's variables",
    "Mpi4pyCluster": "MPI",
    "GceTpuCluster": "the TPU VM's metadata",
    "GkeTpuCluster": "GKE's TPU variables",
    "K8sCluster": "the Kubernetes API",
}


class Cluster(NamedTuple):
    """Who takes part in the run: what `jax.distributed.initialize` is given.

    Attributes:
      coordinator: host:port of the coordination service (process 0).
      num_processes: how many processes the run has (at least 1).
      process_id: this process's id, 0..num_processes-1.
      source: where they came from, for messages: `OWN` (`PPL_JAX_COORDINATOR`), or the cluster
        environment JAX detected ("SLURM's variables", "the TPU VM's metadata", ...), or
        `JAX_COORDINATOR_ADDRESS`.
    """

    coordinator: str
    num_processes: int
    process_id: int
    source: str


def _split(address: str) -> tuple[str, int] | None:
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or not 1 <= int(port) <= 65535:
        return None
    return host.strip("[]"), int(port)


def parse_address(coordinator: str) -> tuple[str, int]:
    """`(host, port)` of `PPL_JAX_COORDINATOR`.

    Raises:
      ConfigError: not `host:port` with a port in 1..65535.
    """
    parsed = _split(coordinator)
    if parsed is None:
        raise ConfigError(
            f"PPL_JAX_COORDINATOR={coordinator!r} is not host:port (for example "
            f"10.0.0.1:12355, a port from 1 to 65535); set it to process 0's address."
        )
    return parsed


def roll_call_port(port: int) -> int:
    """The roll call's port for coordinator port `port` (1..65535): `port + 1`, or 65534 for
    65535 (SLURM's and Open MPI's automatic ports reach 65535). Every process computes the same."""
    return port + 1 if port < 65535 else port - 1


def detect_cluster(timeout: int) -> Cluster | None:
    """The coordinator, process count and id that `jax.distributed.initialize()` would find itself.

    Asks JAX's cluster detection (`jax._src.clusters.ClusterEnv`, private: JAX 0.4 to 0.10 have
    it), as `jax.distributed.initialize()` does with no arguments, `JAX_COORDINATOR_ADDRESS` and
    `JAX_COORDINATOR_PORT` included; `timeout` (seconds) bounds its wait for the coordinator's
    host name to resolve (TPU VMs, Kubernetes). Returns None when that API is missing, raises,
    or finds no cluster; then there is no roll call and JAX's start reports as before. Raises
    nothing.
    """
    given = os.environ.get("JAX_COORDINATOR_ADDRESS") or None
    try:
        from jax._src.clusters import ClusterEnv

        coordinator, num, pid, _ = ClusterEnv.auto_detect_unset_distributed_params(
            coordinator_address=given,
            num_processes=None,
            process_id=None,
            local_device_ids=None,
            cluster_detection_method=None,
            initialization_timeout=timeout,
        )
        if not isinstance(coordinator, str) or _split(coordinator) is None:
            return None
        num, pid = int(num), int(pid)
        if not 0 <= pid < num:
            return None
        source = "JAX_COORDINATOR_ADDRESS" if given else _source(ClusterEnv)
        return Cluster(coordinator, num, pid, source)
    except Exception:  # a private API: whatever goes wrong there means no roll call
        return None


def _source(cluster_env) -> str:
    """The name of the first cluster environment present, as JAX's detection picks it."""
    for env in getattr(cluster_env, "_cluster_types", ()):
        try:
            if not getattr(env, "opt_in_only_method", False) and env.is_env_present():
                return _SOURCES.get(env.__name__, env.__name__)
        except Exception:  # an environment that cannot tell is not this one
            continue
    return "JAX's cluster detection"


def roll_call(
    coordinator: str, num_processes: int, process_id: int, timeout: float, source: str = OWN
) -> None:
    """Waits until every process of the run has started (see the module docstring).

    `coordinator` is JAX's coordinator (host:port); `source` says where it came from (`OWN` for
    `PPL_JAX_COORDINATOR`, else `Cluster.source`), for the messages. Waits at most `timeout`
    seconds.

    Raises:
      ConfigError: on process 0, the processes that did not report within `timeout` seconds
        (or reported another process count); on the others, process 0 not answering, or
        answering that the run cannot start; `coordinator` not host:port (`parse_address`).
    """
    host, port = parse_address(coordinator)
    if process_id == 0:
        _lead(roll_call_port(port), num_processes, timeout, coordinator, source)
    else:
        _report(host, port, num_processes, process_id, timeout, coordinator, source)


def _lead(port: int, num: int, timeout: float, coordinator: str, source: str) -> None:
    try:
        server = socket.create_server(("", port), reuse_port=False)
    except OSError:
        return  # the port is taken: no roll call (JAX's start reports as before)
    seen: dict[int, socket.socket] = {}
    disagree: list[str] = []
    deadline = time.monotonic() + timeout
    with server:
        while len(seen) < num - 1 and (left := deadline - time.monotonic()) > 0:
            server.settimeout(left)
            try:
                conn, _ = server.accept()
            except TimeoutError:
                break
            conn.settimeout(5)
            try:
                words = conn.recv(256).decode("ascii", "replace").split()
            except OSError:
                conn.close()
                continue
            if len(words) != 5 or " ".join(words[:3]).encode() != _HELLO:
                conn.close()
                continue
            pid, count = int(words[3]), int(words[4])
            if count != num or not 1 <= pid < num or pid in seen:
                disagree.append(f"a process said it is {pid} of {count}")
                with contextlib.suppress(OSError):
                    conn.sendall(b"stop")
                conn.close()
                continue
            seen[pid] = conn
        missing = [p for p in range(1, num) if p not in seen]
        verdict = b"go" if not missing and not disagree else b"stop"
        for conn in seen.values():
            with contextlib.suppress(OSError):
                conn.sendall(verdict)
            conn.close()
    if missing or disagree:
        who = (
            f"process {missing[0]}"
            if len(missing) == 1
            else "processes " + ", ".join(map(str, missing))
        )
        what = f"{who} of {num} did not start within {timeout:g} s" if missing else ""
        what = "; ".join(filter(None, [what, *disagree]))
        if source == OWN:
            where = f"process 0 waited for them at {coordinator}"
            fix = (
                f"start every process with PPL_JAX_NUM_PROCESSES={num}, its own "
                f"PPL_JAX_PROCESS_ID (0..{num - 1}) and PPL_JAX_COORDINATOR={coordinator}"
            )
        else:
            where = f"process 0 waited for them at {coordinator}, the coordinator from {source}"
            fix = "check that every process started and none failed early"
        raise ConfigError(f"{what} ({where}); {fix}, or raise PPL_JAX_INIT_TIMEOUT.")


def _report(
    host: str, port: int, num: int, pid: int, timeout: float, coordinator: str, source: str
) -> None:
    deadline = time.monotonic() + timeout
    while (left := deadline - time.monotonic()) > 0:
        try:
            with socket.create_connection((host, roll_call_port(port)), timeout=min(left, 5)) as c:
                c.sendall(_HELLO + f" {pid} {num}".encode())
                c.settimeout(max(deadline - time.monotonic(), 0) + 10)
                verdict = c.recv(16)
        except OSError:  # refused, timed out, or no such host yet
            verdict = b""
        if verdict == b"go":
            return
        if verdict == b"stop":
            raise ConfigError(
                f"process 0 (at {coordinator}) says not every process of {num} started; its "
                f"log names them."
            )
        # No verdict, or not process 0's (another program holds the roll call's port).
        if _open(host, port):  # process 0 is in JAX's start without a roll call
            return
        time.sleep(0.2)
    if source == OWN:
        where = f"the coordinator at {coordinator}"
        fix = "start it (PPL_JAX_PROCESS_ID=0), or check PPL_JAX_COORDINATOR"
    else:
        where = f"at {coordinator}, the coordinator from {source}"
        fix = "check that it started and did not fail early, or raise PPL_JAX_INIT_TIMEOUT"
    raise ConfigError(
        f"process {pid} of {num}: process 0 ({where}) did not answer within {timeout:g} s; {fix}."
    )


def _open(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=1):
            return True
    except OSError:
        return False
