"""The scoring side of the harness model, without lm_eval: harness requests as plans, scored by
`ppl_jax.evaluation.evaluator.Evaluator.score` on the mesh, on every process.

`RequestScorer` holds the model, its params on the mesh and the tokenizer, and scores
already-tokenized requests (`loglikelihood`, `loglikelihood_rolling`) with the same jit-compiled,
sharded, vocabulary-blocked step as every other run: each request is a window of a
`ppl_jax.plans.requests` plan, several requests share packed rows as segments, and the per-window
sums give the log-likelihood (minus the NLL sum, nats) and the greedy flag (every scored target
top-1). On process 0 a call first sends its arrays to every process (`transport.send`); the
others run `serve`, which receives each call and scores it alongside, until process 0's `stop`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh

from ppl_jax.checkpoints import architecture
from ppl_jax.checkpoints.opener import Checkpoint, dtype_of
from ppl_jax.data.spec import DatasetSpec
from ppl_jax.evaluation.checks import check_window
from ppl_jax.evaluation.evaluator import Evaluator
from ppl_jax.harness import transport
from ppl_jax.models.interface import LanguageModel
from ppl_jax.outputs.console import ProgressBar
from ppl_jax.plans import requests as requests_lib
from ppl_jax.plans.layout import MAX_SEGMENTS
from ppl_jax.plans.planner import Dataset, batches
from ppl_jax.plans.protocols import LM_EVAL_ROLLING, Plan
from ppl_jax.plans.spec import BatchSpec, ProtocolSpec
from ppl_jax.runtime import mesh as mesh_lib
from ppl_jax.scoring import observers
from ppl_jax.tokenizer import Tokenizer

LN2 = math.log(2.0)


@dataclasses.dataclass(frozen=True)
class LoglikelihoodResult:
    """Per request: `logprob` `[R] float64` (nats, the continuation's log-probability sum),
    `greedy` `[R] bool`, `num_tokens` `[R] int64` (continuation tokens scored), `num_bytes`
    `[R] int64` (UTF-8 bytes of the continuation text) and `bits_per_byte` `[R] float64`
    (`-logprob / ln 2 / num_bytes`; NaN for a continuation of no bytes)."""

    logprob: np.ndarray
    greedy: np.ndarray
    num_tokens: np.ndarray
    num_bytes: np.ndarray

    @property
    def bits_per_byte(self) -> np.ndarray:
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(self.num_bytes > 0, -self.logprob / LN2 / self.num_bytes, np.nan)


class RequestScorer:
    """Scores tokenized harness requests with a model's params on a mesh (see the module).

    Args:
      model: the model (`ppl_jax.LanguageModel`); params: its params, placed with
        `param_shardings` (None: the shardings of the default logical-axis rules).
      mesh: the device mesh (global).
      tokenizer: the model's tokenizer.
      seq_len: the model inputs per row, the harness's `max_length` (None: the model's
        positions).
      batch_size: rows per step (global), rounded up to a multiple of the mesh's `data` axis.
      packing: several requests per row (only for a model that keeps segments apart,
        `LanguageModel.honours_segments`: `ppl_jax.plans.planner.batches`).

    Raises:
      ConfigError: a `seq_len` beyond the model's positions.
    """

    def __init__(
        self,
        model: LanguageModel,
        params: Any,
        mesh: Mesh,
        tokenizer: Tokenizer,
        *,
        seq_len: int | None = None,
        batch_size: int = 8,
        packing: bool = True,
        param_shardings: Any = None,
    ):
        self.seq_len = int(seq_len or model.max_positions)
        check_window(self.seq_len, model, "seq_len")
        data = mesh.shape["data"]
        self.batch = BatchSpec(batch_size=-(-int(batch_size) // data) * data, packing=packing)
        self.model, self.params, self.mesh, self.tokenizer = model, params, mesh, tokenizer
        self.evaluator = Evaluator(
            model,
            mesh,
            [],
            tokenizer,
            param_shardings=param_shardings,
            batch=self.batch,
            compile=False,
        )
        self._stopped = False

    # ------------------------------------------------------------------ scoring (collective)

    def _score(self, plan: Plan, bar: str = "") -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(window NLL sums `[W] float64` nats, scored targets `[W] int64`, top-1 correct `[W]
        int64`) of a plan; every process calls it with the same plan. With `bar` (its text),
        process 0 shows a progress bar over the plan's windows (the run's
        `ppl_jax.outputs.console.ProgressBar`, an observer of the loop, on stderr, as the
        harness's HF backend shows one over its requests)."""
        layout = batches(plan, self.batch, self.model.honours_segments)
        # Segment slots rounded up to a power of two: a few compiled shapes across calls.
        slots = min(MAX_SEGMENTS, 1 << max(0, layout.max_segments - 1).bit_length())
        layout = dataclasses.replace(layout, max_segments=max(slots, layout.max_segments))
        dataset = Dataset(
            DatasetSpec(path="<harness requests>", name="harness"),
            ProtocolSpec(name=LM_EVAL_ROLLING.name, seq_len=self.seq_len),
            plan,
            layout,
        )
        shown = []
        if bar and jax.process_index() == 0:
            shown.append(ProgressBar(plan.windows.num_windows, leave=True, desc=bar))
        try:
            _, totals = self.evaluator.score(self.params, dataset, observers=shown)
        finally:
            observers.close(shown)
        return totals.window_nll, totals.window_tokens, totals.window_correct

    def loglikelihood_tokens(
        self,
        contexts: Sequence[Sequence[int]],
        continuations: Sequence[Sequence[int]],
        continuation_bytes: Sequence[int],
        progress: bool = False,
    ) -> LoglikelihoodResult:
        """Scores `loglikelihood` requests (`ppl_jax.plans.requests.loglikelihood_plan`), with a
        progress bar on process 0 when `progress`. On process 0 with several processes, sends
        them to the others first (each must be in `serve`). Raises DataError as the plan does."""
        ctx, ctx_off = transport.join(contexts)
        cont, cont_off = transport.join(continuations)
        nbytes = np.asarray(continuation_bytes, np.int64).astype(np.int32)
        plan = self._loglikelihood_plan(ctx, ctx_off, cont, cont_off, nbytes)  # may raise: first
        transport.send(transport.LOGLIKELIHOOD, [ctx, ctx_off, cont, cont_off, nbytes])
        return self._loglikelihood(plan, "Running loglikelihood requests" if progress else "")

    def _loglikelihood_plan(self, ctx, ctx_off, cont, cont_off, nbytes) -> Plan:
        return requests_lib.loglikelihood_plan(
            transport.split(ctx, ctx_off),
            transport.split(cont, cont_off),
            nbytes,
            self.seq_len,
            self.model.vocab_size,
        )

    def _loglikelihood(self, plan: Plan, bar: str = "") -> LoglikelihoodResult:
        nll, tokens, correct = self._score(plan, bar)
        return LoglikelihoodResult(
            logprob=-nll, greedy=correct == tokens, num_tokens=tokens, num_bytes=plan.doc_bytes
        )

    def rolling_tokens(
        self,
        documents: Sequence[Sequence[int]],
        document_bytes: Sequence[int],
        prefix: int,
        progress: bool = False,
    ) -> np.ndarray:
        """`[D] float64` nats: each document's log-likelihood under `loglikelihood_rolling`
        (`ppl_jax.plans.requests.rolling_plan`, the `lm_eval_rolling` windows), on every
        process as `loglikelihood_tokens` (a progress bar over the windows when `progress`)."""
        docs, off = transport.join(documents)
        nbytes = np.asarray(document_bytes, np.int64).astype(np.int32)
        plan = self._rolling_plan(docs, off, nbytes, prefix)  # may raise: before sending
        transport.send(transport.ROLLING, [docs, off, nbytes, np.asarray([prefix], np.int32)])
        return self._rolling(plan, "Running loglikelihood_rolling requests" if progress else "")

    def _rolling_plan(self, docs, off, nbytes, prefix: int) -> Plan:
        return requests_lib.rolling_plan(
            transport.split(docs, off), nbytes, self.seq_len, int(prefix), self.model.vocab_size
        )

    def _rolling(self, plan: Plan, bar: str = "") -> np.ndarray:
        if not plan.windows.num_windows:
            return np.zeros(plan.num_documents, np.float64)
        nll, _, _ = self._score(plan, bar)
        return -requests_lib.per_document(plan, nll)

    # ------------------------------------------------------------------ the other processes

    def serve(self) -> int:
        """On a process other than 0: scores every call process 0 makes, until it calls `stop`.
        Returns the number of calls served. With one process: returns 0 at once."""
        if jax.process_count() == 1 or jax.process_index() == 0:
            return 0
        served = 0
        while True:
            op, arrays = transport.receive()
            if op == transport.STOP:
                return served
            if op == transport.LOGLIKELIHOOD:
                self._loglikelihood(self._loglikelihood_plan(*arrays))
            elif op == transport.ROLLING:
                self._rolling(self._rolling_plan(*arrays[:3], int(arrays[3][0])))
            else:
                raise RuntimeError(f"process 0 sent an unknown operation {op}")
            served += 1

    def stop(self) -> None:
        """On process 0: ends the other processes' `serve` (once; later calls do nothing)."""
        if self._stopped or jax.process_index() != 0:
            return
        self._stopped = True
        transport.send(transport.STOP, [])

    def restart(self) -> None:
        """On process 0: a new session after `stop` (the others call `serve` again)."""
        self._stopped = False


