"""Stopping a run cleanly on SIGTERM (a preemption notice) or SIGINT (Ctrl-C), at one batch that
every process agrees on.

The command line answers both signals from its first instruction (`answer_at_once`: one sentence
and the exit status 128 + the signal), and a run installs its `StopRequest` once, before its
setup, for all its steps and datasets: no signal ever meets the default action (a silent end) or
a KeyboardInterrupt traceback. On one process, the run's handlers only note the signal; the
scoring loop asks `requested(i)` before each batch, stops, and the run saves its journal;
between its phases (setup, restoring a step, the next pair) the run asks `check` and stops
there. On several processes, JAX's preemption
service (`jax.distributed`, on by default) already catches SIGTERM and tells every process;
`multihost_utils.reached_preemption_sync_point(i)` turns True on all of them at the same batch.
SIGINT is passed on to it as a SIGTERM, so that Ctrl-C stops every process together too. A second
signal ends the process at once (the journal keeps what its last flush held).

A signal is answered at once, on stderr: "stopping after this batch (about N s); press Ctrl-C
again to stop now" in a scoring loop, "stopping at the next safe point; ..." elsewhere. Python
runs a signal handler only between bytecodes, so not while the main thread waits in XLA for a
batch (145 s under load); the C-level handler writes the signal's number to a pipe at once
(`signal.set_wakeup_fd`), and a thread reading it answers (`os.write`, safe from any thread) and
ends the process on the second signal.
"""

from __future__ import annotations

import contextlib
import math
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

from ppl_jax.errors import Interrupted

EXIT_CODE = {signal.SIGINT: 130, signal.SIGTERM: 143}


def signal_name(sig: int | None) -> str:
    """The signal's name (`SIGTERM`), or "a signal" for None."""
    return signal.Signals(sig).name if sig is not None else "a signal"


class StopRequest:
    """The signal handlers of one run, installed by `with StopRequest() as stop:`; an observer
    of the scoring loop (`ppl_jax.scoring.observers.ScoreObserver`) that asks it to stop.

    Attributes:
      signal: the first signal received (`signal.SIGINT` or `signal.SIGTERM`), or None.
    """

    def __init__(self) -> None:
        self.signal: int | None = None
        self._previous: dict[int, Any] = {}
        self._multi = False
        self._watcher: threading.Thread | None = None
        self._pipe: tuple[int, int] | None = None
        self._wakeup = -1  # the wakeup fd before ours
        self._received = 0
        self._lock = threading.Lock()
        # The scoring loop: batches asked for and fetched (more asked: one is in flight), the
        # time of the last fetch and the seconds between the last two (`answer`).
        self._asked = self._fetched = 0
        self._fetched_at: float | None = None
        self._batch_seconds: float | None = None

    def __enter__(self) -> StopRequest:
        import jax

        self._multi = jax.process_count() > 1
        if threading.current_thread() is not threading.main_thread():
            return self  # signal handlers can only be set from the main thread
        handled = (signal.SIGINT,) if self._multi else (signal.SIGINT, signal.SIGTERM)
        for sig in handled:
            self._previous[sig] = signal.signal(sig, self._handle)
        self._watch()
        return self

    def __exit__(self, *exc: Any) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()
        if self._pipe is not None:
            signal.set_wakeup_fd(self._wakeup)
            os.close(self._pipe[1])  # the watcher reads the end of the pipe and returns
            if self._watcher is not None:
                self._watcher.join(timeout=5)
            os.close(self._pipe[0])
            self._pipe = self._watcher = None

    def _watch(self) -> None:
        """Starts the thread that answers a signal at once (see the module docstring)."""
        r, w = os.pipe()
        os.set_blocking(w, False)
        try:
            self._wakeup = signal.set_wakeup_fd(w, warn_on_full_buffer=False)
        except ValueError:  # not the main thread of the main interpreter
            os.close(r)
            os.close(w)
            return
        self._pipe = (r, w)
        self._watcher = threading.Thread(target=self._read, args=(r,), daemon=True)
        self._watcher.start()

    def _read(self, fd: int) -> None:
        while True:
            try:
                data = os.read(fd, 64)
            except OSError:
                return
            if not data:
                return
            for sig in data:
                if sig in self._previous:
                    self._answer(sig)

    def _answer(self, sig: int) -> None:
        """The watcher's answer to a signal: the first noted and answered, the second ends the
        process at once."""
        with self._lock:
            self._received += 1
            first = self._received == 1
        if not first:
            self._stop_now(sig)
        self.signal = sig
        name = signal.Signals(sig).name
        again = "press Ctrl-C again" if sig == signal.SIGINT else f"send {name} again"
        say(f"ppl-jax: {name}: {self.when()}; {again} to stop now.")
        if self._multi:  # JAX's preemption notifier handles SIGTERM for every process
            os.kill(os.getpid(), signal.SIGTERM)

    def when(self) -> str:
        """When the run will stop: after the batch in flight (and how long batches take), or at
        the next safe point between phases."""
        if self._asked <= self._fetched:
            return "stopping at the next safe point"
        if self._batch_seconds is None or self._fetched_at is None:
            return "stopping after this batch"
        # The loop stops before its next batch, after the one in flight and the one queued.
        left = 2 * self._batch_seconds - (time.monotonic() - self._fetched_at)
        return f"stopping after this batch (about {max(math.ceil(left), 1)} s)"

    def _stop_now(self, sig: int) -> None:
        say(
            f"ppl-jax: {signal.Signals(sig).name} again: stopped at once; the journal keeps "
            f"the batches of its last flush."
        )
        os._exit(EXIT_CODE.get(sig, 1))

    def _handle(self, sig: int, frame: Any) -> None:
        if self._watcher is not None:  # the watcher answers and counts (it reads every signal)
            if self.signal is None:
                self.signal = sig  # noted here too: the next `check` sees it, however soon
            return
        if self.signal is not None:
            print(
                f"ppl-jax: {signal.Signals(sig).name} again: stopped at once; the journal keeps "
                f"the batches of its last flush.",
                file=sys.stderr,
                flush=True,
            )
            os._exit(EXIT_CODE.get(sig, 1))
        self.signal = sig
        if self._multi:  # JAX's preemption notifier handles SIGTERM for every process
            os.kill(os.getpid(), signal.SIGTERM)

    def check(self, where: str, then: str = "") -> None:
        """Stops the run between its phases if a signal arrived (one process; on several, the
        scoring loop's `requested` stops every process at the same batch).

        Args:
          where: where the run stopped, for the sentence ("before step 2").
          then: what the sentence adds (what is kept, how to go on).

        Raises:
          Interrupted: naming the signal and `where`, with the exit status 128 + the signal.
        """
        if self.signal is None or self._multi:
            return
        name = signal.Signals(self.signal).name
        raise Interrupted(
            f"stopped by {name} {where}" + (f"; {then}" if then else "."),
            EXIT_CODE.get(self.signal, 128 + self.signal),
        )

    def should_stop(self, i: int) -> bool:
        """`requested(i)`: the scoring loop asks before each batch."""
        stop = self.requested(i)
        self._asked += not stop  # a batch in flight
        return stop

    def on_batch(self, i: int, rows: Any, host: Any) -> None:
        now = time.monotonic()
        if self._fetched_at is not None:
            self._batch_seconds = now - self._fetched_at
        self._fetched_at = now
        self._fetched += 1

    def close(self) -> None:
        pass

    def requested(self, step: int) -> bool:
        """Whether to stop before batch `step`; call it with every batch index, in order, on
        every process."""
        if not self._multi:
            return self.signal is not None
        from jax.experimental import multihost_utils

        if multihost_utils.reached_preemption_sync_point(step):
            if self.signal is None:
                self.signal = signal.SIGTERM
            return True
        return False


