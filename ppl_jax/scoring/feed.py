"""The feed of the scoring loop: batches prepared ahead of the device by a background thread.

`Scorer.score` fills the rows of the next batches (`Windows.fill`) and places them on this
process's devices in one background thread, `depth` batches ahead, so that the device never waits
for the host; the loop itself stays on the main thread.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from typing import Any


class Feed:
    """Batches prepared in order, `depth` ahead of the loop, by one background thread.

    Only host work runs in the thread: filling rows and placing them on this process's devices
    (`jax.make_array_from_process_local_data` is no collective). Everything every process must do
    in the same order (stop checks, which may be a collective, dispatch, fetch, callbacks) stays
    in the loop's thread. An exception in the thread is raised by `get`; `close` stops the thread
    and joins it (at most one batch's preparation later). With `depth` 0, `get` prepares inline.

    Attributes:
      wait_seconds: time `get` waited for a batch. prepare_seconds: time spent preparing.
    """

    def __init__(self, prepare: Callable[[int], Any], order: list[int], depth: int):
        self._prepare = prepare
        self.wait_seconds = 0.0
        self.prepare_seconds = 0.0
        self._stop = threading.Event()
        self._queue: queue.Queue = queue.Queue(maxsize=max(depth, 1))
        self._thread = None
        if depth > 0 and order:
            self._thread = threading.Thread(
                target=self._produce, args=(order,), name="ppl_jax-feed", daemon=True
            )
            self._thread.start()

    def _timed(self, i: int) -> Any:
        t = time.perf_counter()
        item = self._prepare(i)
        self.prepare_seconds += time.perf_counter() - t
        return item

    def _produce(self, order: list[int]) -> None:
        try:
            for i in order:
                if self._stop.is_set():
                    return
                self._put((i, self._timed(i), None))
        except BaseException as error:  # raised again in the loop's thread, by get
            self._put((None, None, error))

    def _put(self, item: tuple) -> None:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.05)
                return
            except queue.Full:
                continue

    def get(self, i: int) -> Any:
        """The prepared batch `i` (the next one in `order`); raises what preparing it raised."""
        t = time.perf_counter()
        try:
            if self._thread is None:
                return self._timed(i)
            while True:
                try:
                    j, item, error = self._queue.get(timeout=1.0)
                    break
                except queue.Empty:
                    if not self._thread.is_alive() and self._queue.empty():
                        raise RuntimeError(f"the feed's thread ended before batch {i}") from None
            if error is not None:
                raise error
            if j != i:
                raise AssertionError(f"the feed prepared batch {j} where the loop needs {i}")
            return item
        finally:
            self.wait_seconds += time.perf_counter() - t

    def close(self) -> None:
        """Stops the thread and joins it; prepared batches not taken are dropped."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        while not self._queue.empty():  # frees the device buffers of batches not taken
            self._queue.get_nowait()
