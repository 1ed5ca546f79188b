"""The quantization methods ppl_jax reads (`METHODS`, one module each), and the quantization of a
Hugging Face checkpoint read from `config.json`'s `quantization_config` (`parse`): which method,
its parameters, and the record results.json keeps of it (`Scheme.record`, docs/outputs.md).

ppl_jax reads these methods (`quant_method`), each as transformers 5.24 names it:

- `gptq`: packed `qweight`, `qzeros`, `scales` and `g_idx` (act-order), 2, 3, 4 or 8 bits,
  `checkpoint_format` `gptq` (zero points stored minus one) or `gptq_v2`;
- `awq`: AWQ's GEMM layout (`version` `gemm`), 4 bits;
- `compressed-tensors`: `pack-quantized` (2, 4 or 8-bit integers in int32 words),
  `naive-quantized` and `int-quantized` (int8 values), `float-quantized` (float8_e4m3fn
  values), with scales per tensor, channel, group or block and optional zero points;
- `fp8`: float8_e4m3fn weights with `weight_scale_inv` per block (`weight_block_size`, DeepSeek-V3)
  or per tensor;
- `mxfp4`: GPT-OSS's experts, `*_blocks` (E2M1) and `*_scales` (E8M0) per 32 values.

Any other method (bitsandbytes, HQQ, fbgemm_fp8, ...), or a parameter these layouts do not
have, is refused in one sentence naming it. The weights are dequantized where they are read
(`ppl_jax.checkpoints.quantized.parts`); activations are not quantized (weight-only semantics,
docs/checkpoints.md). A new method is one module (a `Method`) and one entry in `METHODS`.
"""

from __future__ import annotations

from typing import Any

from ppl_jax.checkpoints.quantized import awq, compressed, fp8, gptq, mxfp4
from ppl_jax.checkpoints.quantized.base import Method, Scheme, fail
from ppl_jax.errors import quoted

METHODS: dict[str, Method] = {
    m.name: m for m in (gptq.METHOD, awq.METHOD, compressed.METHOD, fp8.METHOD, mxfp4.METHOD)
}


def parse(config: dict[str, Any], where: str) -> Scheme | None:
    """The quantization `config` (a `config.json` dict) declares, or None.

    Raises:
      CheckpointError: a method ppl_jax does not read, or a parameter outside its layouts
        (`bits` of GPTQ not in 2, 3, 4, 8; a `checkpoint_format` or AWQ `version` other than
        the ones read; an unknown compressed-tensors format or strategy; ...), naming it.
    """
    q = config.get("quantization_config")
    if q is None and isinstance(config.get("text_config"), dict):
        q = config["text_config"].get("quantization_config")
    if not q:
        return None
    if not isinstance(q, dict):
        raise fail(where, f"is {quoted(q, 40)}, not an object")
    method = q.get("quant_method")
    if not isinstance(method, str) or method not in METHODS:  # a list is no key
        raise fail(
            where,
            f"names the method {quoted(method, 40)}, which ppl_jax does not read (it reads "
            f"{', '.join(METHODS)})",
            "give a dequantized (bfloat16 or float32) copy of the model",
        )
    return METHODS[method].parse(q, where)
