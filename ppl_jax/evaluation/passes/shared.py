"""Every pass of a run over one dataset at one step, each with its progress and its seconds.

A run may do more than its own scoring pass: set itself up (open the checkpoint, tokenize, plan),
restore weights (the step's; the reference model's, once), score every target again with a
short context (`eval.short_context`), run LongPPL's evaluator model (its weights and its two
passes), sweep the context lengths (`eval.context_lengths`), compress the text for the gzip
baseline. `Passes` gives each scoring pass a progress bar of its own, named and started when the
pass starts (so the run's bar is not left at 0 while another pass runs), and adds up the
seconds of each under one key of `results.json`'s `timing` (`KEYS`; docs/outputs.md):

    passes = Passes(progress_factory)
    with passes.timed("short_context_seconds"):
        scorer.score(..., observers=[*observers, passes.bar("short context")(num_windows)])

A key is null in `timing` when its pass did not run for that record. Each side pass scores with
`pass_scorer`: the run's own step (`RunSpec.step_options`), so a context-mesh run's side passes
cross the context axis and chunk their per-token layers as its record says.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Callable, Iterator
from typing import Any

from ppl_jax.evaluation.spec import RunSpec
from ppl_jax.models.interface import LanguageModel
from ppl_jax.outputs import console
from ppl_jax.scoring.scorer import Scorer

KEYS = console.PASSES  # results.json's `timing` keys -> their names in the summary
BarFactory = Callable[[int], Any]  # the windows of a pass -> an observer of its loop


@dataclasses.dataclass
class Passes:
    """The progress bars and seconds of the passes of one (step, dataset) pair.

    Attributes:
      progress_factory: the run's, `(windows, windows done, desc=...) -> observer` (a
        `ppl_jax.outputs.console.ProgressBar`), or None for no bars.
      seconds: `KEYS` -> seconds (float) or None for a pass that did not run.
    """

    progress_factory: Callable[..., Any] | None = None
    seconds: dict[str, float | None] = dataclasses.field(
        default_factory=lambda: dict.fromkeys(KEYS)
    )

    @contextlib.contextmanager
    def timed(self, key: str) -> Iterator[None]:
        """Adds the wall time of the block to `seconds[key]` (also when it raises)."""
        if key not in KEYS:
            raise KeyError(f"{key!r} is not one of {list(KEYS)}")
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[key] = (self.seconds[key] or 0.0) + time.perf_counter() - start

    def bar(self, desc: str) -> BarFactory | None:
        """A factory of the progress bar of the pass named `desc` ("short context"), given its
        windows; None without bars."""
        factory = self.progress_factory
        if factory is None:
            return None
        return lambda num_windows: factory(num_windows, 0, desc=desc)


def pass_scorer(
    model: LanguageModel, mesh: Any, shardings: Any, spec: RunSpec, per_token: bool
) -> Scorer:
    """The scorer of a side pass (the context sweep, the short context, LongPPL's evaluator) of
    `model` on the run's `mesh`: the run's step (`RunSpec.step_options`: its context attention,
    token chunks and matmul precision, as its record says) with its own statistics only: the
    per-token arrays when it gathers NLLs by token (`per_token`), no position sums, top-k or
    reference model."""
    options = dataclasses.replace(
        spec.step_options(), positions=0, per_token=per_token, top_k=0, reference=False
    )
    return Scorer(model, mesh, shardings, options)
