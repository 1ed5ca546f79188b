"""Evaluation: the library's `Evaluator` (datasets planned and compiled once, scored with
the params of each call, an `Evaluation` each; its hooks, records and provenance), and two rooms
above it: the command line's run (`run`: a `RunSpec`, with its `DiagnosticsSpec` and
`LongContextSpec`, set up into a `RunSetup` by `set_up`: checkpoint, mesh, tokenizer, plans; and
evaluated at each step, `evaluate`) on the diagnostic passes (`passes`: the context sweep, the
short context, LongPPL, the curves' intervals).
"""

from etils import epy as _epy

with _epy.lazy_api_imports(globals()):
    from ppl_jax.evaluation.evaluator import Evaluator
    from ppl_jax.evaluation.result import Evaluation
    from ppl_jax.evaluation.run.job import evaluate
    from ppl_jax.evaluation.run.setup import RunSetup, set_up
    from ppl_jax.evaluation.spec import DiagnosticsSpec, LongContextSpec, RunSpec

__all__ = [
    "DiagnosticsSpec",
    "Evaluation",
    "Evaluator",
    "LongContextSpec",
    "RunSetup",
    "RunSpec",
    "evaluate",
    "set_up",
]
