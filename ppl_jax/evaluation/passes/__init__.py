"""The diagnostic passes of a run beyond its own scoring pass, each on the run's compiled step
(`shared.pass_scorer`) with its progress bar and its seconds (`shared.Passes`): the context-length
sweep (`context_sweep`), the long-context measures' short-context pass and LongPPL's evaluator
(`short_context`), their per-token NLLs, key tokens and measures (`long_context`), the curves'
bootstrap intervals (`intervals`), and what ties them to the run's step (`diagnostics`: the
step's observers, the checks before any weight, what runs before and after the run's pass, the
files).
"""

from etils import epy as _epy

with _epy.lazy_api_imports(globals()):
    from ppl_jax.evaluation.passes.diagnostics import StepObservers
    from ppl_jax.evaluation.passes.long_context import Gather, KeyEvaluator, TokenColumns
    from ppl_jax.evaluation.passes.shared import Passes, pass_scorer

__all__ = [
    "Gather",
    "KeyEvaluator",
    "Passes",
    "StepObservers",
    "TokenColumns",
    "pass_scorer",
]
