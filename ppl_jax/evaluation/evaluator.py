"""`Evaluator`: a suite of datasets, planned and compiled once, scored with new params per call.

What is built once: every dataset read, prepared, tokenized and planned (`ppl_jax.plans.planner`),
its batches laid out, and the scoring step compiled for every batch shape the suite needs (one
compilation per shape, shared by datasets whose shapes agree), with the step's optional
statistics (`StepOptions`: per-token arrays, sums by position, top-k, a reference model for KL).
Each call scores every dataset with the params it is given (already placed with
`param_shardings`), adds the sums on the host in float64, and returns the flat metrics; nothing is
traced again (`Evaluator.traces`).

A call is the one evaluation loop (datasets -> records -> averages -> sinks;
`ppl_jax.evaluation.hooks`): the command line (`ppl_jax.evaluation.run`) scores every checkpoint
step through the same call, adding its hooks (journal, diagnostics, progress, restore), so a
training loop and the CLI give the same numbers and write the same records, fingerprint
included: a training loop's `results.jsonl` (a `StoreSink`) is one the command line resumes.

```python
evaluator = ppl_jax.Evaluator(model, mesh, [
    ppl_jax.DatasetSpec(name="web", path="/data/val/web/*.jsonl", format="jsonl", tags="domain=web"),
    ppl_jax.DatasetSpec(name="code", path="/data/val/code.txt"),
], tokenizer, protocol=ppl_jax.ProtocolSpec(seq_len=1024), batch=ppl_jax.BatchSpec(batch_size=16))
for step in range(...):
    ...
    if step % 1000 == 0:
        scalars = evaluator(params, step=step)   # {"web/bits_per_byte": ..., ...}
```

With `checkpoint=` the checkpoint the params come from (its identity is in each record's
fingerprint), `evaluator(params, step, sinks=[StoreSink(ResultsStore.in_dir(out))])` writes the
records `ppl-jax` writes for the same settings into `out`, and the command line skips them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh

from ppl_jax.checkpoints import Checkpoint
from ppl_jax.data.spec import DatasetSpec
from ppl_jax.errors import ConfigError
from ppl_jax.evaluation import segments, summary
from ppl_jax.evaluation.checks import check_batch_size, check_window, no_tokenizer
from ppl_jax.evaluation.hooks import Hooks, PairHooks
from ppl_jax.evaluation.provenance import Provenance
from ppl_jax.evaluation.result import Evaluation
from ppl_jax.metrics import sums as metrics
from ppl_jax.models.interface import LanguageModel
from ppl_jax.outputs import journal, store
from ppl_jax.outputs.sinks import Sink
from ppl_jax.plans.layout import plan_layout
from ppl_jax.plans.planner import Dataset, plan_dataset
from ppl_jax.plans.protocols import Plan
from ppl_jax.plans.spec import BatchSpec, ProtocolSpec
from ppl_jax.runtime import fingerprint as fingerprint_lib
from ppl_jax.runtime import mesh as mesh_lib
from ppl_jax.scoring import precision
from ppl_jax.scoring.observers import NonFiniteScores, ScoreObserver
from ppl_jax.scoring.scorer import Scorer, ScoreTotals, StepOptions
from ppl_jax.tokenizer import Tokenizer


class Evaluator:
    """Scores a suite of datasets with the params of each call.

    Args:
      model: the model interface (`ppl_jax.LanguageModel`).
      mesh: the device mesh.
      suite: the datasets: prepared `plans.planner.Dataset`s, `DatasetSpec`s (scored with
        `protocol`), or `(DatasetSpec, ProtocolSpec)` pairs.
      tokenizer: the model's tokenizer (`ppl_jax.load_tokenizer`); needed unless `suite` holds
        prepared datasets (then its description is still the fingerprint's `tokenizer` part).
      param_shardings: the params' shardings on `mesh`, or None for those of the logical axis
        `rules` (`ppl_jax.runtime.mesh.DEFAULT_RULES` by default).
      protocol: the protocol of bare `DatasetSpec`s.
      batch: the batch layout of every dataset (windows packed several to a row only for a
        model that keeps them apart, `LanguageModel.honours_segments`).
      options: the step's optional statistics (`StepOptions`: `per_token`, `top_k`,
        `positions`, `reference`); `options.reference` follows `reference`.
      reference: a reference model (its params sharded by `rules`; restore them into
        `reference_targets`) or `(model, its params' shardings)`, for KL(reference || model)
        (`ppl_jax.metrics.divergence`).
      copies: a study's copies (`ppl_jax.metrics.study`) by name, `(model, its params'
        shardings)` each, scored against the model in the same step; `reference_params` is then
        the tuple of their params, in order (`options.copies` follows; no reference with them).
      compile: compile every batch shape now (else at the first call).
      checkpoint: the checkpoint the params are restored from: its `identity(step)` is the
        fingerprint's `checkpoint` part, its path and format are in the records (None: params
        of a training loop, an empty part).
      dtype: the params' dtype as the records name it (`float32`, `bfloat16`); default the
        float dtype of `model.abstract_params`.
      attention: the attention implementation the model runs, as the records and the
        fingerprint name it; default what `auto` resolves to for a family's model on `mesh`
        (`ppl_jax.checkpoints.architecture.Architecture.attention`, as `Architecture.model` and
        the command line resolve it), `xla` for a model of one's own.
      bootstrap_samples: the resamples of the records' 95% bootstrap intervals
        (`metrics.bootstrap_samples`; 0: none).
      seed: their seed (`metrics.seed`).

    Attributes:
      datasets: the prepared datasets, in suite order.
      param_targets (Any): the params tree of `jax.ShapeDtypeStruct(shape, dtype, sharding=...)` to
        restore into (`Checkpoint.restore(step, evaluator.param_targets)`), by `rules`.
      reference_targets (Any): the same for a reference model given alone, else None.
      copy_names: the copies' names, in the order of their params.
      traces: how many times the scoring step was traced (once per batch shape).

    Raises:
      ConfigError: a window longer than the model's positions, a batch size the mesh's `data`
        axis does not divide, or no tokenizer for a dataset to prepare (`checks.no_tokenizer`).
      DataError: a dataset's files.
    """

    def __init__(
        self,
        model: LanguageModel,
        mesh: Mesh,
        suite: Sequence[Dataset | DatasetSpec | tuple[DatasetSpec, ProtocolSpec]],
        tokenizer: Tokenizer | None = None,
        *,
        param_shardings: Any = None,
        protocol: ProtocolSpec | None = None,
        batch: BatchSpec | None = None,
        options: StepOptions | None = None,
        reference: LanguageModel | tuple[LanguageModel, Any] | None = None,
        copies: Mapping[str, tuple[LanguageModel, Any]] | None = None,
        compile: bool = True,
        rules: Sequence[tuple[str, str | None]] = mesh_lib.DEFAULT_RULES,
        checkpoint: Checkpoint | None = None,
        dtype: str | None = None,
        attention: str | None = None,
        bootstrap_samples: int = 1000,
        seed: int = 0,
    ):
        self.param_targets, shardings = mesh_lib.param_targets(
            model.abstract_params, model.logical_axes, mesh, rules
        )
        param_shardings = shardings if param_shardings is None else param_shardings
        self.reference_targets = None
        if isinstance(reference, LanguageModel):
            self.reference_targets, ref_shardings = mesh_lib.param_targets(
                reference.abstract_params, reference.logical_axes, mesh, rules
            )
            reference = (reference, ref_shardings)
        self.model, self.mesh, self.param_shardings = model, mesh, param_shardings
        self.tokenizer, self.batch = tokenizer, batch or BatchSpec()
        self.datasets = self._prepare(suite, protocol)
        # A model that claims to keep segments apart is checked once, before its first packed row.
        self._segments_checked = False
        copies = dict(copies or {})
        self.copy_names = tuple(copies)
        self.options = options or StepOptions(reference=reference is not None, copies=len(copies))
        self.scorer = Scorer(
            model, mesh, param_shardings, self.options, reference, tuple(copies.values())
        )
        self.provenance = Provenance.of(
            model, mesh, checkpoint, tokenizer, self.batch, rules, self.options,
            self.scorer.matmul_precision, dtype, attention, bootstrap_samples, seed,
        )  # fmt: skip
        if compile:
            for d in self.datasets:
                for width in sorted(set(d.layout.widths)):
                    self.scorer.compiled(d.layout.batch_size, width, d.layout.max_segments)

    def _prepare(
        self,
        suite: Sequence[Dataset | DatasetSpec | tuple[DatasetSpec, ProtocolSpec]],
        protocol: ProtocolSpec | None,
    ) -> list[Dataset]:
        """The suite's datasets, planned and laid out (prepared ones as given, unpacked for a
        model that does not keep segments apart), each checked against the model and mesh."""
        model, mesh = self.model, self.mesh
        datasets: list[Dataset] = []
        for entry in suite:
            if isinstance(entry, Dataset):
                datasets.append(entry)
                continue
            ds, proto = (
                (entry, protocol or ProtocolSpec()) if isinstance(entry, DatasetSpec) else entry
            )
            if self.tokenizer is None:
                raise ConfigError(no_tokenizer(ds.name))
            check_window(proto.seq_len, model, f"dataset {ds.name!r}: seq_len")
            datasets.append(
                plan_dataset(
                    ds,
                    proto,
                    self.tokenizer,
                    model.vocab_size,
                    self.batch,
                    model.honours_segments,
                    mesh.shape["data"],
                )  # fmt: skip
            )
        for i, d in enumerate(datasets):
            check_batch_size(d.layout.batch_size, mesh)
            if d.layout.max_segments > 1 and not model.honours_segments:  # laid out elsewhere
                layout = plan_layout(
                    d.plan.windows,
                    d.layout.batch_size,
                    pack=False,
                    num_buckets=self.batch.length_buckets,  # as the run's fingerprint says
                )
                datasets[i] = Dataset(d.data, d.protocol, d.plan, layout)
        return datasets

    @property
    def traces(self) -> int:
        return self.scorer.traces

    def score(
        self,
        params: Any,
        dataset: Dataset,
        observers: Sequence[ScoreObserver] = (),
        resume: journal.State | None = None,
    ) -> tuple[metrics.Sums, ScoreTotals]:
        """Scores one dataset.

        Args:
          params: the params (with a reference model, the pair `(params, reference params)`).
          observers: what watches the loop (`ppl_jax.scoring.observers.ScoreObserver`: the
            journal's `Recorder`, a `StopRequest`, a progress bar, the per-token writer, the
            divergence gatherer), in order.
          resume: a journal's state (`Recorder.state`): the loop fills its arrays in place and
            skips its finished batches; None scores every batch into new totals.

        Returns:
          (the sufficient statistics, the per-window sums and timings). If an observer stopped
            the loop, `totals.stopped_at` is set and the sums cover the batches done so far.

        Raises:
          NumericsError: NaN or infinity scored (naming the document and token).
          ConfigError: a model that claims to keep packed windows apart but does not
            (`ppl_jax.evaluation.segments`).
        """
        plan, layout = dataset.plan, dataset.layout
        if layout.max_segments > 1 and not self._segments_checked:
            own = params[0] if self.scorer.paired else params
            with precision.applied(self.scorer.matmul_precision):
                segments.check(self.model, own, self.mesh)
            self._segments_checked = True
        try:
            totals = self.scorer.score(
                params,
                plan.windows,
                layout,
                totals=None if resume is None else _resumed(resume, self.options.positions),
                skip=None if resume is None else resume.batch_done.copy(),
                observers=observers,
            )
        except NonFiniteScores as e:
            raise e.naming(plan.describe_window) from None
        if totals.stopped_at is None and not np.array_equal(
            totals.window_tokens, plan.windows.num_scored()
        ):
            raise AssertionError("the device scored other tokens than the windows' masks hold")
        return sums_of(plan, totals), totals

    def fingerprint(
        self,
        d: Dataset,
        step: int | None,
        protocol_part: Mapping[str, Any] | None = None,
        shared: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        """What decides the numbers of dataset `d` scored at `step` (`Provenance.fingerprint`)."""
        return self.provenance.fingerprint(d, step, protocol_part, shared)

    def __call__(
        self,
        params: Any,
        step: int | None = None,
        sinks: Sequence[Sink] = (),
        reference_params: Any = None,
        *,
        hooks: Hooks | None = None,
    ) -> dict[str, float | None]:
        """The one evaluation loop (`ppl_jax.evaluation.hooks`): scores every dataset with
        `params`, gives each record (`summary.dataset_record`, fingerprint included) and the
        step's averages to `sinks`; writes nothing itself (big_vision's rule: the evaluator
        returns, the caller's sinks write).

        Args:
          params: the model's params, placed with `param_shardings`; None when `hooks` restore
            them (the command line: once a dataset needs scoring, after its journal).
          step: the training step, for the records.
          sinks: where the step's records go (`ppl_jax.outputs.sinks.Sink`: a
            `ResultsStore`'s `StoreSink`, a `TensorBoardSink`, ...): each gets `write` of each
            record as it is made and of the averages, then `end_step`; the caller closes them.
            Give them on process 0 only.
          reference_params: the reference model's params, with a reference model; with copies,
            theirs (a tuple, in order).
          hooks: what the caller adds to the loop (`Hooks`; None: a training loop's).

        Returns:
          `{"<dataset>/<metric>": value}` for every dataset and metric of `metrics.derive`, with
            a reference model `{"<dataset>/kl/<statistic>": value}` (`divergence.Divergence`),
            with copies `{"<dataset>/study/<copy>/<statistic>": value}` (`study.Study`),
            and with several datasets `{"average/<micro|macro|macro/key=value>/<metric>": value}`
            (`ppl_jax.outputs.store.average_records`, Paloma's averages); None where a metric is
            undefined.

        Raises:
          NumericsError, ConfigError: as `score`.
          Interrupted, ConfigError: the hooks' (the command line's stop, a journal of another
            run).
        """
        hooks = hooks or Hooks()
        if params is not None and (reference_params is None) == self.scorer.paired:
            raise ValueError("reference_params are given exactly with a reference model or copies")
        shared, protocol_part = self.provenance.step_part(step), hooks.protocol_part()
        parts = {d.name: self.fingerprint(d, step, protocol_part, shared) for d in self.datasets}
        todo = hooks.todo(step, {n: fingerprint_lib.digest(p) for n, p in parts.items()})
        # Each pair's hooks before any weight is read (a journal of another run is refused now).
        pairs = {d.name: hooks.pair(self, d, step, parts[d.name]) for d in self.datasets if d.name in todo}  # fmt: skip
        if pairs and params is None:
            params, reference_params = hooks.restore(step)
        params_in = params if reference_params is None else (params, reference_params)
        records, kl = self._score_pairs(params_in, step, parts, pairs, sinks)
        stored, write = hooks.step_records(step, records)
        averages = store.average_records(stored) if len(stored) > 1 else []
        for sink in sinks:
            if write:
                sink.write(averages)
            sink.end_step(step, [*stored, *averages])
        return {**flat([*stored, *averages]), **kl}

    def _score_pairs(
        self,
        params: Any,
        step: int | None,
        parts: dict[str, dict[str, Any]],
        pairs: dict[str, PairHooks],
        sinks: Sequence[Sink],
    ) -> tuple[list[dict[str, Any]], dict[str, float]]:
        """Each pair to score, in suite order: its record to every sink as soon as it is made
        (then its hooks drop its journal); returns the records and the KL scalars. Only process
        0 builds a record's `details` (its bootstrap intervals among them): the sinks are given
        there; the others' records hold its metrics, for the scalars returned."""
        records, kl = [], {}
        main = jax.process_index() == 0  # the others' records: no details, no intervals
        for d in (d for d in self.datasets if d.name in pairs):
            ev = self._pair(params, d, step, parts[d.name], pairs[d.name])
            records.append(summary.dataset_record(ev, details=main))
            for sink in sinks:
                sink.write(records[-1:])
            pairs[d.name].written()  # once its record is stored
            found = ev.diagnostics.get("divergence") or {}
            kl.update(
                {f"{d.name}/kl/{k}": v for k, v in found.items() if isinstance(v, (int, float))}
            )
            for copy, part in ((ev.diagnostics.get("study") or {}).get("copies") or {}).items():
                kl.update(
                    {
                        f"{d.name}/study/{copy}/{k}": v
                        for k, v in part.items()
                        if isinstance(v, (int, float))
                    }
                )
        return records, kl

    def _pair(
        self, params: Any, d: Dataset, step: int | None, parts: dict[str, Any], pair: PairHooks
    ) -> Evaluation:
        """One (step, dataset) pair scored under its hooks: their observers, the journal's state
        they resume from, what they add once it is scored (`PairHooks.finish`)."""
        try:
            observers = pair.observers(params)
            sums, totals = self.score(params, d, observers, pair.resume)
            return pair.finish(self.provenance.evaluation(d, step, parts, sums, totals), params)
        except BaseException:
            pair.abort()
            raise


def _resumed(resume: journal.State, positions: int) -> ScoreTotals:
    """The totals a journal's state holds (its arrays, filled in place as the loop goes on)."""
    empty = ScoreTotals.zeros(0, positions)
    return ScoreTotals(
        resume.window_nll,
        resume.window_tokens,
        resume.window_entropy,
        resume.window_correct,
        nll_by_position=empty.nll_by_position,
        tokens_by_position=empty.tokens_by_position,
    )


def sums_of(plan: Plan, totals: ScoreTotals) -> metrics.Sums:
    """A dataset's sufficient statistics: the loop's sums (NLL, tokens, windows, entropy, top-1
    hits) with the plan's counts (bytes, words, documents)."""
    return metrics.Sums(
        nll_sum=totals.nll_sum,
        num_tokens=totals.num_tokens,
        num_bytes=plan.num_bytes,
        num_words=plan.num_words,
        num_documents=plan.num_documents,
        num_windows=totals.num_windows,
        entropy_sum=float(np.sum(totals.window_entropy)),
        num_correct=int(np.sum(totals.window_correct)),
    )


def flat(records: Sequence[Mapping[str, Any]]) -> dict[str, float | None]:
    """`{"<dataset>/<metric>": value}` of dataset records, `{"average/<name>/<metric>": value}`
    of average records."""
    out: dict[str, float | None] = {}
    for r in records:
        prefix = r["dataset"] if r["kind"] == "dataset" else f"average/{r['dataset']}"
        for key, value in r["metrics"].items():
            out[f"{prefix}/{key}"] = value
    return out
