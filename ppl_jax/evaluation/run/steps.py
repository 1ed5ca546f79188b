"""Which checkpoint steps a run scores (`checkpoint.step`, `checkpoint.watch`), the same on every
process: process 0 looks, and broadcasts what it decided."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import jax
import numpy as np
from jax.experimental import multihost_utils

from ppl_jax.checkpoints import Checkpoint
from ppl_jax.evaluation.spec import RunSpec

MAX_STEPS = 4096  # steps one broadcast carries


def agree(values: list[int]) -> list[int]:
    """Process 0's `values` on every process (a no-op on one process)."""
    if jax.process_count() == 1:
        return values
    padded = np.full(MAX_STEPS + 1, -1, np.int64)
    padded[0] = len(values)
    padded[1 : 1 + len(values)] = values[:MAX_STEPS]
    got = np.asarray(multihost_utils.broadcast_one_to_all(padded))
    return [int(x) for x in got[1 : 1 + int(got[0])]]


def steps_to_score(
    spec: RunSpec, ckpt: Checkpoint, first: int | None, waiting: Callable[[], None] = lambda: None
) -> Iterator[int | None]:
    """The checkpoint steps to score, in order; with `checkpoint.watch`, each newly finalized
    step as it appears, until `checkpoint.watch_until` is scored or no new step came for
    `checkpoint.watch_timeout` seconds. Process 0 looks; every process gets the same steps. A
    checkpoint of one set of weights (`first` None) is scored once. `waiting` is called before
    each look while watching (it raises to stop the run: the run's `StopRequest.check`)."""
    s = spec.steps
    if first is None or not (s.is_sweep or spec.is_training_run):
        yield first
        return
    is_main = jax.process_index() == 0
    listed = ckpt.steps()  # every process opens the directory; process 0's view wins
    if s.kind in ("one", "latest") and not s.watch:
        chosen = [first]
    elif s.kind == "one":
        chosen = [x for x in s.steps if x in listed] if is_main else []
    else:
        chosen = s.select(listed) if is_main else []
    seen: set[int] = set()
    for step in agree(chosen):
        seen.add(step)
        yield step
    if not s.watch:
        return
    idle_since = time.monotonic()
    while True:
        if s.watch_until is not None and any(x >= s.watch_until for x in seen):
            return
        waiting()
        new: list[int] = []
        timed_out = 0
        available = ckpt.steps()
        if is_main:
            latest = max(seen, default=-1)
            wanted = s.select(available) if s.kind not in ("latest", "one") else available
            new = [x for x in wanted if x not in seen and x > latest]
            if s.kind == "latest":
                new = new[-1:]
            timed_out = int(not new and time.monotonic() - idle_since > s.watch_timeout)
        decision = agree([timed_out, *new])
        if decision[0]:
            return
        if len(decision) > 1:
            for step in decision[1:]:
                seen.add(step)
                yield step
            idle_since = time.monotonic()
        else:
            time.sleep(s.watch_interval)
