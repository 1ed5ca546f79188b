"""Quantized: the quantization of Hugging Face checkpoints (`base`: the `Scheme` of a
`quantization_config`), the parts of each quantized weight (`parts`), and the float weights they
stand for (`dequantizing`: `Dequantized`; `packing`: the formulas). Moved here from `formats/`
unchanged; the next commit makes one module per method.
"""

from etils import epy as _epy

with _epy.lazy_api_imports(globals()):
    from ppl_jax.checkpoints.quantized.base import Scheme
    from ppl_jax.checkpoints.quantized.dequantizing import Dequantized

__all__ = [
    "Dequantized",
    "Scheme",
]