def load(
    ckpt: Checkpoint,
    step: int | None,
    mesh: Any,
    dtype: str = "float32",
    attention: str = "auto",
    tokenizer: str = "auto",
) -> tuple[LanguageModel, Any, Tokenizer]:
    """The model, its params on `mesh` (read straight into their shardings) and its tokenizer
    (`Checkpoint.tokenizer_for`, as the command line resolves it: the checkpoint's own for
    `auto`, whatever its layout, a hub id included).

    Raises:
      ConfigError: `auto` with a checkpoint that carries no tokenizer, or a tokenizer whose
        vocabulary does not fit the model; CheckpointError: as `Checkpoint.restore`.
    """
    step = ckpt.resolve_step(step)
    arch = architecture.resolve(ckpt, step)
    model = arch.model(dtype, arch.attention(attention, dtype, mesh))
    # Quantized weights packed on the device where the format can, as a run's are.
    model, _ = architecture.packed(ckpt, step, model, ckpt.options.dequantize)
    tok, _ = ckpt.tokenizer_for(tokenizer, step=step, model=model, key="tokenizer")
    return model, restore(ckpt, step, model, mesh, dtype), tok


def restore(ckpt: Checkpoint, step: int | None, model: LanguageModel, mesh: Any, dtype: str) -> Any:
    """The params of `step` on `mesh`, placed by the default logical-axis rules in `dtype`.

    Raises:
      ConfigError: an unknown dtype. CheckpointError: as `Checkpoint.restore`.
    """
    target, _ = mesh_lib.param_targets(
        model.abstract_params, model.logical_axes, mesh, mesh_lib.DEFAULT_RULES, dtype_of(dtype)
    )
    return ckpt.restore(step, target)
