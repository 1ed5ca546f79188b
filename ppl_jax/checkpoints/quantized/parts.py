"""Which stored tensors of a Hugging Face checkpoint make which quantized weight, checked before
any tensor is read (`view`).

By the method of `config.json`'s `quantization_config` (`ppl_jax.checkpoints.quantized.methods`),
a quantized weight is found by its parts' names, as the format's writer names them (each
method's `parts`, in its module):

- GPTQ: `<m>.qweight`, `<m>.qzeros`, `<m>.scales` and (act-order) `<m>.g_idx`; AWQ: the
  first three -> `<m>.weight [out, in]`;
- compressed-tensors: `<m>.weight_packed`, `<m>.weight_scale`, `<m>.weight_zero_point`,
  `<m>.weight_g_idx`, `<m>.weight_shape` -> `<m>.weight`; `<m>.weight` stored as int8 or
  float8_e4m3fn with `<m>.weight_scale` (and `<m>.weight_zero_point`) -> `<m>.weight`;
- FP8 (DeepSeek-V3): `<x>` stored as float8_e4m3fn with `<x>_scale_inv` -> `<x>`;
- MXFP4 (GPT-OSS): `<x>_blocks` and `<x>_scales` -> `<x>`, `[experts, in, out]`.

Each part's dtype and shape must fit the others' and the configuration's (bits, group size,
block size); a misfit is one sentence naming the stored tensor. Activation scales
(`input_scale`, `activation_scale`, `k_scale`, ...) are dropped: the weights are scored as
dequantized weights, activations in the compute dtype (docs/checkpoints.md).

`Dequantized` is the storage the mapping reads through: a block of a quantized weight (a
device's block of `q_proj` reads its own columns of `qweight`, `scales` and `qzeros`, and its
own rows of `g_idx`) is read as the regions of its parts it needs and dequantized by its
method's `read`, so that each process dequantizes only its own shard, and a quantized weight
never passes through a full-precision copy of the model. The mapping rules, the blocks and the
cast to the model's dtype are the same as for a float checkpoint.
"""

from __future__ import annotations

import re
from collections.abc import Callable

import numpy as np

from ppl_jax.checkpoints.mapping.storage import Storage
from ppl_jax.checkpoints.quantized.base import FLOATS, Finder, Method, Quantized, Scheme, Stored
from ppl_jax.checkpoints.quantized.methods import METHODS
from ppl_jax.errors import CheckpointError

FLOAT_DTYPES = ("F64", *FLOATS)  # what a float checkpoint may store
# Scales of activations, not weights: the release applies them at inference; weight-only
# semantics leave them unread.
ACTIVATION_SCALES = re.compile(
    r".*\.(input_scale|input_zero_point|input_global_scale|output_scale|output_zero_point|"
    r"activation_scale|[kvq]_scale|[kv]_zero_point)"
)
# Stored names only a quantized layout has, for the sentence when config.json names none.
MARKERS = re.compile(r".*(\.qweight|\.weight_packed|_scale_inv|_blocks)")


def view(
    scheme: Scheme | None, storage: Storage, stored: Stored, shown: Callable[[str], str], where: str
) -> tuple[Storage, Stored]:
    """The storage and stored tree the mapping rules read a quantized checkpoint through: each
    quantized weight one float tensor (its Hugging Face name, shape and the dtype its reference
    dequantizes to), read by block through `Dequantized`; its parts and the activation scales
    removed. Unchanged for a checkpoint without quantization.

    Args:
      scheme: `methods.parse` of config.json, or None.
      storage: the checkpoint's storage; stored: its tensors by the rules' names, (shape,
        safetensors dtype name); shown: a rules' name -> the stored name, for sentences.
      where: the checkpoint, for sentences.

    Raises:
      CheckpointError: a part missing or of a dtype or shape that does not fit; a quantized
        layout without quantization_config, or one without any tensor of its layout; a
        weight stored both quantized and not.
    """
    if scheme is None:
        marked = [n for n in stored if MARKERS.fullmatch(n)]
        if marked:
            raise CheckpointError(
                f"{where}: the stored {shown(marked[0])!r} is part of a quantized layout, but "
                f"config.json has no quantization_config; add the quantization_config its "
                f"quantizer wrote (quant_method, bits, group_size, ...)."
            )
        return storage, stored
    method = METHODS[scheme.method]
    found = Finder(scheme, method, stored, shown, where)
    tensors = found.run()
    if not tensors:
        raise CheckpointError(
            f"{where}: config.json's quantization_config names {scheme.method}, but no stored "
            f"tensor is in its layout; if the weights were dequantized, remove "
            f"quantization_config from config.json."
        )
    out = {
        n: v
        for n, v in stored.items()
        if n not in found.used and not ACTIVATION_SCALES.fullmatch(n)
    }
    for name, t in tensors.items():
        if name in out:
            raise CheckpointError(
                f"{where} stores {shown(name)!r} both as it is and quantized; keep one of them."
            )
        out[name] = (t.shape, t.dtype)
    return Dequantized(storage, tensors, method, stored), out


def check_floats(stored: Stored, shown: Callable[[str], str], where: str) -> None:
    """Refuses stored tensors that are neither floats nor part of a quantized weight (in the
    stored tree `view` returns), naming the first.

    Raises:
      CheckpointError: naming the tensor and its dtype.
    """
    other = [n for n, (_, dtype) in stored.items() if dtype not in FLOAT_DTYPES]
    if other:
        raise CheckpointError(
            f"{where} are not all floats: {shown(other[0])!r} is {stored[other[0]][1]}, a tensor "
            f"of no quantized layout of its config.json's quantization_config (the layouts "
            f"ppl_jax reads are in docs/checkpoints.md)."
        )


class Dequantized:
    """A `ppl_jax.checkpoints.mapping.storage.Storage` over another: the quantized weights
    (`Quantized`, by the rules' names) read and dequantized by block (`read`), every other
    tensor read from the storage underneath.

    Attributes:
      storage: the storage underneath; tensors: the quantized weights by the rules' names;
      method: the checkpoint's `Method`, which dequantizes them (`Method.read`); raw: the
      stored tensors underneath (their parts among them), (shape, safetensors dtype name).
    """

    def __init__(
        self, storage: Storage, tensors: dict[str, Quantized], method: Method, raw: Stored
    ):
        self.storage, self.tensors, self.method, self.raw = storage, tensors, method, raw

    def read(self, stored_name: str, index: tuple[slice, ...]) -> np.ndarray:
        """The block `index` of `stored_name`, a quantized weight's dequantized in its
        reference's dtype (`Quantized.dtype`).

        Raises:
          CheckpointError: a part naming what its weight does not hold; as `storage.read`.
        """
        t = self.tensors.get(stored_name)
        if t is None:
            return self.storage.read(stored_name, index)
        index = tuple(index) + (slice(None),) * (len(t.shape) - len(index))
        return self.method.read(t, self.storage, index)
