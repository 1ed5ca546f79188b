"""The device dequantizers of GGML blocks (ppl_jax/checkpoints/quantized/ggml.py) against the
`gguf` package's host dequantization, bit for bit: random blocks of every type in
`DEVICE_TYPES` (their float16 scales finite, some zero, some negative, some subnormal; MXFP4's
E8M0 scale over all 256 exponents), plain, inside a caller's jit with leading dims, op by op,
cast to bfloat16, and every tensor of the committed GGUF goldens (tests/golden/gguf/)."""

from __future__ import annotations

import os

import gguf
import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from ppl_jax.checkpoints.quantized import ggml
from ppl_jax.errors import CheckpointError

import helpers

TYPES = sorted(ggml.DEVICE_TYPES)
# Byte offsets of each type's float16 scales within a block (ggml-common.h `block_*`).
F16_SCALES = {
    "Q4_0": (0,),
    "Q4_1": (0, 2),
    "Q5_0": (0,),
    "Q5_1": (0, 2),
    "Q8_0": (0,),
    "Q2_K": (80, 82),
    "Q3_K": (108,),
    "Q4_K": (0, 2),
    "Q5_K": (0, 2),
    "Q6_K": (208,),
    "TQ2_0": (64,),
    "IQ4_NL": (0,),
    "IQ4_XS": (0,),
}
FLOATS = {"F32": np.float32, "F16": np.float16, "BF16": ml_dtypes.bfloat16}
BLOCKS = 300


def finite_f16_bits(rng: np.random.Generator, n: int) -> np.ndarray:
    """`n` float16 bit patterns, all finite: random magnitudes (subnormals included), a random
    sign, and every fifth +0, -0, the smallest subnormal or the largest float16 in turn."""
    bits = rng.integers(0, 0x7C00, n, dtype=np.uint16) | (rng.integers(0, 2, n, np.uint16) << 15)
    special = np.array([0x0000, 0x8000, 0x0001, 0x7BFF, 0xFBFF], np.uint16)
    bits[::5] = special[np.arange(len(bits[::5])) % len(special)]
    return bits


def blocks(type_name: str, n: int, seed: int = 0) -> np.ndarray:
    """`[n, bytes_per_block]` uint8 of the type: random bytes, the scales finite (see the module
    docstring); the float types random finite values, zeros and negatives among them."""
    rng = np.random.default_rng(seed)
    _, size = ggml.BLOCKS[type_name]
    if type_name in FLOATS:
        values = rng.standard_normal(n) * np.exp2(rng.integers(-20, 10, n))
        values[::7] = 0.0
        return values.astype(FLOATS[type_name]).view(np.uint8).reshape(n, size)
    raw = rng.integers(0, 256, (n, size), dtype=np.uint8)
    for at in F16_SCALES.get(type_name, ()):
        raw[:, at : at + 2] = finite_f16_bits(rng, n).view(np.uint8).reshape(n, 2)
    if type_name == "MXFP4":
        raw[:, 0] = np.arange(n) % 256  # every E8M0 exponent, the subnormal scales 0 and 1 too
    return raw


def reference(raw: np.ndarray, type_name: str) -> np.ndarray:
    """gguf-py's values `[..., values_per_block]` float32 of `raw [..., bytes_per_block]`."""
    values, size = ggml.BLOCKS[type_name]
    with np.errstate(over="ignore"):  # MXFP4's largest scale times 12 is inf
        out = gguf.quants.dequantize(raw.reshape(-1, size), gguf.GGMLQuantizationType[type_name])
    return np.asarray(out, np.float32).reshape(raw.shape[:-1] + (values,))


def assert_bits(got, want: np.ndarray) -> None:
    got = np.asarray(got)
    assert got.dtype == np.float32 and got.shape == want.shape
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))


def test_the_block_sizes_are_the_gguf_packages():
    for kind, size in gguf.GGML_QUANT_SIZES.items():
        assert ggml.BLOCKS[kind.name] == size
    required = "F32 F16 BF16 Q4_0 Q4_1 Q5_0 Q5_1 Q8_0 Q2_K Q3_K Q4_K Q5_K Q6_K MXFP4".split()
    assert set(required) <= ggml.DEVICE_TYPES <= set(ggml.BLOCKS)


