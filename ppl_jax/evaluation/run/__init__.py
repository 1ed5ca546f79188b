"""The command line's run: a `RunSpec` set up before any weight is read (`setup`: checkpoint,
mesh, corpora, tokenizer, plans, the diagnostics' checks, the reference model, into a
`RunSetup`), the checkpoint steps it scores (`steps`: the same on every process), and the one
evaluation loop called at each step with the run's hooks (`hooks`: journals, stop request,
progress, diagnostic passes, restore, files), from `job`'s `run` (the command line's) and
`evaluate` (one step and one dataset, for the library and tests).
"""

from etils import epy as _epy

with _epy.lazy_api_imports(globals()):
    from ppl_jax.evaluation.run.hooks import RunHooks, RunPair
    from ppl_jax.evaluation.run.job import RunResult, evaluate, run
    from ppl_jax.evaluation.run.setup import RunSetup, set_up
    from ppl_jax.evaluation.run.steps import steps_to_score

__all__ = [
    "RunHooks",
    "RunPair",
    "RunResult",
    "RunSetup",
    "evaluate",
    "run",
    "set_up",
    "steps_to_score",
]
