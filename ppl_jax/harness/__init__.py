"""ppl_jax as a model of lm-evaluation-harness (`lm_eval --model ppl_jax`; docs/harness.md).

- `model`: `PplJaxLM`, the harness model `ppl_jax` (imports lm_eval), and `evaluate`, a
  training loop's `simple_evaluate` on every process;
- `backend`: `RequestScorer`, tokenized requests as `ppl_jax.plans.requests` plans scored by
  `Evaluator.score` on the mesh (no lm_eval);
- `transport`: each call's arrays from process 0 to every process;
- `arguments`: `--model_args` checked and the checkpoint opened before any weight is read
  (the model, tokenizer and steps from the one `Checkpoint`, as the command line gets them);
- `__main__`: `python -m ppl_jax.harness`, the harness's command line with the model registered.

The names are imported on first use, and nothing outside `ppl_jax.harness` imports this
subpackage, so lm_eval stays an optional extra (`pip install 'ppl_jax[harness]'`).
"""

from etils import epy as _epy

with _epy.lazy_api_imports(globals()):
    from ppl_jax.harness.backend import RequestScorer
    from ppl_jax.harness.model import PplJaxLM, evaluate

__all__ = ["PplJaxLM", "RequestScorer", "evaluate"]
