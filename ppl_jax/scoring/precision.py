"""The precision of a step's matrix products (`model.matmul_precision`): float32 is float32 on
every backend.

JAX computes a float32 matrix product at the backend's default precision unless told otherwise,
and the default is not float32 everywhere: on NVIDIA GPUs (Ampere and newer) it is TF32, a
10-bit mantissa, and on TPUs one bfloat16 pass; only `jax.lax.Precision.HIGHEST` is float32 on
every backend (JAX's documentation of `jax.lax.Precision` and `jax.default_matmul_precision`).
On CPUs the default is already float32. So a step that computes in float32 runs at `highest`
unless its setting says otherwise, and a bfloat16 step keeps the backend's default.

The precision is applied where the step is traced (`applied`, around `jax.jit(...).lower`):
`jax.default_matmul_precision` sets it for every `dot_general` and convolution traced without
a precision of its own (ppl_jax's models, the vocabulary-blocked NLL, the reference model of
KL, the recurrences' scans: none names one), and it is part of JAX's trace context, so a
compiled step never serves another precision.

Settings and JAX's names for them:

| setting | JAX | what a float32 product is |
| --- | --- | --- |
| `highest` | `Precision.HIGHEST` | float32 on every backend (on a TPU, six bfloat16 passes) |
| `default` | `Precision.DEFAULT` | the backend's default: float32 on CPU, TF32 on NVIDIA GPUs, one bfloat16 pass on TPUs |
| `tensorfloat32` | `Precision.HIGH` | TF32 on NVIDIA GPUs, three bfloat16 passes on TPUs, float32 on CPU |
| `bf16_3x` | `DotAlgorithmPreset.BF16_BF16_F32_X3` | three bfloat16 products summed in float32 on GPUs and TPUs; float32 on CPU (XLA's CPU ignores the algorithm) |
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ppl_jax.errors import ConfigError
from ppl_jax.models.layers import packed

AUTO = "auto"
JAX_NAMES = {  # setting -> the value of `jax.default_matmul_precision`
    "highest": "highest",
    "default": "default",
    "tensorfloat32": "tensorfloat32",
    "bf16_3x": "BF16_BF16_F32_X3",
}
SETTINGS = (AUTO, *JAX_NAMES)


def resolve(setting: str, float32: bool) -> str:
    """The precision a step runs at: `setting`, or for `auto` `highest` where the step computes
    in float32 (`float32`: a model of the step, or its reference, computes in float32, as
    `computes_in_float32` says: most of its float params are float32) and
    `default` where it does not.

    Raises:
      ConfigError: a setting that is not one of `SETTINGS`.
    """
    if setting not in SETTINGS:
        raise ConfigError(
            f"model.matmul_precision={setting!r} is not one of {', '.join(SETTINGS)}."
        )
    if setting == AUTO:
        return "highest" if float32 else "default"
    return setting


def computes_in_float32(*params: Any) -> bool:
    """Whether a model computes in float32: float32 (or a wider float) holds most of the
    floating-point elements of its params (`params`: trees of arrays or `ShapeDtypeStruct`s;
    true if any of the trees given does). A bfloat16 model with a float32 router (Nemotron-H
    keeps one) is a bfloat16 model."""
    for tree in params:
        sizes: dict[bool, int] = {True: 0, False: 0}
        for leaf in packed.leaves(tree):
            dtype = np.dtype(leaf.dtype)
            if jnp.issubdtype(dtype, jnp.floating):  # bfloat16 is not a NumPy floating type
                sizes[dtype.itemsize >= 4] += int(np.prod(leaf.shape))
        if sizes[True] > sizes[False]:
            return True
    return False


@contextlib.contextmanager
def applied(precision: str) -> Iterator[None]:
    """Traces within run at `precision` (a setting other than `auto`): every matrix product
    and convolution traced without a precision of its own (`jax.default_matmul_precision`)."""
    with jax.default_matmul_precision(JAX_NAMES[precision]):
        yield
