"""Checkpoints: reading a model's architecture, tokenizer, steps and weights.

`open_checkpoint(path, format)` is the one entry point (`opener`); it reads Orbax training states
(`orbax`, where all Orbax calls of ppl_jax live) and Hugging Face directories (`hf`).
"""

from ppl_jax.checkpoints.opener import Checkpoint, open_checkpoint

__all__ = ["Checkpoint", "open_checkpoint"]
