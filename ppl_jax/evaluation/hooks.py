"""What a caller adds to the one evaluation loop (`ppl_jax.evaluation.evaluator.Evaluator`'s
`__call__`): `Hooks` for a step, `PairHooks` for each (step, dataset) pair.

The loop is the same for a training loop and the command line:

    for each dataset: its fingerprint (`Evaluator.fingerprint`)
    todo  = hooks.todo(step, digests)              # the datasets to score at this step
    pairs = hooks.pair(d, step, fingerprint)       # each pair's hooks (a journal: before weights)
    params = params or hooks.restore(step)         # only once a pair needs them
    for each pair: observers -> score (resumed from `pair.resume`) -> pair.finish(evaluation)
                   -> record (`summary.dataset_record`) -> sinks -> pair.written()
    records, write = hooks.step_records(step, records)   # the step's records to average
    averages -> sinks (when `write`); every sink's `end_step`

These defaults are a training loop's: every dataset scored with the params it is given, the KL
to a reference model gathered (`ppl_jax.metrics.divergence`), each dataset timed on its own
(`DefaultPair`), nothing else added. The command line's hooks
(`ppl_jax.evaluation.run.hooks.RunHooks`) add its journals, stop request, progress bars,
diagnostics, restore and files, and skip a pair stored with the same fingerprint.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ppl_jax.evaluation.result import Evaluation
from ppl_jax.metrics import divergence, study
from ppl_jax.outputs import journal
from ppl_jax.plans.planner import Dataset
from ppl_jax.scoring.observers import ScoreObserver

if TYPE_CHECKING:
    from ppl_jax.evaluation.evaluator import Evaluator

Record = Mapping[str, Any]


class PairHooks:
    """One (step, dataset) pair's hooks: the loop's observers, a journal's state to resume
    from, and what the pair adds to its `Evaluation` once scored. The base holds nothing and adds
    nothing (a subclass need not call its `__init__`); a training loop's pair is `DefaultPair`.
    """

    @property
    def resume(self) -> journal.State | None:
        """A journal's state to resume from (`Evaluator.score`'s `resume`), or None."""
        return None

    def observers(self, params: Any) -> Sequence[ScoreObserver]:
        """The observers of the pair's scoring loop, given the params it is scored with (the
        command line runs its passes before the pair's here: short context, LongPPL)."""
        return []

    def finish(self, ev: Evaluation, params: Any) -> Evaluation:
        """The pair's evaluation, with what the hooks add (diagnostics, timings, files).

        Raises:
          Interrupted: the command line's, when a signal stopped the pair.
        """
        return ev

    def written(self) -> None:
        """The pair's record is in every sink (the command line drops its journal)."""

    def abort(self) -> None:
        """The pair failed or was stopped: remove what it left half written."""


class DefaultPair(PairHooks):
    """A training loop's pair (`Hooks.pair`): gathers the KL of a reference model (when the
    evaluator has one) into `diagnostics["divergence"]`, a study's copies (when it has them)
    into `diagnostics["study"]`, and sets `wall_seconds` to the pair's own seconds, from its
    observers (the start of its scoring) to its evaluation."""

    def __init__(self, evaluator: Evaluator, d: Dataset):
        self.started: float | None = None
        self.divergence = self.study = None
        self.intervals = (evaluator.provenance.bootstrap_samples, evaluator.provenance.seed)
        if evaluator.scorer.reference is not None:
            self.divergence = divergence.Divergence(d.plan.describe_window)
        if evaluator.copy_names:
            self.study = study.Study(
                evaluator.copy_names,
                d.plan.windows.num_windows,
                evaluator.options.both_directions,
                lambda w, p: f"{d.plan.describe_window(w)}, row position {p}",
            )

    def observers(self, params: Any) -> Sequence[ScoreObserver]:
        self.started = time.perf_counter()
        return [o for o in (self.divergence, self.study) if o is not None]

    def finish(self, ev: Evaluation, params: Any) -> Evaluation:
        if self.divergence is not None:
            ev.diagnostics["divergence"] = self.divergence.summary()
        if self.study is not None:
            ev.diagnostics["study"] = self.study.summary(ev.plan, *self.intervals)
        ev.wall_seconds = time.perf_counter() - self.started
        return ev


class Hooks:
    """A step's hooks (see the module docstring): the defaults score every dataset with the
    params given and average this call's records."""

    def protocol_part(self) -> dict[str, Any]:
        """What the fingerprint's `protocol` part holds beyond the dataset's own (the command
        line's long-context measures); {} by default."""
        return {}

    def todo(self, step: int | None, digests: Mapping[str, str]) -> set[str]:
        """The names of the datasets to score at `step`, given each one's fingerprint digest."""
        return set(digests)

    def pair(
        self, evaluator: Evaluator, d: Dataset, step: int | None, parts: dict[str, Any]
    ) -> PairHooks:
        """The hooks of the pair (dataset `d` at `step`, its fingerprint `parts`), made before
        any weight is read.

        Raises:
          ConfigError: the command line's, for a journal of another run.
        """
        return DefaultPair(evaluator, d)

    def restore(self, step: int | None) -> tuple[Any, Any]:
        """(the step's params, the reference model's or None), when the call was given none."""
        raise ValueError("the evaluator was called without params and its hooks restore none")

    def step_records(
        self, step: int | None, records: list[dict[str, Any]]
    ) -> tuple[list[Record], bool]:
        """(the step's dataset records to average, whether to write the averages): this call's
        records, written."""
        return records, True
