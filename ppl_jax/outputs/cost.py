"""What a pair's scoring will cost, said before it is paid: the windows, tokens and batches when
the scoring starts, and after the first batch an estimate of the whole, with, on a CPU where it
runs past `HINT_SECONDS`, how to cut the work (`data.max_tokens`, a larger `eval.stride`, a GPU).

A first command on a 135M GGUF over the whole WikiText-2 test split showed an ETA of 7 to 10 hours
on a loaded CPU only once tqdm had seen a few batches; these lines come at the start, on stderr
beside the progress bar (`ppl_jax.evaluation.run.hooks` adds the observer where the bar is shown).
"""

from __future__ import annotations

import dataclasses
import sys
import time
from collections.abc import Callable
from typing import Any

HINT_SECONDS = 600.0  # a CPU estimate past this says how to cut the work


def duration_text(seconds: float) -> str:
    """`42 s`, `12 min`, `7 h 05 min`: a duration to the second, minute or hour's minutes."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    minutes = int(round(seconds / 60))
    if minutes < 90:
        return f"{minutes} min"
    return f"{minutes // 60} h {minutes % 60:02d} min"


def tell(line: str) -> None:
    """One line on stderr that does not break a tqdm bar being drawn there."""
    from tqdm import tqdm

    tqdm.write(line, file=sys.stderr)


@dataclasses.dataclass
class CostNote:
    """An observer of the scoring loop (`ppl_jax.scoring.observers.ScoreObserver`) that says
    what the pair will cost: `start` at once, the estimate after the first batch.

    Attributes:
      windows, tokens: the windows and scored tokens left to score (a journal's excluded).
      batches, batch_size: the batches left and the rows of each.
      platform: the devices' platform (`cpu`, `gpu`, `tpu`), and how many there are.
      strided: whether a larger `eval.stride` means fewer windows (the protocol's `strided`).
      write: where each line goes; clock: seconds (`time.perf_counter`; tests give their own).
    """

    windows: int
    tokens: int
    batches: int
    batch_size: int
    platform: str
    num_devices: int = 1
    strided: bool = False
    write: Callable[[str], None] = tell
    clock: Callable[[], float] = time.perf_counter
    started: float | None = None
    estimated: float | None = None

    def start(self) -> None:
        """`scoring 2,306 windows (295,877 tokens) in 289 batches of 8 rows on 1 cpu device`
        (nothing when a journal holds every batch)."""
        if not self.batches:
            return
        devices = f"{self.num_devices} {self.platform} device" + "s" * (self.num_devices != 1)
        rows = f"{self.batch_size} row" + "s" * (self.batch_size != 1)
        self.write(
            f"scoring {self.windows:,} windows ({self.tokens:,} tokens) in {self.batches:,} "
            f"batches of {rows} on {devices}"
        )

    def should_stop(self, i: int) -> bool:
        if self.started is None:  # the first batch is about to be sent (compiled already)
            self.started = self.clock()
        return False

    def on_batch(self, i: int, rows: Any, host: Any) -> None:
        if self.estimated is not None or self.started is None:
            return
        first = max(self.clock() - self.started, 0.0)
        self.estimated = first * self.batches
        self.write(
            f"the first batch took {first:.1f} s: about {duration_text(self.estimated)} for "
            f"all {self.batches:,}"
        )
        if self.platform == "cpu" and self.estimated > HINT_SECONDS:
            self.write(self.hint())

    def hint(self) -> str:
        """How to cut the work on a CPU: a token budget that takes about `HINT_SECONDS`, a
        larger stride where the protocol has one, a GPU."""
        budget = _round(self.tokens * HINT_SECONDS / max(self.estimated or 1.0, 1e-9))
        stride = ", a larger eval.stride (fewer windows)" if self.strided else ""
        return (
            f"on a CPU this is long; to cut the work: --config.data.max_tokens={budget} (the "
            f"first {budget:,} tokens, about {duration_text(HINT_SECONDS)}){stride}, or a GPU."
        )

    def close(self) -> None:
        pass


def _round(n: float) -> int:
    """`n` down to two significant digits (at least 1,000): a budget easy to type."""
    n = max(int(n), 1000)
    scale = 10 ** (len(str(n)) - 2)
    return n // scale * scale
