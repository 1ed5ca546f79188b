"""A Hugging Face checkpoint's quantized weights kept packed on the device
(`checkpoint.dequantize`): one record per output row (`ppl_jax.checkpoints.quantized.rows`),
placed along the float weight's axes and sharded as it is, dequantized inside the layers, equal
bit for bit to the host's dequantization (`Method.read`), on every quantized golden
(tests/golden/quantized/, written by the formats' own libraries)."""

from __future__ import annotations

import json
import os
import shutil

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from ppl_jax.checkpoints import architecture, open_checkpoint
from ppl_jax.checkpoints.formats import safetensors_ranges as ranges
from ppl_jax.checkpoints.quantized import methods, rows
from ppl_jax.checkpoints.quantized import parts as quantized_parts
from ppl_jax.checkpoints.readers import huggingface
from ppl_jax.config.defaults import DEFAULT_RULES, get_config
from ppl_jax.config.settings import from_config
from ppl_jax.errors import CheckpointError
from ppl_jax.evaluation.run import evaluate
from ppl_jax.models.interface import weight_paths
from ppl_jax.models.layers import packed
from ppl_jax.outputs.folder import OutputDir
from ppl_jax.runtime import mesh as mesh_lib
from ppl_jax.scoring.nll import token_nll

import helpers

GOLDEN = os.path.join(helpers.GOLDEN, "quantized")
KINDS = {"awq": "awq-4", "ct_fp8": "compressed-tensors-fp8", "ct_int4": "compressed-tensors-4",
         "deepseek_v3_fp8": "fp8", "gpt_oss_mxfp4": "mxfp4", "gptq_act_order": "gptq-4",
         "gptq_sym": "gptq-4"}  # fmt: skip
LAYOUTS = sorted(
    n for n in os.listdir(GOLDEN) if os.path.isdir(os.path.join(GOLDEN, n)) and n != "tensors"
)
MESHES = {"one": (1, 1), "model_8": (1, 8)}


def test_every_golden_layout_is_covered():
    assert set(LAYOUTS) == set(KINDS)


def _mesh(shape):
    """One device (`one`), or a model axis over the 8 CPU devices."""
    return mesh_lib.make_mesh(*shape, devices=jax.devices()[: shape[0] * shape[1]])


def _restored(path, mesh, setting, dtype="float32"):
    ckpt = open_checkpoint(path, dequantize=setting)
    model = architecture.resolve(ckpt).model(dtype, "xla")
    model, dequantization = architecture.packed(ckpt, None, model, setting)
    target, _ = mesh_lib.param_targets(
        model.abstract_params, model.logical_axes, mesh, DEFAULT_RULES
    )
    return model, ckpt.restore(None, target), dequantization


def _bits(x) -> np.ndarray:
    x = np.asarray(x[...] if packed.is_packed(x) else x)
    return x.view({2: np.uint16, 4: np.uint32}[x.dtype.itemsize])


def _spec(x) -> tuple:
    spec = tuple(x.data.sharding.spec)
    return spec + (None,) * (x.data.ndim - len(spec))


def _packed_spec(leaf, host) -> tuple:
    """The float weight's partition with its merged input axes counted in records: each
    output axis sharded as the float weight's, the records' axis as the float weight's first
    merged axis where the mesh divides the records (else whole), the bytes axis whole."""
    lay, mesh = leaf.layout, host.sharding.mesh
    want = tuple(host.sharding.spec) + (None,) * (len(lay.shape) - len(host.sharding.spec))
    axis = want[lay.axis]
    names = axis if isinstance(axis, tuple) else () if axis is None else (axis,)
    if lay.packed_shape[lay.axis] % int(np.prod([mesh.shape[n] for n in names])):
        axis = None
    return (*want[: lay.axis], axis, *want[lay.axis + lay.span :], None)


def _source(folder: str) -> quantized_parts.Dequantized:
    """The folder's quantized weights (`parts.view`) over its stored tensors."""
    weights = huggingface.RangedSafetensors(folder, ranges.read_header(folder, "model.safetensors"))
    stored = weights.stored(("model.",), False)
    config = json.load(open(os.path.join(folder, "config.json"), encoding="utf-8"))
    scheme = methods.parse(config, folder)
    return quantized_parts.view(scheme, weights, stored, weights.real, folder)[0]


