"""Checkpoints: reading a model's architecture, tokenizer, steps and weights.

`open_checkpoint(path, format)` is the one entry point (`opener`): it picks the reader of the
checkpoint's layout (`opener.READERS`, each a `Checkpoint` subclass found by its markers) and
returns it. The protocol every reader answers is `checkpoint.Checkpoint`'s; a step's
`Architecture` (`resolve_architecture(ckpt, step)`, `architecture.resolve`) builds its model and
chooses its attention, from the checkpoint's own architecture or the one a user gives (`given`).

Four rooms hold the rest: `readers` (one reader per layout), `mapping` (the one mapping
language from stored names to a model's params, read block by block from a storage), `formats`
(the files: Orbax, TensorStore trees, safetensors, the hub, GGUF) and `quantized` (the
quantization methods of Hugging Face weights, one module each, dequantized as they are read).
All Orbax calls of ppl_jax live in `formats.orbax` and `readers.orbax_v1`, Hugging Face's files
in `formats.safetensors` and `formats.hub`.
"""

from etils import epy as _epy

with _epy.lazy_api_imports(globals()):
    from ppl_jax.checkpoints.architecture import Architecture
    from ppl_jax.checkpoints.architecture import resolve as resolve_architecture
    from ppl_jax.checkpoints.opener import DTYPES, FORMATS, READERS, Checkpoint, open_checkpoint

__all__ = [
    "DTYPES",
    "FORMATS",
    "READERS",
    "Architecture",
    "Checkpoint",
    "open_checkpoint",
    "resolve_architecture",
]
