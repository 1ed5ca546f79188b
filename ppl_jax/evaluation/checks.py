"""The checks of a run's windows, batch and context axis against its model and mesh, made before
any weight is read (the setup's, the evaluator's, the harness's)."""

from __future__ import annotations

from typing import Any

from jax.sharding import Mesh

from ppl_jax.errors import ConfigError
from ppl_jax.models import registry
from ppl_jax.models.interface import LanguageModel
from ppl_jax.scoring import scorer as scorer_lib


def check_window(seq_len: int, model: LanguageModel, where: str = "eval.seq_len") -> None:
    """Raises ConfigError if `seq_len` exceeds the model's positions."""
    if seq_len > model.max_positions:
        raise ConfigError(
            f"{where}={seq_len} is beyond the model's {model.max_positions} positions; "
            f"set --config.eval.seq_len={model.max_positions} or less."
        )


def check_batch_size(batch_size: int, mesh: Mesh) -> None:
    """Raises ConfigError if `batch_size` is not a multiple of the mesh's `data` axis."""
    data_size = mesh.shape["data"]
    if batch_size % data_size:
        raise ConfigError(
            f"eval.batch_size={batch_size} is not divisible by the mesh's data axis "
            f"({data_size}); use a multiple of {data_size}."
        )


def check_context(model: LanguageModel, mesh: Any, what: str = "the model") -> None:
    """`scorer.check_context`, with the reason of a family whose `Limit("context")` refuses
    this description (`registry.context_refusal`), before any weight is read.

    Raises:
      ConfigError: `mesh.context > 1` for a model that cannot run under it.
    """
    n = int(dict(mesh.shape).get("context", 1))
    family = model.description.get("family") if isinstance(model.description, dict) else None
    reason = registry.context_refusal(model.description) if n > 1 and family else None
    if reason and not model.context_parallel:
        raise ConfigError(
            f"mesh.context={n} is refused for {what} (family {family!r}): {reason}; set "
            f"mesh.context=1."
        )
    scorer_lib.check_context(model, mesh, what)


def no_tokenizer(dataset: str) -> str:
    """The sentence for an `Evaluator` given no tokenizer (`Checkpoint.tokenizer()` is None for a
    checkpoint that carries none) and a dataset to tokenize."""
    return (
        f"dataset {dataset!r}: the Evaluator has no tokenizer to prepare it with (the checkpoint "
        f"carries none, so ckpt.tokenizer() returned None); pass "
        f"tokenizer=ppl_jax.load_tokenizer(PATH) with a tokenizer.json, a SentencePiece .model, "
        f"a folder holding one, or 'byte' (the command line's data.tokenizer)."
    )