def _parts_bytes(source: quantized_parts.Dequantized) -> int:
    """The stored bytes of every part of every quantized weight of `source`."""
    entries, real = source.storage.entries, source.storage.real
    return sum(
        entries[real(part)].end - entries[real(part)].begin
        for t in source.tensors.values()
        for part in t.parts.values()
    )


@pytest.mark.parametrize("mesh", list(MESHES))
@pytest.mark.parametrize("name", LAYOUTS)
def test_every_packed_weight_dequantizes_on_the_device_as_on_the_host(name, mesh):
    folder = os.path.join(GOLDEN, name)
    for dtype in ("float32", "bfloat16"):
        _, host, none = _restored(folder, _mesh(MESHES[mesh]), "host", dtype)
        model, device, found = _restored(folder, _mesh(MESHES[mesh]), "auto", dtype)
        # Every quantized weight of the goldens is packed.
        assert not none.device and not found.host and set(found.device.values()) == {KINDS[name]}
        flat_host, flat_device = weight_paths(host), weight_paths(device)
        assert flat_host.keys() == flat_device.keys()
        for weight, leaf in flat_device.items():
            if weight in found.device:
                assert packed.is_packed(leaf) and leaf.data.dtype == jnp.uint8, weight
                assert _spec(leaf) == _packed_spec(leaf, flat_host[weight]), weight
            np.testing.assert_array_equal(_bits(leaf), _bits(flat_host[weight]), err_msg=weight)
    # The packed params hold about the stored parts' bytes of those weights (but g_idx): the codes and
    # scales as stored, zero points unpacked to a byte, a scale entry repeated in each record
    # it covers (block FP8's float32 scale per row of a 16x16 block here: 1.3 times the
    # stored bytes; 1.03 times with DeepSeek-V3's 128x128 blocks).
    assert packed.packed_bytes(model.abstract_params) == found.packed_bytes
    stored = _parts_bytes(_source(folder))
    assert 0.9 * stored <= found.packed_bytes <= 1.35 * stored, (found.packed_bytes, stored)
    floats = sum(int(np.prod(flat_host[n].shape)) * 4 for n in found.device)
    assert found.packed_bytes < floats / 2.5


def _nll(folder: str, mesh, setting: str, dtype: str) -> np.ndarray:
    """Each next token's NLL, `[2, seq - 1]` float64, of two of the golden's rows."""
    with open(os.path.join(folder, "golden.json"), encoding="utf-8") as f:
        tokens = np.asarray(json.load(f)["tokens"], np.int32)[:2]
    return _nll_of(folder, mesh, dtype, setting, tokens)


def _nll_of(folder: str, mesh, dtype: str, setting: str, tokens=None) -> np.ndarray:
    model, params, found = _restored(folder, mesh, setting, dtype)
    assert bool(found.device) == (setting == "auto")
    if tokens is None:
        tokens = np.random.default_rng(1).integers(0, 128, (2, 24)).astype(np.int32)
    t = jnp.asarray(tokens)
    positions = jnp.broadcast_to(jnp.arange(t.shape[1] - 1), (t.shape[0], t.shape[1] - 1))
    x, y = t[:, :-1], t[:, 1:]
    out = jax.jit(model.apply)(params, x, positions, jnp.ones_like(x))
    return np.asarray(token_nll(out, y), np.float64)


@pytest.mark.parametrize("mesh", list(MESHES))
@pytest.mark.parametrize("name", LAYOUTS)
def test_the_packed_model_scores_as_the_dequantized_one(name, mesh):
    """Each token's NLL with the weights packed is the host path's, within 1e-6 relative, in
    float32 and bfloat16."""
    folder = os.path.join(GOLDEN, name)
    for dtype in ("float32", "bfloat16"):
        host = _nll(folder, _mesh(MESHES[mesh]), "host", dtype)
        device = _nll(folder, _mesh(MESHES[mesh]), "auto", dtype)
        np.testing.assert_allclose(device, host, rtol=1e-6, atol=0, err_msg=dtype)


