"""`Evaluator`: a suite of datasets, planned and compiled once, scored with new params per call.

What is built once: every dataset read, prepared, tokenized and planned (`ppl_jax.plans.suite`), its
batches laid out, and the scoring step compiled for every batch shape the suite needs (one
compilation per shape, shared by datasets whose shapes agree). Each call scores every dataset
with the params it is given (already placed with `param_shardings`), adds the sums on the host in
float64, and returns the flat metrics; nothing is traced again (`Evaluator.traces`). The command
line's training-run path (`ppl_jax.evaluation.sweep`) scores each checkpoint step through the same object,
so a training loop and the CLI give the same numbers.

```python
evaluator = ppl_jax.Evaluator(model, mesh, param_shardings, [
    {"name": "web", "path": "/data/val/web/*.jsonl", "format": "jsonl", "tags": "domain=web"},
    {"name": "code", "path": "/data/val/code.txt", "seq_len": 2048},
], tokenizer, batch_size=16)
for step in range(...):
    ...
    if step % 1000 == 0:
        scalars = evaluator(params, step=step)   # {"web/bits_per_byte": ..., ...}
```
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from jax.sharding import Mesh

from ppl_jax.evaluation.job import check_batch_size, check_window, score_plan
from ppl_jax.metrics import sums as metrics
from ppl_jax.models.interface import LanguageModel
from ppl_jax.outputs import journal, store
from ppl_jax.plans.suite import Dataset, prepare
from ppl_jax.runtime import preemption
from ppl_jax.scoring.scorer import Scorer, ScoreTotals
from ppl_jax.tokenizer.base import Tokenizer


def suite_settings(
    entries: Sequence[Mapping[str, Any]], **defaults: Any
) -> tuple[tuple[Any, Any], ...]:
    """The checked settings of suite entries given as mappings (the keys of a config file's
    `suite` entry: name, path, format, tags, preparation, budgets, protocol, seq_len, stride,
    add_bos), with `defaults` for `eval.*` keys (`batch_size`, `packing`, `length_buckets`,
    `protocol`, `seq_len`, ...).

    Raises:
      ConfigError: as the command line does for the same suite.
    """
    from ml_collections import config_dict

    from ppl_jax.config.defaults import get_config
    from ppl_jax.config.settings import Settings

    c = get_config()
    for key, value in defaults.items():
        setattr(c.eval, key, value)
    c.suite = tuple(config_dict.ConfigDict(dict(e)) for e in entries)
    return Settings.from_config(c).suite


class Evaluator:
    """Scores a suite of datasets with the params of each call.

    Args:
      model: the model interface (`ppl_jax.models.interface.LanguageModel`).
      mesh: the device mesh; param_shardings: the params' shardings on it.
      suite: the datasets: prepared `suite.Dataset`s, or `(DataSettings, EvalSettings)` pairs,
        or mappings with a config file's suite keys (see `suite_settings`).
      tokenizer: the model's tokenizer (`ppl_jax.tokenizer.base.load`); needed unless `suite` holds
        prepared datasets.
      batch_size, packing, length_buckets: the `eval.*` settings of mappings given as `suite`.
      attention: the model's attention implementation; 'cudnn' lays out one window per row
        (cuDNN takes per-row sequence lengths, not segments).
      compile: compile every batch shape now (else at the first call).
      eval_defaults: other `eval.*` defaults of the mappings (`seq_len`, `stride`, `protocol`,
        `add_bos`), which an entry's own keys override.

    Attributes:
      datasets: the prepared datasets, in suite order.
      traces: how many times the scoring step was traced (once per batch shape).

    Raises:
      ConfigError: a window longer than the model's positions, a batch size the mesh's `data`
        axis does not divide, or a bad suite entry; DataError: a dataset's files.
    """

    def __init__(
        self,
        model: LanguageModel,
        mesh: Mesh,
        param_shardings: Any,
        suite: Sequence[Any],
        tokenizer: Tokenizer | None = None,
        *,
        batch_size: int = 8,
        packing: bool = True,
        length_buckets: int = 1,
        attention: str = "xla",
        compile: bool = True,
        **eval_defaults: Any,
    ):
        self.model, self.mesh, self.param_shardings = model, mesh, param_shardings
        if suite and isinstance(suite[0], Mapping):
            suite = suite_settings(
                suite,
                batch_size=batch_size,
                packing=packing,
                length_buckets=length_buckets,
                **eval_defaults,
            )
        self.datasets: list[Dataset] = []
        for entry in suite:
            if isinstance(entry, Dataset):
                self.datasets.append(entry)
                continue
            if tokenizer is None:
                raise ValueError("Evaluator needs the tokenizer to prepare its datasets")
            ds, ev = entry
            check_window(ev.seq_len, model)
            self.datasets.append(prepare(ds, ev, tokenizer, model.vocab_size, attention))
        for d in self.datasets:
            check_batch_size(d.layout.batch_size, mesh)
        self.scorer = Scorer(model, mesh, param_shardings)
        if compile:
            for d in self.datasets:
                for width in sorted(set(d.layout.widths)):
                    self.scorer.compiled(d.layout.batch_size, width, d.layout.max_segments)

    @property
    def traces(self) -> int:
        return self.scorer.traces

    def score(
        self,
        params: Any,
        dataset: Dataset,
        recorder: journal.Recorder | None = None,
        stop: preemption.StopRequest | None = None,
        progress: Callable[[int, int], None] | None = None,
    ) -> tuple[metrics.Sums, ScoreTotals]:
        """Scores one dataset (see `ppl_jax.evaluation.job.score_plan` for the journal and `stop`)."""
        sums, totals, _ = score_plan(
            self.model,
            params,
            self.mesh,
            self.param_shardings,
            dataset.plan,
            dataset.layout.batch_size,
            progress=progress,
            scorer=self.scorer,
            layout=dataset.layout,
            recorder=recorder,
            stop=stop,
        )
        return sums, totals

    def __call__(
        self,
        params: Any,
        step: int | None = None,
        results: store.ResultsStore | None = None,
        tensorboard: Any = None,
    ) -> dict[str, float | None]:
        """Scores every dataset with `params`.

        Args:
          params: the model's params, placed with `param_shardings`.
          step: the training step, for the records.
          results: a results store (`ppl_jax.outputs.store.ResultsStore`) to append the records to, or
            None; tensorboard: a `ppl_jax.outputs.tensorboard.TensorBoardSink`, or None. Give them on
            process 0 only.

        Returns:
          `{"<dataset>/<metric>": value}` for every dataset and metric of `metrics.derive`, and
          with several datasets `{"average/<micro|macro|macro/key=value>/<metric>": value}`
          (`ppl_jax.outputs.store.average_records`, Paloma's averages); None where a metric is
          undefined.
        """
        records = []
        for d in self.datasets:
            sums, totals = self.score(params, d)
            records.append(
                store.dataset_record(
                    step=step,
                    dataset=d.name,
                    sums=sums,
                    fingerprint="",
                    tags=d.tags,
                    wall_seconds=totals.scoring_seconds,
                )
            )
        averages = store.average_records(records) if len(records) > 1 else []
        if results is not None:
            results.append(records + averages)
        if tensorboard is not None:
            tensorboard.write(records + averages)
        return flat(records + averages)


def flat(records: Sequence[Mapping[str, Any]]) -> dict[str, float | None]:
    """`{"<dataset>/<metric>": value}` of dataset records, `{"average/<name>/<metric>": value}`
    of average records."""
    out: dict[str, float | None] = {}
    for r in records:
        prefix = r["dataset"] if r["kind"] == "dataset" else f"average/{r['dataset']}"
        for key, value in r["metrics"].items():
            out[f"{prefix}/{key}"] = value
    return out
