"""What every family's module builds on: parameter initialisers that carry logical axis names,
the norms, and the activations by their Hugging Face names.

Every parameter carries its logical axis names in the `logical_axes` metadata of its `nnx.Param`
(`vocab`, `embed`, `heads`, `kv_heads`, `head_dim`, `mlp`, `experts`, `positions`);
`ppl_jax.runtime.mesh` maps them to mesh axes with the table in the config. Norms compute in
float32 and return the input's dtype, as transformers' `*RMSNorm` and `nn.LayerNorm` do.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from flax import nnx

# Hugging Face `ACT2FN` names -> functions. `gelu_new`, `gelu_fast` and `gelu_pytorch_tanh` are
# the tanh approximation of GELU (Hendrycks & Gimpel 2016), `gelu` the exact erf form.
ACTIVATIONS = {
    "silu": jax.nn.silu,
    "swish": jax.nn.silu,
    "gelu_pytorch_tanh": functools.partial(jax.nn.gelu, approximate=True),
    "gelu_new": functools.partial(jax.nn.gelu, approximate=True),
    "gelu_fast": functools.partial(jax.nn.gelu, approximate=True),
    "gelu": functools.partial(jax.nn.gelu, approximate=False),
    "relu": jax.nn.relu,
}


def normal_param(
    rngs: nnx.Rngs, shape: tuple[int, ...], axes: tuple[str, ...], scale: float, dtype: jnp.dtype
) -> nnx.Param:
    """A `shape` param drawn from N(0, scale^2), with `logical_axes=axes` metadata."""
    value = scale * jax.random.normal(rngs.params(), shape, jnp.float32)
    return nnx.Param(value.astype(dtype), logical_axes=axes)


def ones_param(shape: tuple[int, ...], axes: tuple[str, ...], dtype: jnp.dtype) -> nnx.Param:
    """A `shape` param of ones (norm scales), with `logical_axes=axes` metadata."""
    return nnx.Param(jnp.ones(shape, dtype), logical_axes=axes)


def zeros_param(shape: tuple[int, ...], axes: tuple[str, ...], dtype: jnp.dtype) -> nnx.Param:
    """A `shape` param of zeros (biases), with `logical_axes=axes` metadata."""
    return nnx.Param(jnp.zeros(shape, dtype), logical_axes=axes)


def rms_norm(x: jax.Array, weight: jax.Array, eps: float, offset: float = 0.0) -> jax.Array:
    """RMSNorm (Zhang & Sennrich 2019) over the last dim, computed in float32 and scaled by
    `offset + weight` (Gemma's `1 + w` with offset 1), returned in `x.dtype`."""
    x32 = x.astype(jnp.float32)
    y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
    return (y * (weight.astype(jnp.float32) + offset)).astype(x.dtype)


def layer_norm(x: jax.Array, weight: jax.Array, bias: jax.Array, eps: float) -> jax.Array:
    """LayerNorm (Ba et al. 2016) over the last dim, in float32, returned in `x.dtype`."""
    x32 = x.astype(jnp.float32)
    mean = jnp.mean(x32, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(x32 - mean), axis=-1, keepdims=True)
    y = (x32 - mean) * jax.lax.rsqrt(var + eps)
    return (y * weight.astype(jnp.float32) + bias.astype(jnp.float32)).astype(x.dtype)
