"""What watches the scoring loop (`Scorer.score`): observers, given as a list.

An observer is told of each batch once its sums are on the host and in the loop's totals, and is
asked before each batch whether to stop. The journal's `Recorder`
(`ppl_jax.outputs.journal`), the signal handlers' `StopRequest` (`ppl_jax.runtime.preemption`),
the progress bar (`ppl_jax.outputs.console.ProgressBar`), the per-token file's `TokenWriter`
(`ppl_jax.outputs.tokens`) and the divergence gatherer (`ppl_jax.metrics.divergence.Divergence`)
are observers: each implements the three methods (structurally: none imports this module).
This is clu's and big_vision's shape (the loop returns sums; what watches it is a list of
objects with one small interface).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

from ppl_jax.errors import NumericsError


class ScoreObserver(Protocol):
    """Watches a scoring loop.

    The loop asks `should_stop(i)` of every observer (each of them, in order, on every process)
    before it dispatches batch `i`, and stops there if any says True. It calls `on_batch` once
    the sums of batch `i` are in its totals, in batch order. `close()` is for the observer's
    owner, once the scoring it watched is over; the loop never calls it (a run that fails or is
    stopped may discard what an observer gathered instead).
    """

    def should_stop(self, i: int) -> bool:
        """Whether to stop before batch `i`; called with every index the loop reaches, in
        order, identically on every process."""
        ...

    def on_batch(self, i: int, rows: Sequence[tuple[int, ...]], host: Any) -> None:
        """Batch `i` is in: `rows` its rows' window ids (one tuple per row), `host` its
        `ppl_jax.scoring.scorer.StepSums` as NumPy arrays on the host (`[batch, slots]` sums;
        `host.extras` the step's optional outputs, per-token arrays among them)."""
        ...

    def close(self) -> None:
        """The scoring this observer watched is over (called by its owner)."""
        ...


def should_stop(observers: Sequence[ScoreObserver], i: int) -> bool:
    """Whether any observer asks to stop before batch `i` (every one is asked, in order: a stop
    request that agrees across processes must see every index)."""
    return any([o.should_stop(i) for o in observers])


def close(observers: Sequence[ScoreObserver]) -> None:
    """Closes every observer, in order."""
    for o in observers:
        o.close()


class NonFiniteScores(NumericsError):
    """NaN or infinity at scored positions: `count` of them in a batch, the first in window
    `window` (named by `where`, by default `window <k>`)."""

    def __init__(self, count: int, window: int, where: str | None = None):
        self.count, self.window = count, window
        super().__init__(
            f"the model gave {count} NaN or infinite log-probabilities at scored positions, "
            f"first in {where or f'window {window}'}; no result is reported. Check the "
            f"checkpoint's weights and model.dtype."
        )

    def naming(self, describe_window: Callable[[int], str]) -> NonFiniteScores:
        """The same error, its window named by `describe_window` (`Plan.describe_window`: the
        document and token of the corpus)."""
        return NonFiniteScores(self.count, self.window, describe_window(self.window))