@contextlib.contextmanager
def signals_raise(what: str) -> Iterator[None]:
    """Within the block, SIGTERM and SIGINT raise `Interrupted` (exit code 128 + the signal),
    whose message says the run stopped while `what` ("tokenizing data 'web'"), so that the
    block's `finally` clauses remove its temporaries and the command line prints one sentence
    instead of ending silently. Outside the main thread (where handlers cannot be set) the
    block runs unchanged.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handle(sig: int, frame: Any) -> None:
        name = signal.Signals(sig).name
        raise Interrupted(
            f"{name} while {what}: stopped; what was finished is kept (the same command goes on "
            f"from there).",
            EXIT_CODE.get(sig, 128 + sig),
        )

    previous = {sig: signal.signal(sig, handle) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


# What the stop line of `answer_at_once` says is true after the stop, a run's unless a tool says
# otherwise (`stop_note`).
_note = [
    "nothing is left half-written, and a run goes on from what it finished when the same "
    "command runs again"
]


@contextlib.contextmanager
def stop_note(note: str) -> Iterator[None]:
    """Meanwhile the line of `answer_at_once` says `note` after `stopped by SIGTERM; ` (a
    tool's own truth: what is left, what the same command does), instead of a run's."""
    _note.append(note)
    try:
        yield
    finally:
        _note.pop()


def say(line: str) -> None:
    """`line` on stderr by `os.write`: safe in a signal handler and from any thread (a print
    there may meet the main thread's own write to `sys.stderr`, and raise)."""
    with contextlib.suppress(OSError):
        os.write(2, f"\n{line}\n".encode())


def answer_at_once() -> None:
    """Until a run installs its own handlers (`StopRequest`), SIGTERM and SIGINT end the process
    at once with one sentence on stderr and the exit status 128 + the signal: the command
    line's first instruction, so that a signal during imports, flag parsing or a tool is never
    the default action (a silent end) nor a KeyboardInterrupt traceback. The process ends by
    `os._exit`, not by an exception: one raised from a signal handler may land in a callback
    that drops it (JAX's garbage-collection callback does), and the run would go on. Nothing is
    left half-written (every file is written whole or not at all; a lock ends with the
    process). Outside the main thread, nothing is installed. A tool says what is true of its
    own stop meanwhile (`stop_note`).
    """
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):  # SIGTERM last: caught, both are
            signal.signal(sig, _exit_now)


def _exit_now(sig: int, frame: Any) -> None:
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    print(
        f"ppl-jax: stopped by {signal.Signals(sig).name}; {_note[-1]}.", file=sys.stderr, flush=True
    )
    os._exit(EXIT_CODE.get(sig, 128 + sig))
