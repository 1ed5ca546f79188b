"""ppl_jax: exact, sharded language-model perplexity in JAX.

Library entry points: `ppl_jax.Evaluator` (a suite of datasets planned and compiled once, called
with the params of each evaluation interval of a training loop), `ppl_jax.evaluation.job.evaluate`
(the whole command-line job from settings) and `ppl_jax.evaluation.job.score_plan` (one plan, params
already on a mesh).
"""

from typing import Any

__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    if name == "Evaluator":  # imported on first use: `import ppl_jax` stays light
        from ppl_jax.evaluation.evaluator import Evaluator

        return Evaluator
    raise AttributeError(f"module 'ppl_jax' has no attribute {name!r}")
