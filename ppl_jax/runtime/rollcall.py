"""A roll call before `jax.distributed.initialize`, so that a process that never starts is named.

JAX's own start waits `initialization_timeout` seconds for every process to register with the
coordination service, then aborts each process in C++ with a stack trace and no word of which
process is missing (`DEADLINE_EXCEEDED ... RegisterTask`). With an explicit coordinator
(`PPL_JAX_COORDINATOR=host:port`, as `launch/local.sh` sets it), process 0 first listens on the
next port (`port + 1`) and every other process reports there with its id and the process count;
process 0 waits for all of them, at most `timeout` seconds, and then:

- every process answered: it tells each one so, and all go on to `jax.distributed.initialize`;
- some did not: process 0 stops with one sentence naming them; the others, told nothing, stop
  with one sentence naming process 0 (which holds the list).

A process whose id or count disagrees with process 0's is named too. When process 0 cannot
listen on `port + 1` (taken), the roll call is skipped and the others, finding the coordinator's
own port open, go on; JAX's start then reports as before.
"""

from __future__ import annotations

import contextlib
import socket
import time

from ppl_jax.errors import ConfigError

_HELLO = b"ppl-jax roll call"


def parse_address(coordinator: str) -> tuple[str, int]:
    """`(host, port)` of `PPL_JAX_COORDINATOR`.

    Raises:
      ConfigError: not `host:port` with a port in 1..65534.
    """
    host, sep, port = coordinator.rpartition(":")
    if not sep or not host or not port.isdigit() or not 1 <= int(port) <= 65534:
        raise ConfigError(
            f"PPL_JAX_COORDINATOR={coordinator!r} is not host:port (for example "
            f"10.0.0.1:12355, a port below 65535); set it to process 0's address."
        )
    return host.strip("[]"), int(port)


def roll_call(coordinator: str, num_processes: int, process_id: int, timeout: float) -> None:
    """Waits until every process of the run has started (see the module docstring).

    Raises:
      ConfigError: on process 0, the processes that did not report within `timeout` seconds
        (or reported another process count); on the others, process 0 not answering, or
        answering that the run cannot start.
    """
    host, port = parse_address(coordinator)
    if process_id == 0:
        _lead(port + 1, num_processes, timeout, coordinator)
    else:
        _report(host, port, num_processes, process_id, timeout, coordinator)


def _lead(port: int, num: int, timeout: float, coordinator: str) -> None:
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
        raise ConfigError(
            f"{what} (process 0 waited for them at {coordinator}); start every process with "
            f"PPL_JAX_NUM_PROCESSES={num}, its own PPL_JAX_PROCESS_ID (0..{num - 1}) and "
            f"PPL_JAX_COORDINATOR={coordinator}, or raise PPL_JAX_INIT_TIMEOUT."
        )


def _report(host: str, port: int, num: int, pid: int, timeout: float, coordinator: str) -> None:
    deadline = time.monotonic() + timeout
    while (left := deadline - time.monotonic()) > 0:
        try:
            with socket.create_connection((host, port + 1), timeout=min(left, 5)) as conn:
                conn.sendall(_HELLO + f" {pid} {num}".encode())
                conn.settimeout(max(deadline - time.monotonic(), 0) + 10)
                verdict = conn.recv(16)
            if verdict == b"go":
                return
            raise ConfigError(
                f"process 0 (at {coordinator}) says not every process of {num} started; its "
                f"log names them."
            )
        except OSError:  # refused, timed out, or no such host yet
            if _open(host, port):  # process 0 is in JAX's start without a roll call
                return
            time.sleep(0.2)
    raise ConfigError(
        f"process {pid} of {num}: process 0 (the coordinator at {coordinator}) did not answer "
        f"within {timeout:g} s; start it (PPL_JAX_PROCESS_ID=0), or check PPL_JAX_COORDINATOR."
    )


def _open(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=1):
            return True
    except OSError:
        return False
