"""Quantized weights dequantized on the device (`Method.device_parts`, `Method.out_axes`,
`Method.dequantize_on_device`) against the host's `Method.read`, bit for bit (compared as
integers), eagerly and under `jax.jit`, in the weight's own dtype and cast to float32 and
bfloat16 as a model casts it: every weight of the goldens tests/golden/make_quant_golden.py
writes with the formats' own libraries (and their sha256), a block of output rows and a
permutation of them cut from the parts along `out_axes`, and random parts for what the goldens
lack (GPTQ without `g_idx` and over partial groups and words, AWQ over partial words,
compressed-tensors' `g_idx` and zero points packed or stored, int8 zero points, FP8 blocks cut
by both edges with a leading axis, every MXFP4 scale and code, float16 scales over their whole
range).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from ppl_jax.checkpoints.formats import safetensors
from ppl_jax.checkpoints.formats import safetensors_ranges as ranges
from ppl_jax.checkpoints.mapping import storage
from ppl_jax.checkpoints.quantized import methods, mxfp4, packing
from ppl_jax.checkpoints.quantized import parts as quantized_parts
from ppl_jax.checkpoints.readers import huggingface

import helpers

GOLDEN = os.path.join(helpers.GOLDEN, "quantized")
LAYOUTS = sorted(
    n for n in os.listdir(GOLDEN) if os.path.isdir(os.path.join(GOLDEN, n)) and n != "tensors"
)
NAMES = {np.dtype(np.int8): "I8", np.dtype(np.int32): "I32", np.dtype(np.int64): "I64",
         np.dtype(np.uint8): "U8", np.dtype(np.float16): "F16", np.dtype(np.float32): "F32",
         np.dtype(ml_dtypes.bfloat16): "BF16",
         np.dtype(ml_dtypes.float8_e4m3fn): "F8_E4M3"}  # fmt: skip


def bits_of(x) -> np.ndarray:
    """`x`'s raw bits, as unsigned integers of its width."""
    x = np.asarray(x)
    return x.view(f"u{x.dtype.itemsize}")


def sha(x: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(bits_of(x)).tobytes()).hexdigest()


def full(shape) -> tuple[slice, ...]:
    return tuple(slice(0, n) for n in shape)


def weight_out_axis(t) -> int:
    """The output axis of the dequantized weight in Hugging Face's layout."""
    return len(t.shape) - 1 if t.kind == "mxfp4" else len(t.shape) - 2


# Compiled once per structure: a weight's dequantization depends on its `Quantized` but for
# its parts' names (the layers of a checkpoint share theirs), which keeps the tier fast.
COMPILED: dict = {}


def structure(method, t) -> tuple:
    fields = (getattr(t, f.name) for f in dataclasses.fields(t) if f.name != "parts")
    return (method.name, tuple(sorted(t.parts)), *fields)


def compiled(method, t):
    """`(jit of the dequantization with the casts a model makes of it, jit of it alone,
    whether this structure is new)`."""
    key = structure(method, t)
    new = key not in COMPILED
    if new:

        def cast(parts):
            w = method.dequantize_on_device(t, parts)
            return w, w.astype(jnp.float32), w.astype(jnp.bfloat16)

        COMPILED[key] = (jax.jit(cast), jax.jit(functools.partial(method.dequantize_on_device, t)))
    return (*COMPILED[key], new)