# What the goldens are too small to show: records cut along the input axis (chunks), sharded as
# the float weight is, on a GPTQ model of random parts wide enough for 8 records a row.


def _random_gptq(folder: str) -> None:
    """A one-layer Llama of GPTQ parts (4 bits, groups of 32, v1 zero points, the `g_idx` of
    no act-order), random codes, zero points and float16 scales."""
    rng = np.random.default_rng(0)
    with open(os.path.join(GOLDEN, "gptq_sym", "config.json"), encoding="utf-8") as f:
        config = json.load(f)
    config.update(hidden_size=256, intermediate_size=512, num_attention_heads=8,
                  num_key_value_heads=2, head_dim=32, num_hidden_layers=1)  # fmt: skip
    config["quantization_config"].update(group_size=32, sym=False)
    os.makedirs(folder)
    with open(os.path.join(folder, "config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f)
    tensors = {
        "model.embed_tokens.weight": rng.standard_normal((128, 256)).astype(np.float32),
        "model.norm.weight": np.ones(256, np.float32),
        "model.layers.0.input_layernorm.weight": np.ones(256, np.float32),
        "model.layers.0.post_attention_layernorm.weight": np.ones(256, np.float32),
    }
    shapes = {"self_attn.q_proj": (256, 256), "self_attn.k_proj": (64, 256),
              "self_attn.v_proj": (64, 256), "self_attn.o_proj": (256, 256),
              "mlp.gate_proj": (512, 256), "mlp.up_proj": (512, 256),
              "mlp.down_proj": (256, 512)}  # fmt: skip
    for module, (out, width) in shapes.items():
        head = f"model.layers.0.{module}."
        words = rng.integers(0, 1 << 32, (width // 8, out), dtype=np.uint64)
        tensors[head + "qweight"] = words.astype(np.uint32).view(np.int32)
        zeros = rng.integers(0, 1 << 32, (width // 32, out // 8), dtype=np.uint64)
        tensors[head + "qzeros"] = zeros.astype(np.uint32).view(np.int32)
        scales = rng.uniform(0.002, 0.02, (width // 32, out)).astype(np.float16)
        tensors[head + "scales"] = scales
        tensors[head + "g_idx"] = (np.arange(width) // 32).astype(np.int32)
    save_file(tensors, os.path.join(folder, "model.safetensors"))


@pytest.fixture(scope="module")
def wide_gptq(tmp_path_factory) -> str:
    folder = str(tmp_path_factory.mktemp("wide") / "gptq")
    _random_gptq(folder)
    return folder


def test_records_are_cut_along_the_input_axis_and_sharded_as_the_floats(wide_gptq):
    """Row-parallel weights (the output projection `[heads, head_dim, embed]`, the MLP's down
    projection) keep their records sharded over the model axis along their input columns:
    each device holds its own chunks (the GPTQ `g_idx` of no act-order dropped); the weights and each
    token's NLL are the host path's, in bfloat16 too."""
    mesh = mesh_lib.make_mesh(1, 8)
    for dtype in ("float32", "bfloat16"):
        _, host, _ = _restored(wide_gptq, mesh, "host", dtype)
        _, device, found = _restored(wide_gptq, mesh, "auto", dtype)
        assert len(found.device) == 7 and not found.host
        flat_host, flat_device = weight_paths(host), weight_paths(device)
        for name in found.device:
            leaf = flat_device[name]
            assert _spec(leaf) == _packed_spec(leaf, flat_host[name]), name
            np.testing.assert_array_equal(_bits(leaf), _bits(flat_host[name]), err_msg=name)
        for name in ("layers/0/attn/o", "layers/0/mlp/down"):
            leaf = flat_device[name]
            assert leaf.layout.block == 32 * (2 if name.endswith("down") else 1)
            # Each device holds an eighth of the records: its heads', or its input columns'.
            assert leaf.data.addressable_shards[0].data.size * 8 == leaf.data.size, name
            assert not leaf.layout.dequantize.shared  # the g_idx of no act-order, dropped
        assert _nll_of(wide_gptq, mesh, dtype, "auto") == pytest.approx(
            _nll_of(wide_gptq, mesh, dtype, "host"), rel=1e-6, abs=0
        )
