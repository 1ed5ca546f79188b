"""ppl_jax: exact, sharded language-model perplexity in JAX.

The public API (imported on first use, so `import ppl_jax` stays light):

- `open_checkpoint(path) -> Checkpoint`: an Orbax or Hugging Face checkpoint: its architecture
  description, tokenizer, steps, and `restore(step, target)` into target shardings;
  `resolve_architecture(ckpt, step)` its step's architecture, whose `model(dtype)` is the model.
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

from etils import epy as _epy

__version__ = "0.1.0"

# Each name is imported from its subpackage's face on first use; Griffe (the API reference) and
# type checkers read these imports as written.
with _epy.lazy_api_imports(globals()):
    from ppl_jax.checkpoints import Checkpoint, open_checkpoint, resolve_architecture
    from ppl_jax.data import DatasetSpec
    from ppl_jax.errors import (
        CheckpointError,
        ConfigError,
        DataError,
        Interrupted,
        NumericsError,
        PplJaxError,
    )
    from ppl_jax.evaluation import Evaluator
    from ppl_jax.metrics import Sums, derive
    from ppl_jax.models import HiddenStates, LanguageModel, Logits, from_linen, from_nnx
    from ppl_jax.plans import BatchSpec, ProtocolSpec
    from ppl_jax.plans import plan_dataset as prepare
    from ppl_jax.runtime import make_mesh
    from ppl_jax.scoring import StepOptions
    from ppl_jax.tokenizer import load_tokenizer

__all__ = [
    "BatchSpec",
    "Checkpoint",
    "CheckpointError",
    "ConfigError",
    "DataError",
    "DatasetSpec",
    "Evaluator",
    "HiddenStates",
    "Interrupted",
    "LanguageModel",
    "Logits",
    "NumericsError",
    "PplJaxError",
    "ProtocolSpec",
    "StepOptions",
    "Sums",
    "__version__",
    "derive",
    "from_linen",
    "from_nnx",
    "load_tokenizer",
    "make_mesh",
    "open_checkpoint",
    "prepare",
    "resolve_architecture",
]
