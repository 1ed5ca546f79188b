"""Formats: the files checkpoints are stored in, read (and, for ppl_jax's own saves, written)
without any reader's logic.

Orbax (`orbax`: every Orbax call of ppl_jax, `save_train_state`; `damage` and `checksums` for
damaged steps and weight fingerprints), trees of TensorStore arrays (`tensorstore_tree`),
safetensors directories as Hugging Face writes them (`safetensors`: `Safetensors`, and
`safetensors_ranges`: `RangedSlice`, byte ranges on a bucket), the hub's repositories and cache
(`hub`: `Repo`) and GGUF files (`gguf_file`: `GGUFFile`; `gguf_split`: a split model's parts as
one). The quantization methods of Hugging Face weights are a room of their own,
`ppl_jax.checkpoints.quantized`.
"""

from etils import epy as _epy

with _epy.lazy_api_imports(globals()):
    from ppl_jax.checkpoints.formats.gguf_file import GGUFFile
    from ppl_jax.checkpoints.formats.hub import Repo
    from ppl_jax.checkpoints.formats.orbax import save_train_state
    from ppl_jax.checkpoints.formats.safetensors import Safetensors
    from ppl_jax.checkpoints.formats.safetensors_ranges import RangedSlice

__all__ = [
    "GGUFFile",
    "RangedSlice",
    "Repo",
    "Safetensors",
    "save_train_state",
]
