"""Quantized Hugging Face checkpoints (GPTQ, AWQ, compressed-tensors int4 and FP8, DeepSeek-V3's
block FP8, GPT-OSS's MXFP4) against the goldens tests/golden/make_quant_golden.py writes with the
formats' own libraries: every dequantized weight equals the reference dequantization bit for
bit (whole, and read block by block as devices read it), and the log-probabilities of a model
restored from the quantized folder are transformers' float32 ones on the reference weights
within 1e-5 relative. GPTQ with act-order scores in the default tier, the other layouts in the
slow tier (one compilation each).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ppl_jax.checkpoints import architecture
from ppl_jax.checkpoints.formats import safetensors
from ppl_jax.checkpoints.formats import safetensors_ranges as ranges
from ppl_jax.checkpoints.mapping import storage
from ppl_jax.checkpoints.opener import open_checkpoint
from ppl_jax.checkpoints.quantized import methods, packing
from ppl_jax.checkpoints.quantized import parts as quantized_parts
from ppl_jax.checkpoints.readers import huggingface
from ppl_jax.config.defaults import DEFAULT_RULES
from ppl_jax.models import registry
from ppl_jax.runtime import mesh as mesh_lib
from ppl_jax.scoring.nll import token_nll

import helpers

GOLDEN = os.path.join(helpers.GOLDEN, "quantized")
NAMES = {"float32": "F32", "float16": "F16", "bfloat16": "BF16"}
LAYOUTS = sorted(
    n for n in os.listdir(GOLDEN) if os.path.isdir(os.path.join(GOLDEN, n)) and n != "tensors"
)


@functools.cache
def golden(name: str) -> dict:
    with open(os.path.join(GOLDEN, name, "golden.json"), encoding="utf-8") as f:
        return json.load(f)


def dequantized_view(path: str):
    """(the `Dequantized` storage, the stored tree, the family's prefixes) of a folder."""
    desc = safetensors.read_description(path)
    prefixes, _ = registry.hf_mapping(desc)
    with contextlib.ExitStack() as stack:
        weights = safetensors.Safetensors(path, stack)
        stored = weights.stored(prefixes, False)
        source, stored = quantized_parts.view(
            safetensors.read_quantization(path), weights, stored, weights.real, path
        )
    return source, stored, prefixes


def _short(name: str, prefixes) -> str:
    return next((name[len(p) :] for p in prefixes if name.startswith(p)), name)


def _sha(x: np.ndarray) -> str:
    raw = x.view(np.int16) if x.dtype.name == "bfloat16" else x
    return hashlib.sha256(np.ascontiguousarray(raw).tobytes()).hexdigest()


@pytest.fixture(params=[packing.SLAB, 40], ids=["slab", "small_slabs"])
def slab(request, monkeypatch):
    """Blocks dequantized in one slab, and in slabs of about 40 weights (many per block, cut
    across words, groups and scale blocks)."""
    monkeypatch.setattr(packing, "SLAB", request.param)
    return request.param


@pytest.mark.parametrize("name", LAYOUTS)
def test_dequantized_weights_equal_the_reference_bit_for_bit(name, slab):
    source, stored, prefixes = dequantized_view(os.path.join(GOLDEN, name))
    weights = golden(name)["weights"]
    assert weights and set(map(functools.partial(_short, prefixes=prefixes), weights)) <= set(
        source.tensors
    )
    for real, want in weights.items():
        short = _short(real, prefixes)
        x = source.read(short, ())
        assert (list(x.shape), str(x.dtype)) == (want["shape"], want["dtype"]), real
        assert stored[short] == (tuple(want["shape"]), NAMES[x.dtype.name])
        assert _sha(x) == want["sha256"], real


@pytest.mark.parametrize("name", LAYOUTS)
def test_blocks_read_alone_equal_the_whole(name, slab):
    # Each device reads only its block: boxes of every size and offset (cut across packed
    # words, groups, scale blocks and AWQ's interleaved words) read alone equal the slice.
    source, _, _ = dequantized_view(os.path.join(GOLDEN, name))
    rng = np.random.default_rng(0)
    for short, t in sorted(source.tensors.items())[:6]:
        whole = source.read(short, ())
        for _ in range(12):
            box = []
            for n in t.shape:
                a = int(rng.integers(0, n))
                box.append(slice(a, int(rng.integers(a + 1, n + 1))))
            np.testing.assert_array_equal(source.read(short, tuple(box)), whole[tuple(box)])


@functools.cache
def restored(name: str, dtype=jnp.float32, model_axis: int = 1):
    ckpt = open_checkpoint(os.path.join(GOLDEN, name))
    model = architecture.resolve(ckpt).model(
        dtype="float32" if dtype == jnp.float32 else "bfloat16"
    )
    mesh = mesh_lib.make_mesh(-1, model_axis)
    target, _ = mesh_lib.param_targets(
        model.abstract_params, model.logical_axes, mesh, DEFAULT_RULES
    )
    return model, ckpt.restore(None, target)


def log_probs(model, params, tokens: np.ndarray) -> np.ndarray:
    """`[rows, length - 1]` float64: log-probabilities of each next token."""
    t = jnp.asarray(tokens, jnp.int32)
    positions = jnp.broadcast_to(jnp.arange(t.shape[1] - 1), (t.shape[0], t.shape[1] - 1))
    nll = jax.jit(lambda p, x, pos, y: token_nll(model.apply(p, x, pos, jnp.ones_like(x)), y))(
        params, t[:, :-1], positions, t[:, 1:]
    )
    return -np.asarray(nll, np.float64)


def _tier(name: str):
    return name if name == "gptq_act_order" else pytest.param(name, marks=pytest.mark.slow)


@pytest.mark.parametrize("name", [_tier(n) for n in LAYOUTS])
def test_scores_as_transformers_on_the_dequantized_weights(name):
    g = golden(name)
    model, params = restored(name)
    got = log_probs(model, params, np.asarray(g["tokens"]))
    want = np.asarray(g["log_probs"], np.float64)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    # the sum (a perplexity's numerator) within 1e-5 relative
    assert abs(got.sum() - want.sum()) <= 1e-5 * abs(want.sum())


@pytest.mark.slow
@pytest.mark.parametrize("name", ["gptq_act_order", "gpt_oss_mxfp4"])
def test_model_sharded_reads_give_the_same_weights(name):
    # A model axis of 8 splits every projection: each device's block is dequantized alone.
    _, whole = restored(name)
    _, split = restored(name, model_axis=8)
    for a, b in zip(jax.tree.leaves(whole), jax.tree.leaves(split), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@functools.cache
def tensor_entries() -> dict:
    with open(os.path.join(GOLDEN, "tensors", "tensors.json"), encoding="utf-8") as f:
        return json.load(f)


def entry_view(entry: str):
    """The `Dequantized` storage of one entry of tensors.safetensors (its parts
    `<entry>.<part>`, read by byte ranges), under the entry's quantization_config."""
    folder = os.path.join(GOLDEN, "tensors")
    weights = huggingface.RangedSafetensors(
        folder, ranges.read_header(folder, "tensors.safetensors")
    )
    stored = {k: v for k, v in weights.stored((), False).items() if k.startswith(entry + ".")}
    scheme = methods.parse(tensor_entries()[entry], entry)
    return quantized_parts.view(scheme, weights, stored, weights.real, entry)[0]


@pytest.mark.parametrize("entry", sorted(tensor_entries()))
def test_other_bits_and_strategies_equal_the_reference(entry, slab):
    # GPTQ 2, 3 and 8 bits (v1 and v2, act-order, zero points of 0), one group; compressed-
    # tensors 2, 4 and 8-bit packed per group, channel and tensor, int8 values, FP8 blocks
    # over a ragged edge and per tensor; FP8 with one scale.
    e = tensor_entries()[entry]
    source = entry_view(entry)
    whole = source.read(e["weight"], ())
    assert list(whole.shape) == e["reference"]["shape"]
    assert str(whole.dtype) == e["reference"]["dtype"]
    assert _sha(whole) == e["reference"]["sha256"], entry
    rng = np.random.default_rng(1)
    for _ in range(8):
        box = []
        for n in whole.shape:
            a = int(rng.integers(0, n))
            box.append(slice(a, int(rng.integers(a + 1, n + 1))))
        np.testing.assert_array_equal(source.read(e["weight"], tuple(box)), whole[tuple(box)])


def test_the_quantization_is_recorded_and_part_of_the_checkpoints_identity(tmp_path):
    ckpt = open_checkpoint(os.path.join(GOLDEN, "gptq_act_order"))
    want = {
        "method": "gptq", "format": "gptq", "bits": 4, "type": "int", "group_size": 16,
        "block_size": None, "symmetric": False, "act_order": True, "activation_bits": None,
    }  # fmt: skip
    assert ckpt.quantization(None) == want
    assert ckpt.identity(None)["quantization"] == want
    line = [x for x in ckpt.layout_lines(None) if x.startswith("weights:")][0]
    assert (
        "dequantized as read from gptq 4-bit int, groups of 16, with zero points, act-order" in line
    )
    records = {n: open_checkpoint(os.path.join(GOLDEN, n)).quantization(None) for n in LAYOUTS}
    assert records["deepseek_v3_fp8"]["block_size"] == [16, 16]
    assert (records["gpt_oss_mxfp4"]["bits"], records["gpt_oss_mxfp4"]["group_size"]) == (4, 32)
    assert records["ct_int4"]["format"] == "pack-quantized"
    assert records["awq"]["format"] == "gemm"
    # Float weights: no quantization, and the identity as before (no key).
    plain = open_checkpoint(os.path.join(helpers.GOLDEN, "families", "gpt_oss"))
    assert plain.quantization(None) is None and "quantization" not in plain.identity(None)
    # Another bit width is another fingerprint.
    other = tmp_path / "other"
    shutil.copytree(os.path.join(GOLDEN, "gptq_act_order"), other)
    config = json.loads((other / "config.json").read_text())
    config["quantization_config"]["checkpoint_format"] = "gptq_v2"
    (other / "config.json").write_text(json.dumps(config))
    assert open_checkpoint(str(other)).identity(None)["quantization"]["format"] == "gptq_v2"


def test_zero_points_stored_as_they_are_read_as_the_packed_ones():
    # compressed-tensors before 0.10 stored pack-quantized zero points unpacked, int8 of the
    # scale's shape. The 8-bit packed ones, unpacked byte by byte here, give the same weight.
    entry = "ct_pack8_channel"
    folder = os.path.join(GOLDEN, "tensors")
    weights = huggingface.RangedSafetensors(
        folder, ranges.read_header(folder, "tensors.safetensors")
    )
    stored = {k: v for k, v in weights.stored((), False).items() if k.startswith(entry + ".")}
    arrays = {k: weights.read(k, ()) for k in stored}
    words = arrays[f"{entry}.weight_zero_point"]  # [out / 4, 1] int32
    raw = np.frombuffer(words[:, 0].astype("<u4").tobytes(), np.uint8).astype(np.int16) - 128
    arrays[f"{entry}.weight_zero_point"] = raw.astype(np.int8)[:, None]
    stored[f"{entry}.weight_zero_point"] = (raw[:, None].shape, "I8")
    scheme = methods.parse(tensor_entries()[entry], entry)
    source = quantized_parts.view(scheme, storage.Arrays(arrays), stored, str, entry)[0]
    assert not source.tensors[f"{entry}.weight"].packed_zero
    whole = source.read(f"{entry}.weight", ())
    assert _sha(whole) == tensor_entries()[entry]["reference"]["sha256"]
    np.testing.assert_array_equal(source.read(f"{entry}.weight", (slice(3, 17), slice(5, 40))),
                                  whole[3:17, 5:40])  # fmt: skip
