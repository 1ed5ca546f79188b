"""ppl_jax: exact, sharded language-model perplexity in JAX.

The public API (imported on first use, so `import ppl_jax` stays light):

- `open_checkpoint(path) -> Checkpoint`: an Orbax or Hugging Face checkpoint: its architecture
  (`Checkpoint.model`), tokenizer, steps, and `restore(step, target)` into target shardings.
- `Evaluator(model, mesh, datasets, tokenizer, protocol=, batch=)`: datasets
  planned and compiled once, scored with the params of each call (`evaluator(params, step=)`).
- `DatasetSpec`, `ProtocolSpec`, `BatchSpec`: a corpus, a scoring protocol, a batch layout.
- `prepare`: one dataset read, tokenized, planned and laid out (what `Evaluator` does for each).
- `LanguageModel`, `HiddenStates`, `Logits`, `from_nnx`, `from_linen`: the model interface and
  its adapters (a Flax NNX or Linen module whose `__call__(tokens)` returns logits, or with
  `returns="hidden_states"` hidden states and an `unembedding()`).
- `StepOptions`: what the step gathers beyond its sums (per-token arrays, top-k, positions, KL).
- `load_tokenizer`, `make_mesh`, `Sums`, `derive`: tokenizers, meshes, sums and their metrics.
- the errors: `PplJaxError` and its kinds.
"""

from importlib import import_module
from typing import Any

__version__ = "0.1.0"

_EXPORTS = {
    "Evaluator": "ppl_jax.evaluation.evaluator",
    "DatasetSpec": "ppl_jax.data.spec",
    "ProtocolSpec": "ppl_jax.plans.spec",
    "BatchSpec": "ppl_jax.plans.spec",
    "prepare": "ppl_jax.plans.planner:plan_dataset",
    "LanguageModel": "ppl_jax.models.interface",
    "HiddenStates": "ppl_jax.models.interface",
    "Logits": "ppl_jax.models.interface",
    "from_nnx": "ppl_jax.models.adapters",
    "from_linen": "ppl_jax.models.adapters",
    "open_checkpoint": "ppl_jax.checkpoints.opener",
    "Checkpoint": "ppl_jax.checkpoints.opener",
    "StepOptions": "ppl_jax.scoring.scorer",
    "make_mesh": "ppl_jax.runtime.mesh",
    "Sums": "ppl_jax.metrics.sums",
    "derive": "ppl_jax.metrics.sums",
    "PplJaxError": "ppl_jax.errors",
    "ConfigError": "ppl_jax.errors",
    "DataError": "ppl_jax.errors",
    "CheckpointError": "ppl_jax.errors",
    "NumericsError": "ppl_jax.errors",
    "Interrupted": "ppl_jax.errors",
    "load_tokenizer": "ppl_jax.tokenizer",
}
__all__ = sorted([*_EXPORTS, "__version__"])


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:  # "module" (the same name there) or "module:name"
        module, _, attr = _EXPORTS[name].partition(":")
        return getattr(import_module(module), attr or name)
    raise AttributeError(f"module 'ppl_jax' has no attribute {name!r}")


def __dir__() -> list[str]:
    return __all__