def assert_device_equals_host(source, name: str, t, rng, eager: bool) -> np.ndarray:
    """Device (under jit, with its casts; over blocks of output rows the first time a
    structure is seen; `eager`: also outside jit) == host, bit for bit; the host's
    weight."""
    method = source.method
    with np.errstate(over="ignore"):  # float16 products past 65504 are infinities
        host = method.read(t, source.storage, full(t.shape))
    parts = method.device_parts(t, source.storage)
    axes = method.out_axes(t)
    assert set(axes) <= set(parts), name
    for role, axis in axes.items():
        assert parts[role].shape[axis] == t.shape[weight_out_axis(t)], (name, role)
    on_device = {r: jnp.asarray(v) for r, v in parts.items()}
    cast, alone, new = compiled(method, t)
    got, as_f32, as_bf16 = (np.asarray(x) for x in cast(on_device))
    assert (got.shape, got.dtype) == (host.shape, host.dtype), name
    np.testing.assert_array_equal(bits_of(got), bits_of(host), err_msg=name)
    np.testing.assert_array_equal(bits_of(as_f32), bits_of(host.astype(np.float32)), name)
    np.testing.assert_array_equal(bits_of(as_bf16), bits_of(host.astype(ml_dtypes.bfloat16)), name)
    if new:
        assert_output_blocks(alone, t, parts, axes, host, rng)
    if eager:
        got = np.asarray(method.dequantize_on_device(t, on_device))
        np.testing.assert_array_equal(bits_of(got), bits_of(host), err_msg=name)
    return host


def assert_output_blocks(alone, t, parts, axes, host, rng) -> None:
    """A block of output rows, and a permutation of them, cut from the parts along
    `out_axes`, dequantize to those rows of the host's weight."""
    n, axis = t.shape[weight_out_axis(t)], weight_out_axis(t)
    a = int(rng.integers(0, n))
    for rows in (np.arange(a, int(rng.integers(a + 1, n + 1))), rng.permutation(n)):
        cut = {r: jnp.asarray(np.take(v, rows, axis=axes[r]) if r in axes else v)
               for r, v in parts.items()}  # fmt: skip
        got = np.asarray(alone(cut))
        np.testing.assert_array_equal(bits_of(got), bits_of(np.take(host, rows, axis=axis)))


def folder_view(folder: str, filename: str, scheme):
    weights = huggingface.RangedSafetensors(folder, ranges.read_header(folder, filename))
    return weights, weights.stored((), False), scheme


def view(weights, stored, scheme, where: str):
    return quantized_parts.view(scheme, weights, stored, weights.real, where)[0]


@functools.cache
def tensor_entries() -> dict:
    with open(os.path.join(GOLDEN, "tensors", "tensors.json"), encoding="utf-8") as f:
        return json.load(f)


@pytest.mark.parametrize("name", LAYOUTS)
def test_golden_checkpoints_dequantize_on_the_device_as_on_the_host(name):
    folder = os.path.join(GOLDEN, name)
    weights, stored, _ = folder_view(folder, "model.safetensors", None)
    source = view(weights, stored, safetensors.read_quantization(folder), folder)
    with open(os.path.join(folder, "golden.json"), encoding="utf-8") as f:
        want = json.load(f)["weights"]
    assert source.tensors and set(want) <= set(source.tensors)
    rng = np.random.default_rng(0)
    for i, (short, t) in enumerate(sorted(source.tensors.items())):
        host = assert_device_equals_host(source, short, t, rng, eager=i == 0)
        if short in want:  # the format's own library, through the host's weight
            assert sha(host) == want[short]["sha256"], short


@pytest.mark.parametrize("entry", sorted(tensor_entries()))
def test_other_bits_and_strategies_dequantize_on_the_device_as_on_the_host(entry):
    # GPTQ 2, 3 and 8 bits (v1 and v2, act-order), one group; compressed-tensors 2, 4 and
    # 8-bit packed per group, channel and tensor, int8 and FP8 values (a partial last block).
    e = tensor_entries()[entry]
    weights, stored, _ = folder_view(os.path.join(GOLDEN, "tensors"), "tensors.safetensors", None)
    stored = {k: v for k, v in stored.items() if k.startswith(entry + ".")}
    source = view(weights, stored, methods.parse(e, entry), entry)
    t = source.tensors[e["weight"]]
    host = assert_device_equals_host(source, entry, t, np.random.default_rng(1), eager=True)
    assert sha(host) == e["reference"]["sha256"]


