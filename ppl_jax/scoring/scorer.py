"""The scoring step (jit-compiled, sharded) and the loop that feeds it and reduces its sums.

The step is a pure function `(params, batch) -> StepSums`: per-window sums of negative
log-likelihood (nats) and counts, never means. It is compiled once per batch shape with explicit
input and output shardings over the mesh. The loop dispatches batch `i + 1` before it fetches the
sums of batch `i` (no host stall per step), and adds the sums on the host in float64. A background
thread (the feed) fills each process's rows and builds the global arrays a few batches ahead, so
the device does not wait for the host between steps.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh

from ppl_jax.metrics import curves
from ppl_jax.models.interface import LanguageModel
from ppl_jax.models.layers import context as context_lib
from ppl_jax.plans.layout import Layout
from ppl_jax.plans.windows import Windows
from ppl_jax.runtime import mesh as mesh_lib
from ppl_jax.scoring import observers as observers_lib
from ppl_jax.scoring import precision
from ppl_jax.scoring.feed import Feed
from ppl_jax.scoring.observers import NonFiniteScores, ScoreObserver
from ppl_jax.scoring.step import (  # noqa: F401  (the step's names, re-exported)
    BATCH_KEYS,
    StepOptions,
    StepSums,
    check_context,
    logits_budget,
    nll_chunk,
    score_step,
)

DEFAULT_OPTIONS = StepOptions()  # a frozen dataclass: one shared default


@dataclasses.dataclass
class ScoreTotals:
    """What the loop gathers on the host.

    Attributes:
      window_nll: `[W] float64`, nats, each window's NLL sum.
      window_tokens: `[W] int64`, each window's scored targets.
      window_entropy: `[W] float64`, nats, each window's predictive-entropy sum.
      window_correct: `[W] int64`, each window's top-1 correct targets.
      scoring_seconds: wall time of the loop after compilation; compile_seconds: compilation.
      host_seconds: of `scoring_seconds`, the time the loop waited for the host to prepare a
        batch (fill its rows and build its global arrays); near 0 when the feed keeps ahead.
      prepare_seconds: the time spent preparing batches, in the feed's thread (with prefetch
        off, in the loop itself, and then equal to `host_seconds`).
      stopped_at: the batch before which a stop request ended the loop, or None if it ran out.
      nll_by_position: `[P] float64` nats, tokens_by_position: `[P] int64`, the scored targets'
        NLL and count by position in the window (with `StepOptions.positions`), else None.
    """

    window_nll: np.ndarray
    window_tokens: np.ndarray
    window_entropy: np.ndarray
    window_correct: np.ndarray
    scoring_seconds: float = 0.0
    compile_seconds: float = 0.0
    host_seconds: float = 0.0
    prepare_seconds: float = 0.0
    stopped_at: int | None = None
    nll_by_position: np.ndarray | None = None
    tokens_by_position: np.ndarray | None = None
    batch_buckets: np.ndarray | None = None  # [batches, 2, K] float64: the above by batch, bucket

    @staticmethod
    def zeros(num_windows: int, positions: int = 0) -> ScoreTotals:
        """Empty totals for `num_windows` windows (and `positions` position slots, if any)."""
        return ScoreTotals(
            window_nll=np.zeros(num_windows, np.float64),
            window_tokens=np.zeros(num_windows, np.int64),
            window_entropy=np.zeros(num_windows, np.float64),
            window_correct=np.zeros(num_windows, np.int64),
            nll_by_position=np.zeros(positions, np.float64) if positions else None,
            tokens_by_position=np.zeros(positions, np.int64) if positions else None,
        )

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
    """Compiles the step for a model on a mesh, and runs it over a layout of windows.

    Args:
      model, mesh, param_shardings: the model, its mesh, and its params' shardings.
      options: the step's optional statistics (`StepOptions`).
      reference: with `options.reference`, the reference model and its params' shardings; the
        params given to `score` are then the pair `(params, reference params)`.
      copies: with `options.copies`, a study's copies, `(model, its params' shardings)` each; the
        params given to `score` are then `(params, (copy params, ...))`.

    Attributes:
      traces: how many times the step was traced (once per batch shape).
      matmul_precision: the precision of the step's matrix products
        (`ppl_jax.scoring.precision`: `options.matmul_precision`, `auto` resolved by the params'
        dtypes).
      prefetch: batches the feed's thread prepares ahead of the loop (0: each batch is prepared
        in the loop, just before it is dispatched).
      logits_budget: bytes of one block of logits on a device (`step.logits_budget`), which
        sets the NLL's chunk where `options.token_chunk` is 0 (`nll_chunk`).
    """

    prefetch: int = 2

    def __init__(
        self,
        model: LanguageModel,
        mesh: Mesh,
        param_shardings: Any,
        options: StepOptions = DEFAULT_OPTIONS,
        reference: tuple[LanguageModel, Any] | None = None,
        copies: Sequence[tuple[LanguageModel, Any]] = (),
    ):
        if options.reference != (reference is not None):
            raise ValueError("StepOptions.reference needs the reference model, and only then")
        if options.copies != len(copies) or (copies and reference is not None):
            raise ValueError("StepOptions.copies is the number of copies, without a reference")
        check_context(model, mesh)
        if reference is not None:
            check_context(reference[0], mesh, "the reference model")
        for copy, _ in copies:
            check_context(copy, mesh, "a copy")
        self.model = model
        self.mesh = mesh
        self.context = int(dict(mesh.shape).get(context_lib.AXIS, 1))
        self.param_shardings = param_shardings
        self.options = options
        self.reference = reference
        self.copies = tuple(copies)
        self.batch_sharding = mesh_lib.batch_sharding(mesh)
        self.logits_budget = logits_budget(mesh)
        self.matmul_precision = precision.resolve(
            options.matmul_precision,
            precision.computes_in_float32(
                model.abstract_params,
                *([reference[0].abstract_params] if reference else []),
                *(c.abstract_params for c, _ in self.copies),
            ),
        )
        self.traces = 0
        self._compiled: dict[tuple[int, int, int], Any] = {}

    @property
    def paired(self) -> bool:
        """Whether the params are a pair: `(params, reference params)` or `(params, copies')`."""
        return self.reference is not None or bool(self.copies)

    def _abstract_params(self) -> tuple[Any, Any]:
        """(the params' shardings, the abstract params), as the step takes them."""

        def abstract(model, shardings):
            return mesh_lib.placed(model.abstract_params, shardings)

        if self.copies:
            return (self.param_shardings, tuple(s for _, s in self.copies)), (
                abstract(self.model, self.param_shardings),
                tuple(abstract(c, s) for c, s in self.copies),
            )
        if self.reference is None:
            return self.param_shardings, abstract(self.model, self.param_shardings)
        ref_model, ref_shardings = self.reference
        return (self.param_shardings, ref_shardings), (
            abstract(self.model, self.param_shardings),
            abstract(ref_model, ref_shardings),
        )

    def compiled(self, batch_size: int, width: int, num_slots: int = 1) -> Any:
        """The step compiled for `[batch_size, width]` batches of `num_slots` segment slots
        (cached per shape)."""
        key = (batch_size, width, num_slots)
        if key not in self._compiled:
            self._compiled[key] = self.lowered(batch_size, width, num_slots).compile()
        return self._compiled[key]

    def lowered(self, batch_size: int, width: int, num_slots: int = 1) -> jax.stages.Lowered:
        """The step traced and lowered for `[batch_size, width]` batches of `num_slots` segment
        slots, at the step's matmul precision (not cached: `compiled` keeps what it compiles);
        `.as_text()` is its StableHLO."""
        reference_apply = self.reference[0].apply if self.reference else None

        def step(params, batch):
            self.traces += 1  # runs at trace time only
            return score_step(
                self.model.apply,
                params,
                batch,
                num_slots,
                self.options,
                reference_apply,
                self.context,
                self.logits_budget,
                tuple(c.apply for c, _ in self.copies),
            )

        shardings, abstract_params = self._abstract_params()
        jitted = jax.jit(
            step,
            in_shardings=(shardings, {k: self.batch_sharding for k in BATCH_KEYS}),
            out_shardings=mesh_lib.replicated(self.mesh),
        )
        dtypes = {
            "tokens": jnp.int32,
            "target_mask": jnp.bool_,
            "segment_ids": jnp.int32,
            "positions": jnp.int32,
        }
        abstract_batch = {
            k: jax.ShapeDtypeStruct((batch_size, width), dtypes[k], sharding=self.batch_sharding)
            for k in BATCH_KEYS
        }
        # The mesh is set while tracing, so that layers that split work by hand over `data`
        # or `context` (the MoE layer's routing,
        # `ppl_jax.models.layers.moe.experts.per_token_shard`; `attend` under a context axis) see
        # it, and the step's layout settings; and the matmul precision, which every product traced
        # without its own takes.
        settings = context_lib.Settings(self.options.context_attention, self.options.token_chunk)
        with (
            jax.set_mesh(self.mesh),
            context_lib.settings(settings),
            precision.applied(self.matmul_precision),
        ):
            return jitted.lower(abstract_params, abstract_batch)

    def nll_chunk(self, batch_size: int, width: int) -> int:
        """Tokens per row the NLL takes at once on a device in `[batch_size, width]` batches
        (`step.nll_chunk`; 0: all at once)."""
        return nll_chunk(
            batch_size,
            width,
            self.model.vocab_size,
            data=int(dict(self.mesh.shape).get("data", 1)),
            context=self.context,
            token_chunk=self.options.token_chunk,
            budget=self.logits_budget // (1 + self.options.copies),  # as the step's
        )

    def memory_analysis(self) -> dict[tuple[int, int, int], Any]:
        """XLA's memory analysis of each step compiled so far, by `(batch_size, width,
        num_slots)`: `jax.stages.Compiled.memory_analysis()`, whose fields are in bytes
        (`temp_size_in_bytes`: the step's temporaries; `argument_size_in_bytes`, ...), or None
        where the backend gives none. Empty before the first `score` or `compiled` call."""
        return {key: c.memory_analysis() for key, c in self._compiled.items()}

    def score(
        self,
        params: Any,
        windows: Windows,
        layout: Layout,
        totals: ScoreTotals | None = None,
        skip: np.ndarray | None = None,
        observers: Sequence[ScoreObserver] = (),
    ) -> ScoreTotals:
        """Scores every window; every process runs the same steps.

        Args:
          params: the model's params, placed with `param_shardings`.
          windows: the windows (the same on every process).
          layout: their placement in batches (`ppl_jax.plans.layout.plan_layout`); its batch size must
            be divisible by the mesh's `data` axis.
          totals: per-window sums to fill in place (a resumed run's), or None for new zeros.
          skip: `[num_batches] bool`, batches whose sums `totals` already holds (not run).
          observers: what watches the loop (`ppl_jax.scoring.observers.ScoreObserver`): each is
            asked before each batch whether to stop (True from any stops the loop there, the
            batches in flight fetched first, and sets `totals.stopped_at` to that index), and
            told of each fetched batch once its sums are in `totals`, in batch order (with
            `StepOptions.token_arrays`, its per-token arrays are in `host.extras`).

        Raises:
          NonFiniteScores (a NumericsError): a NaN or infinity at a scored position (naming the
            window's index; `NonFiniteScores.naming` names its place in the corpus).
        """
        num_windows = windows.num_windows
        if totals is None:
            totals = ScoreTotals.zeros(num_windows, self.options.positions)
        b, slots = layout.batch_size, layout.max_segments
        t0 = time.perf_counter()
        steps = {w: self.compiled(b, w, slots) for w in sorted(set(layout.widths))}
        totals.compile_seconds = time.perf_counter() - t0
        local = mesh_lib.local_rows(self.batch_sharding, (b, layout.widths[0]))
        if self.options.positions:  # (NLL, count) per batch and position bucket
            starts = curves.bucket_edges(self.options.positions)[:-1]
            totals.batch_buckets = np.zeros((layout.num_batches, 2, starts.size))

        def fetch(i: int, rows: list[tuple[int, ...]], sums: StepSums) -> None:
            host = jax.tree.map(lambda x: np.asarray(x.addressable_data(0)), sums)
            # (row, slot) -> window id; -1 for empty slots.
            ids = np.full((b, slots), -1, np.int64)
            for r, row in enumerate(rows):
                ids[r, : len(row)] = row
            if (host.num_tokens[ids < 0]).any():
                raise AssertionError("an empty slot scored tokens")
            bad = np.flatnonzero(host.num_nonfinite.ravel())
            if bad.size:
                raise NonFiniteScores(int(host.num_nonfinite.sum()), int(ids.ravel()[bad[0]]))
            real = ids >= 0
            k = ids[real]
            totals.window_nll[k] = host.nll_sum[real]
            totals.window_tokens[k] = host.num_tokens[real]
            totals.window_entropy[k] = host.entropy_sum[real]
            totals.window_correct[k] = host.num_correct[real]
            extras = host.extras
            if self.options.positions:
                totals.nll_by_position += extras["nll_by_position"]
                totals.tokens_by_position += extras["tokens_by_position"]
                both = np.stack([extras["nll_by_position"], extras["tokens_by_position"]])
                totals.batch_buckets[i] = np.add.reduceat(both, starts, axis=1, dtype=float)
            if self.options.token_arrays:
                _window_sums_from_tokens(totals, ids, extras)
            for observer in observers:
                observer.on_batch(i, rows, host)

        def prepare(i: int) -> tuple[list[tuple[int, ...]], dict[str, jax.Array]]:
            rows, width = layout.batch_rows(i), layout.widths[i]
            arrays = windows.fill([rows[r] for r in local], width)
            batch = {
                k: jax.make_array_from_process_local_data(
                    self.batch_sharding, arrays[k], (b, width)
                )
                for k in BATCH_KEYS
            }
            return rows, batch

        order = [i for i in range(layout.num_batches) if skip is None or not skip[i]]
        t1 = time.perf_counter()
        feed = Feed(prepare, order, self.prefetch)
        pending = None
        try:
            for i in order:
                if observers_lib.should_stop(observers, i):
                    totals.stopped_at = i
                    break
                rows, batch = feed.get(i)
                sums = steps[layout.widths[i]](params, batch)
                if pending is not None:
                    fetch(*pending)
                pending = (i, rows, sums)
            feed.close()
            if pending is not None:
                fetch(*pending)
        finally:
            feed.close()
        totals.host_seconds, totals.prepare_seconds = feed.wait_seconds, feed.prepare_seconds
        totals.scoring_seconds = time.perf_counter() - t1
        return totals


def _window_sums_from_tokens(
    totals: ScoreTotals, ids: np.ndarray, extras: dict[str, np.ndarray]
) -> None:
    """Sets the batch's window NLL and entropy sums to the float64 sums of its per-token values,
    so that the per-token NLLs written add up to the run's NLL within float64 rounding."""
    scored = extras["scored"]
    r, p = np.nonzero(scored)
    window = ids[r, extras["slot"][r, p] - 1]
    for name, column in (("nll", totals.window_nll), ("entropy", totals.window_entropy)):
        values = extras[name][r, p].astype(np.float64)
        batch_windows = np.unique(window)
        column[batch_windows] = 0.0
        np.add.at(column, window, values)
