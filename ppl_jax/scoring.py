"""The scoring step (jit-compiled, sharded) and the loop that feeds it and reduces its sums.

The step is a pure function `(params, batch) -> StepSums`: per-window sums of negative
log-likelihood (nats) and counts, never means. It is compiled once per batch shape with explicit
input and output shardings over the mesh. The loop builds each process's rows of batch `i + 1`
and dispatches it before it fetches the sums of batch `i` (no host stall per step), and adds the
sums on the host in float64.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from functools import partial
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh

from ppl_jax import mesh as mesh_lib
from ppl_jax.errors import NumericsError
from ppl_jax.model import LanguageModel
from ppl_jax.nll import token_nll, token_stats  # noqa: F401  (token_nll: re-exported)
from ppl_jax.windows import Windows

BATCH_KEYS = ("tokens", "target_mask", "segment_ids", "positions")


class StepSums(NamedTuple):
    """Per-window sums from one step; each `[batch]`, replicated on every device.

    nll_sum: float32, nats, over the window's scored targets.
    entropy_sum: float32, nats, the predictive entropy summed over the same targets.
    num_correct: int32, scored targets that are the model's top-1 prediction.
    num_tokens: int32, scored targets.
    num_nonfinite: int32, scored targets whose log-probability is NaN or infinite.
    """

    nll_sum: jax.Array
    entropy_sum: jax.Array
    num_correct: jax.Array
    num_tokens: jax.Array
    num_nonfinite: jax.Array


def score_step(apply: Callable[..., Any], params: Any, batch: dict[str, jax.Array]) -> StepSums:
    """Scores one batch of windows.

    Args:
      apply: `LanguageModel.apply`.
      params: the model's params.
      batch: `tokens`, `target_mask` (bool), `segment_ids`, `positions`, each
        `[batch, seq_len + 1]`. Position `j + 1` is the target of position `j` (the shift is
        made here); `target_mask[:, 0]` is ignored.

    Returns:
      `StepSums` per window. The `[batch, seq, vocab]` logits are never materialised for a
      model that returns `HiddenStates` (see `ppl_jax.nll`).
    """
    tokens = batch["tokens"]
    inputs, targets = tokens[:, :-1], tokens[:, 1:]  # the next-token shift
    mask = batch["target_mask"][:, 1:]
    output = apply(params, inputs, batch["positions"][:, :-1], batch["segment_ids"][:, :-1])
    stats = token_stats(output, targets)
    finite_BxT = jnp.isfinite(stats.nll) & jnp.isfinite(stats.entropy)
    ok_BxT = mask & finite_BxT
    return StepSums(
        nll_sum=jnp.sum(jnp.where(ok_BxT, stats.nll, 0.0), axis=1),
        entropy_sum=jnp.sum(jnp.where(ok_BxT, stats.entropy, 0.0), axis=1),
        num_correct=jnp.sum(ok_BxT & stats.correct, axis=1, dtype=jnp.int32),
        num_tokens=jnp.sum(mask, axis=1, dtype=jnp.int32),
        num_nonfinite=jnp.sum(mask & ~finite_BxT, axis=1, dtype=jnp.int32),
    )


@dataclasses.dataclass
class ScoreTotals:
    """What the loop gathers on the host.

    Attributes:
      window_nll: `[W] float64`, nats, each window's NLL sum.
      window_tokens: `[W] int64`, each window's scored targets.
      window_entropy: `[W] float64`, nats, each window's predictive-entropy sum.
      window_correct: `[W] int64`, each window's top-1 correct targets.
      scoring_seconds: wall time of the loop after compilation; compile_seconds: compilation.
    """

    window_nll: np.ndarray
    window_tokens: np.ndarray
    window_entropy: np.ndarray
    window_correct: np.ndarray
    scoring_seconds: float = 0.0
    compile_seconds: float = 0.0

    @property
    def nll_sum(self) -> float:
        """float64 nats over all windows."""
        return float(np.sum(self.window_nll))

    @property
    def num_tokens(self) -> int:
        return int(np.sum(self.window_tokens))

    @property
    def num_windows(self) -> int:
        return int(self.window_nll.size)


class Scorer:
    """Compiles the step for a model on a mesh, and runs it over windows.

    Attributes:
      traces: how many times the step was traced (one per batch shape).
    """

    def __init__(self, model: LanguageModel, mesh: Mesh, param_shardings: Any):
        self.model = model
        self.mesh = mesh
        self.param_shardings = param_shardings
        self.batch_sharding = mesh_lib.batch_sharding(mesh)
        self.traces = 0
        self._compiled: dict[tuple[int, int], Any] = {}

        def step(params, batch):
            self.traces += 1  # runs at trace time only
            return score_step(model.apply, params, batch)

        self._jitted = jax.jit(
            step,
            in_shardings=(param_shardings, {k: self.batch_sharding for k in BATCH_KEYS}),
            out_shardings=mesh_lib.replicated(mesh),
        )

    def compiled(self, batch_size: int, width: int) -> Any:
        """The step compiled for `[batch_size, width]` batches (cached per shape)."""
        key = (batch_size, width)
        if key not in self._compiled:
            abstract_params = jax.tree.map(
                lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                self.model.abstract_params, self.param_shardings,
            )
            dtypes = {"tokens": jnp.int32, "target_mask": jnp.bool_, "segment_ids": jnp.int32,
                      "positions": jnp.int32}
            abstract_batch = {
                k: jax.ShapeDtypeStruct((batch_size, width), dtypes[k], sharding=self.batch_sharding)
                for k in BATCH_KEYS
            }
            self._compiled[key] = self._jitted.lower(abstract_params, abstract_batch).compile()
        return self._compiled[key]

    def score(self, params: Any, windows: Windows, batch_size: int,
              progress: Callable[[int, int], None] | None = None,
              describe_window: Callable[[int], str] | None = None) -> ScoreTotals:
        """Scores every window; every process runs the same number of steps.

        Args:
          params: the model's params, placed with `param_shardings`.
          windows: the windows (the same on every process).
          batch_size: global rows per step; must be divisible by the mesh's `data` axis.
          progress: called after each fetched batch with (batch tokens, windows so far).
          describe_window: names a window's place in the corpus, for error messages.

        Raises:
          NumericsError: a NaN or infinity at a scored position (naming the window).
        """
        width = windows.seq_len + 1
        num_windows = windows.num_windows
        totals = ScoreTotals(
            window_nll=np.zeros(num_windows, np.float64),
            window_tokens=np.zeros(num_windows, np.int64),
            window_entropy=np.zeros(num_windows, np.float64),
            window_correct=np.zeros(num_windows, np.int64),
        )
        t0 = time.perf_counter()
        step = self.compiled(batch_size, width)
        totals.compile_seconds = time.perf_counter() - t0
        rows = mesh_lib.local_rows(self.batch_sharding, (batch_size, width))

        def fetch(first_window: int, sums: StepSums) -> None:
            host = StepSums(*(np.asarray(x.addressable_data(0)) for x in sums))
            bad = np.flatnonzero(host.num_nonfinite)
            if bad.size:
                k = first_window + int(bad[0])
                where = describe_window(k) if describe_window else f"window {k}"
                raise NumericsError(
                    f"the model gave {int(host.num_nonfinite.sum())} NaN or infinite "
                    f"log-probabilities at scored positions, first in {where}; no result is "
                    f"reported. Check the checkpoint's weights and model.dtype."
                )
            real = min(batch_size, num_windows - first_window)
            span = slice(first_window, first_window + real)
            totals.window_nll[span] = host.nll_sum[:real]
            totals.window_tokens[span] = host.num_tokens[:real]
            totals.window_entropy[span] = host.entropy_sum[:real]
            totals.window_correct[span] = host.num_correct[:real]
            if host.num_tokens[real:].any():
                raise AssertionError("a padding row scored tokens")
            if progress is not None:
                progress(int(host.num_tokens.sum()), real)

        t1 = time.perf_counter()
        pending: tuple[int, StepSums] | None = None
        for i in range(windows.num_batches(batch_size)):
            first = i * batch_size
            local = windows.rows(first + rows)
            batch = {
                k: jax.make_array_from_process_local_data(
                    self.batch_sharding, local[k], (batch_size, width)
                )
                for k in BATCH_KEYS
            }
            sums = step(params, batch)
            if pending is not None:
                fetch(*pending)
            pending = (first, sums)
        if pending is not None:
            fetch(*pending)
        totals.scoring_seconds = time.perf_counter() - t1
        return totals


def place_params(params: Any, shardings: Any) -> Any:
    """Puts host or device params onto the mesh with the given shardings."""
    return jax.tree.map(partial(jax.device_put), params, shardings)