# Random parts, for what the goldens lack.


def random_view(config: dict, arrays: dict[str, np.ndarray]):
    stored = {k: (v.shape, NAMES[v.dtype]) for k, v in arrays.items()}
    scheme = methods.parse({"quantization_config": config}, "random")
    return quantized_parts.view(scheme, storage.Arrays(arrays), stored, str, "random")[0]


def words(rng, *shape) -> np.ndarray:
    return rng.integers(0, 1 << 32, shape, dtype=np.uint64).astype(np.uint32).view(np.int32)


def scales(rng, dtype, *shape) -> np.ndarray:
    """float16 scales from every finite float16 (subnormals, and large ones whose products
    overflow to infinity); bfloat16 and float32 ones of normal magnitude (packing's module
    docstring: XLA on CPU flushes float32 subnormals)."""
    if dtype == np.float16:
        x = rng.integers(0, 1 << 16, shape, dtype=np.uint32).astype(np.uint16).view(np.float16)
        return np.where(np.isfinite(x), x, np.float16(0.5))
    return (rng.standard_normal(shape) * 2.0 ** rng.integers(-30, 10, shape)).astype(dtype)


def check_all(source, rng) -> None:
    assert source.tensors
    for i, (name, t) in enumerate(source.tensors.items()):
        assert_device_equals_host(source, name, t, rng, eager=i == 0)