@pytest.mark.parametrize("type_name", TYPES)
def test_random_blocks_dequantize_as_the_gguf_package_does(type_name):
    raw = blocks(type_name, BLOCKS)
    want = reference(raw, type_name)
    assert np.isfinite(want).all() or type_name == "MXFP4"  # MXFP4's 2 ** 127 * 12 is inf
    assert_bits(ggml.dequantize(raw, type_name), want)
    # Op by op, unfused: the same bits (no FMA or reordering changes them).
    with jax.disable_jit():
        assert_bits(ggml.dequantize(jnp.asarray(raw[:8]), type_name), want[:8])


@pytest.mark.parametrize("type_name", TYPES)
def test_leading_dims_inside_a_callers_jit(type_name):
    _, size = ggml.BLOCKS[type_name]
    raw = blocks(type_name, 2 * 3 * 5, seed=1).reshape(2, 3, 5, size)

    @jax.jit
    def rows(raw):  # the caller's layer: the blocks of each row dequantized into the row
        return ggml.dequantize(raw, type_name).reshape(2, 3, -1)

    assert_bits(rows(raw), reference(raw, type_name).reshape(2, 3, -1))


@pytest.mark.parametrize("type_name", TYPES)
def test_the_bfloat16_cast_is_the_gguf_values_cast(type_name):
    raw = blocks(type_name, BLOCKS, seed=2)
    got = jax.jit(lambda r: ggml.dequantize(r, type_name).astype(jnp.bfloat16))(raw)
    want = reference(raw, type_name).astype(ml_dtypes.bfloat16)
    np.testing.assert_array_equal(np.asarray(got).view(np.uint16), want.view(np.uint16))


@pytest.mark.parametrize("type_name", ["F16", "BF16"])
def test_every_16_bit_pattern_of_the_float_types_nan_payloads_included(type_name):
    raw = np.arange(1 << 16, dtype=np.uint16).view(np.uint8).reshape(-1, 2)
    assert_bits(ggml.dequantize(raw, type_name), reference(raw, type_name))


def test_random_f32_bytes_nan_payloads_included():
    raw = np.random.default_rng(3).integers(0, 256, (4096, 4), dtype=np.uint8)
    assert_bits(ggml.dequantize(raw, "F32"), reference(raw, "F32"))


def test_a_type_without_a_device_dequantizer_is_refused_by_name():
    assert "IQ2_XXS" not in ggml.DEVICE_TYPES
    with pytest.raises(CheckpointError, match=r"'IQ2_XXS' has no device dequantizer.*host"):
        ggml.dequantize(np.zeros((1, 66), np.uint8), "IQ2_XXS")
    with pytest.raises(CheckpointError, match="'Q9_9'"):
        ggml.dequantize(np.zeros((1, 18), np.uint8), "Q9_9")


def test_blocks_of_the_wrong_size_or_dtype_are_refused():
    with pytest.raises(ValueError, match=r"Q4_K blocks are \[\.\.\., 144\] uint8"):
        ggml.dequantize(np.zeros((2, 145), np.uint8), "Q4_K")
    with pytest.raises(ValueError, match="Q4_0 blocks"):
        ggml.dequantize(np.zeros((2, 18), np.int8), "Q4_0")


def test_every_tensor_of_the_gguf_goldens_dequantizes_as_the_gguf_package_does():
    folder = os.path.join(helpers.GOLDEN, "gguf")
    found: dict[str, list[np.ndarray]] = {}  # the blocks of each type, all files together
    for name in sorted(os.listdir(folder)):
        if not name.endswith(".gguf"):
            continue
        for tensor in gguf.GGUFReader(os.path.join(folder, name)).tensors:
            type_name = tensor.tensor_type.name
            if type_name in ggml.DEVICE_TYPES:
                _, size = ggml.BLOCKS[type_name]
                raw = np.asarray(tensor.data).view(np.uint8).reshape(-1, size)
                found.setdefault(type_name, []).append(raw)
    # Every device type but TQ2_0 (which the goldens do not store) is met.
    assert set(found) == ggml.DEVICE_TYPES - {"TQ2_0"}
    for type_name, parts in found.items():
        raw = np.concatenate(parts)
        assert_bits(ggml.dequantize(raw, type_name), reference(raw, type_name))


@pytest.mark.parametrize("type_name", TYPES)
def test_nothing_bigger_than_the_output_is_built(type_name):
    values, size = ggml.BLOCKS[type_name]
    blocks_ = jax.ShapeDtypeStruct((64, 4096 // values, size), jnp.uint8)
    memory = ggml.dequantize.lower(blocks_, type_name).compile().memory_analysis()
    assert memory.output_size_in_bytes == 64 * 4096 * 4
    assert memory.temp_size_in_bytes <= memory.output_size_in_bytes
