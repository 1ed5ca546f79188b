"""Quantized: the quantization methods of Hugging Face checkpoints, one module each, and the
float weights their stored codes and scales stand for.

Each method (`gptq` with `gptq_v2`, `awq`, `compressed` for compressed-tensors, `fp8` for block
FP8, `mxfp4`) is one `Method` in one module: its parsing of `quantization_config` and its
refusals, its parts' names and shapes, and its dequantization of a block on the host; `base`
holds what they share (`Scheme`, `Quantized`, `Finder`) and `packing` the shared formulas
(`unpack`, `grouped`, `expand`, the reading by slabs). `METHODS` maps each `quant_method` to its
method (`methods.parse` picks it); `parts.view` finds a checkpoint's quantized weights and
`Dequantized` is the storage that reads them dequantized. A new method is one module and one
entry in `METHODS` (docs/checkpoints.md, "Adding a quantization method").
"""

from etils import epy as _epy

with _epy.lazy_api_imports(globals()):
    from ppl_jax.checkpoints.quantized.base import Method, Quantized, Scheme
    from ppl_jax.checkpoints.quantized.methods import METHODS
    from ppl_jax.checkpoints.quantized.parts import Dequantized

__all__ = [
    "METHODS",
    "Dequantized",
    "Method",
    "Quantized",
    "Scheme",
]
