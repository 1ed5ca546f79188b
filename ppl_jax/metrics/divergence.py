"""Divergence from a reference model: the host side of `reference.checkpoint.dir`.

The scoring step runs the model and a reference model on the same batch and returns, per scored
target, KL(reference || model) of the two predictive distributions (nats; computed in vocabulary
blocks from both models' hidden states, `ppl_jax.scoring.nll`), the reference's NLL of the target, and
whether both put the same token first. `Divergence` gathers them, and `Divergence.summary`
reports what llama.cpp's `perplexity --kl-divergence` reports (llama.cpp, tools/perplexity):

- `kl_mean`, `kl_median`, `kl_p90`, `kl_p99`, `kl_max` (nats per token; the quantiles are
  `numpy.quantile`'s default linear interpolation over all scored tokens), and where the maximum
  occurs;
- `same_top1`: the fraction of tokens where both models' most probable token is the same;
- `perplexity` and `reference_perplexity` over the same tokens, their ratio, and
  `delta_logprob_mean`: the mean of log p_model(target) - log p_reference(target) (nats);
  `exp(-delta_logprob_mean)` is the perplexity ratio.

Host memory: 16 bytes per scored token (the KL values, float32, are kept for the quantiles, with
a window id and a row position to name the maximum; the NLLs are summed on the fly in float64).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

KL_QUANTILES = {"kl_median": 0.5, "kl_p90": 0.9, "kl_p99": 0.99}


class Divergence:
    """Gathers the per-token divergence of a run, batch by batch: an observer of the scoring
    loop (`ppl_jax.scoring.observers.ScoreObserver`) of a step with a reference model.

    Args:
      describe_window: names a window's place in the corpus (`Plan.describe_window`).
    """

    def __init__(self, describe_window: Callable[[int], str] | None = None):
        self.describe_window = describe_window
        self._kl: list[np.ndarray] = []
        self._window: list[np.ndarray] = []
        self._position: list[np.ndarray] = []
        self.num_tokens = 0
        self.nll_sum = 0.0  # float64 nats, the model
        self.reference_nll_sum = 0.0  # float64 nats, the reference
        self.kl_sum = 0.0  # float64 nats
        self.num_same_top1 = 0

    def should_stop(self, i: int) -> bool:
        return False

    def on_batch(self, i: int, rows: list[tuple[int, ...]], host: Any) -> None:
        """`add(rows, host.extras)`."""
        self.add(rows, host.extras)

    def close(self) -> None:
        pass

    def add(self, rows: list[tuple[int, ...]], arrays: dict[str, np.ndarray]) -> None:
        """Adds one batch.

        Args:
          rows: the batch's rows, the window ids each holds (`Layout.batch_rows`).
          arrays: the step's per-token host arrays `[batch, seq]` (`StepSums.extras`): `scored`,
            `slot`, `nll`, `kl`, `reference_nll`, `same_top1`.
        """
        r, p = np.nonzero(arrays["scored"])
        ids = np.full((len(rows), max((len(x) for x in rows), default=0) or 1), -1, np.int64)
        for i, row in enumerate(rows):
            ids[i, : len(row)] = row
        kl = arrays["kl"][r, p].astype(np.float32)
        self._kl.append(kl)
        self._window.append(ids[r, arrays["slot"][r, p] - 1])
        self._position.append((p + 1).astype(np.int32))  # the target's row position
        self.num_tokens += int(r.size)
        self.kl_sum += float(np.sum(kl, dtype=np.float64))
        self.nll_sum += float(np.sum(arrays["nll"][r, p], dtype=np.float64))
        self.reference_nll_sum += float(np.sum(arrays["reference_nll"][r, p], dtype=np.float64))
        self.num_same_top1 += int(np.count_nonzero(arrays["same_top1"][r, p]))

    def summary(self) -> dict[str, Any]:
        """The statistics above, JSON-ready (None where no token was scored)."""
        n = self.num_tokens
        if n == 0:
            return {"num_tokens": 0}
        kl = np.concatenate(self._kl)
        at = int(np.argmax(kl))
        window = int(np.concatenate(self._window)[at])
        where = self.describe_window(window) if self.describe_window else f"window {window}"
        delta = (self.reference_nll_sum - self.nll_sum) / n
        return {
            "num_tokens": n,
            "kl_mean": self.kl_sum / n,
            **{k: float(np.quantile(kl.astype(np.float64), q)) for k, q in KL_QUANTILES.items()},
            "kl_max": float(kl[at]),
            "kl_max_at": f"{where}, row position {int(np.concatenate(self._position)[at])}",
            "same_top1": self.num_same_top1 / n,
            "perplexity": _exp(self.nll_sum / n),
            "reference_perplexity": _exp(self.reference_nll_sum / n),
            "perplexity_ratio": _exp(-delta),
            "delta_logprob_mean": delta,
        }


def _exp(x: float) -> float | None:
    try:
        return math.exp(x)
    except OverflowError:
        return None


def summary_lines(summary: dict[str, Any], reference: str) -> list[str]:
    """The terminal lines of a divergence summary."""
    if not summary.get("num_tokens"):
        return []

    def f(key: str) -> str:
        v = summary.get(key)
        return "n/a" if v is None else f"{v:.6g}"

    return [
        f"divergence from {reference} over {summary['num_tokens']:,} tokens:",
        f"  KL(reference || model) nats/token: mean {f('kl_mean')}, median {f('kl_median')}, "
        f"p99 {f('kl_p99')}, max {f('kl_max')} ({summary['kl_max_at']})",
        f"  same top-1 token: {100 * summary['same_top1']:.2f}%; perplexity {f('perplexity')} "
        f"vs reference {f('reference_perplexity')} (ratio {f('perplexity_ratio')})",
    ]