@pytest.mark.parametrize(
    "bits", [pytest.param(2, marks=pytest.mark.slow), 3, 4, pytest.param(8, marks=pytest.mark.slow)]
)
@pytest.mark.parametrize("fmt", ["gptq", "gptq_v2"])
def test_gptq_random_parts(bits, fmt):
    # Act-order (a g_idx over 40 rows in groups of 16; 64 at 3 bits) with float16 scales, and
    # groups of 24 without one (a partial last group) with bfloat16 or float32 scales; 20
    # output columns (zero points ending inside a word).
    rng = np.random.default_rng(bits)
    out = 20
    for act_order, size, dtype in ((True, 16, np.float16),
                                   (False, 24, ml_dtypes.bfloat16 if fmt == "gptq" else np.float32)):  # fmt: skip
        width = 64 if bits == 3 else 40  # 3 bits: whole runs of 32 codes (3 words)
        stored_width = width if act_order else -(-width * bits // 32) * 32 // bits
        groups = -(-stored_width // size)
        arrays = {
            "m.qweight": words(rng, -(-width * bits // 32), out),
            "m.qzeros": words(rng, groups, -(-out * bits // 32)),
            "m.scales": scales(rng, dtype, groups, out),
        }
        if act_order:
            arrays["m.g_idx"] = rng.permutation(np.arange(width) // size).astype(np.int32)
        config = {"quant_method": "gptq", "bits": bits, "group_size": size, "sym": False,
                  "desc_act": act_order, "checkpoint_format": fmt}  # fmt: skip
        source = random_view(config, arrays)
        (t,) = source.tensors.values()
        assert (t.v1, "g_idx" in t.parts) == (fmt == "gptq", act_order)
        check_all(source, rng)


def test_awq_random_parts():
    # AWQ's order over 20 output columns (a last word half used), 40 rows in groups of 16.
    rng = np.random.default_rng(4)
    width, out, size = 40, 20, 16
    for dtype in (np.float16, ml_dtypes.bfloat16):
        arrays = {
            "m.qweight": words(rng, width, -(-out // 8)),
            "m.qzeros": words(rng, 3, -(-out // 8)),
            "m.scales": scales(rng, dtype, 3, out),
        }
        config = {"quant_method": "awq", "bits": 4, "group_size": size, "version": "gemm"}
        check_all(random_view(config, arrays), rng)


def compressed_config(fmt: str, bits: int, strategy: str, symmetric: bool, kind="int", **more):
    w = {"num_bits": bits, "type": kind, "strategy": strategy, "symmetric": symmetric, **more}
    return {"quant_method": "compressed-tensors", "format": fmt,
            "config_groups": {"group_0": {"targets": ["Linear"], "weights": w}}}  # fmt: skip


PACKED = [(2, "group", "packed"), (4, "group", "packed"), (8, "channel", "packed"),
          (4, "g_idx", "packed"), (2, "g_idx", "stored"), (4, "channel", "stored"),
          (8, "tensor", "stored"), (4, "tensor", "none"), (8, "group", "none"),
          (4, "g_idx", "none"), (2, "channel", "none")]  # fmt: skip


@pytest.mark.parametrize(("bits", "strategy", "zero"), PACKED)
def test_compressed_pack_quantized_random_parts(bits, strategy, zero):
    # Zero points packed along the output axis (20 rows: the last word partly used), stored
    # as they are (int8; int32 at 8 bits), or none; groups of 16 over 40 columns (a partial
    # last group; 48 at 2 bits, whole words), by g_idx, per channel or per tensor.
    rng = np.random.default_rng(bits)
    out, width, size = 20, 48 if bits == 2 else 40, 16
    cols = {"group": -(-width // size), "g_idx": -(-width // size), "channel": 1}.get(strategy)
    scale_shape = (1,) if strategy == "tensor" else (out, cols)
    arrays = {
        "m.weight_packed": words(rng, out, -(-width * bits // 32)),
        "m.weight_scale": scales(rng, ml_dtypes.bfloat16, *scale_shape),
    }
    if strategy == "g_idx":
        arrays["m.weight_g_idx"] = rng.permutation(np.arange(width) // size).astype(np.int32)
    if zero == "packed":
        arrays["m.weight_zero_point"] = words(rng, -(-out * bits // 32), cols)
    elif zero == "stored":
        half = 1 << (bits - 1)
        z = rng.integers(-half, half, scale_shape)
        arrays["m.weight_zero_point"] = z.astype(np.int8 if bits < 8 else np.int32)
    config = compressed_config(
        "pack-quantized", bits, "group" if strategy == "g_idx" else strategy, zero == "none",
        group_size=size if strategy in ("group", "g_idx") else None,
    )  # fmt: skip
    source = random_view(config, arrays)
    (t,) = source.tensors.values()
    assert t.packed_zero == (zero == "packed") and ("g_idx" in t.parts) == (strategy == "g_idx")
    check_all(source, rng)


def fp8_codes(rng, *shape) -> np.ndarray:
    """Every float8_e4m3fn but NaN (0x7F, 0xFF), at random."""
    x = rng.integers(0, 254, shape).astype(np.uint8)
    return (x + (x >= 0x7F)).view(ml_dtypes.float8_e4m3fn)


SCALED = [("int8", "block", np.int8), ("int8", "channel", None), ("int8", "group", np.int32),
          ("int8", "tensor", np.int8), ("fp8", "block", None), ("fp8", "channel", None),
          ("fp8", "group", None), ("fp8", "tensor", None)]  # fmt: skip


@pytest.mark.parametrize(("values", "strategy", "zero"), SCALED)
def test_compressed_scaled_random_parts(values, strategy, zero):
    # int8 or float8 values, scales per 16x16 block cut by both edges (40 x 44), channel,
    # group or tensor; int8 ones with zero points (int8 and int32) or not, float8 ones without.
    rng = np.random.default_rng(5)
    out, width = 40, 44
    shape = {"block": (3, 3), "channel": (out, 1), "group": (out, 3), "tensor": ()}[strategy]
    v = fp8_codes(rng, out, width) if values == "fp8" else (
        rng.integers(-128, 128, (out, width)).astype(np.int8))  # fmt: skip
    arrays = {"m.weight": v, "m.weight_scale": scales(rng, ml_dtypes.bfloat16, *shape)}
    if zero is not None:
        arrays["m.weight_zero_point"] = np.asarray(rng.integers(-128, 128, shape)).astype(zero)
    config = compressed_config(
        "float-quantized" if values == "fp8" else "int-quantized", 8, strategy, zero is None,
        kind="float" if values == "fp8" else "int",
        group_size=16 if strategy == "group" else None,
        block_structure=[16, 16] if strategy == "block" else None,
    )  # fmt: skip
    check_all(random_view(config, arrays), rng)


@pytest.mark.parametrize("block", [[16, 16], [8, 32], None])
def test_fp8_random_parts(block):
    # DeepSeek's block FP8 with a leading axis, blocks cut by both edges (40 x 44), or one
    # scale per tensor; float32 scales.
    rng = np.random.default_rng(6)
    shape = (2, 40, 44)
    scale = (
        () if block is None
        else shape[:1] + tuple(-(-n // b) for n, b in zip(shape[1:], block, strict=True))
    )  # fmt: skip
    arrays = {"x": fp8_codes(rng, *shape), "x_scale_inv": scales(rng, np.float32, *scale)}
    config = {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": block}
    check_all(random_view(config, arrays), rng)


def test_mxfp4_every_scale_and_code():
    # Each of the 256 E8M0 scales (0 and 1 make subnormals, 254 and 255 overflow) over a block
    # holding every E2M1 code in both nibbles, against the host's np.ldexp.
    rng = np.random.default_rng(7)
    k = np.arange(16, dtype=np.uint8)
    blocks = np.broadcast_to(k | ((15 - k) << 4), (1, 16, 16, 16))
    arrays = {"e.w_blocks": np.ascontiguousarray(blocks),
              "e.w_scales": rng.permutation(256).astype(np.uint8).reshape(1, 16, 16)}  # fmt: skip
    source = random_view({"quant_method": "mxfp4"}, arrays)
    check_all(source, rng)
    with np.errstate(over="ignore"):
        host = source.read("e.w", ())
    assert np.isinf(host).any() and (np.abs(host[host != 0]) < np.finfo(np.float32).tiny).any()


def test_ldexp_bits_is_numpys_ldexp_on_every_exponent():
    # Independent of the E2M1 table: random normal floats (and zeros) and exponents that take
    # them to subnormals (ties included), zero and infinity.
    rng = np.random.default_rng(8)
    x = (rng.standard_normal(4096) * 2.0 ** rng.integers(-60, 60, 4096)).astype(np.float32)
    x[:64] = 0.0
    x[64:128] = -0.0
    x[128:256] = np.float32(1.5) * 2.0 ** rng.integers(-3, 3, 128)  # ties when shifted
    exp = rng.integers(-300, 300, 4096).astype(np.int32)
    got = jax.jit(mxfp4.ldexp_bits)(jnp.asarray(x.view(np.uint32)), jnp.asarray(exp))
    with np.errstate(over="ignore"):
        want = np.ldexp(x, exp)
    np.testing.assert_array_equal(np.asarray(got), want.view(np.uint32))


@pytest.mark.parametrize("bits", [2, 4, 8])
def test_pack_is_unpacks_inverse(bits):
    # packing.pack (AWQ's repack for the device) along either axis, a last word part used.
    rng = np.random.default_rng(bits)
    for axis in (0, 1):
        codes = rng.integers(0, 1 << bits, (37, 5) if axis == 0 else (5, 37)).astype(np.uint8)
        words = packing.pack(codes, bits, axis)
        assert words.dtype == np.uint32 and words.shape[axis] == -(-37 * bits // 32)
        back = packing.unpack(words, bits, axis)
        np.testing.assert_array_equal(np.take(back, np.arange(37), axis=axis), codes)
        np.testing.assert_array_equal(np.take(back, np.arange(37, back.shape[axis]), axis=axis), 0)
