"""A Hugging Face checkpoint's quantized weights kept packed on the device
(`checkpoint.dequantize`): one record per output row (`ppl_jax.checkpoints.quantized.rows`),
placed along the float weight's axes and sharded as it is, dequantized inside the layers, equal
bit for bit to the host's dequantization (`Method.read`), on every quantized golden
(tests/golden/quantized/, written by the formats' own libraries)."""

from __future__ import annotations

import functools
import json
import os
import re
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from ppl_jax.checkpoints import architecture, mapping, open_checkpoint
from ppl_jax.checkpoints.formats import safetensors_ranges as ranges
from ppl_jax.checkpoints.mapping import storage
from ppl_jax.checkpoints.quantized import base as quantized_base
from ppl_jax.checkpoints.quantized import methods, rows
from ppl_jax.checkpoints.quantized import parts as quantized_parts
from ppl_jax.checkpoints.readers import huggingface
from ppl_jax.config.defaults import DEFAULT_RULES
from ppl_jax.errors import CheckpointError
from ppl_jax.models.interface import weight_paths
from ppl_jax.models.layers import packed
from ppl_jax.runtime import mesh as mesh_lib
from ppl_jax.scoring.nll import token_nll
from ppl_jax.scoring.scorer import Scorer

import helpers
from helpers import bits, restored_packed

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


def _sharded_tier(name: str, mesh: str):
    # The default tier: DeepSeek-V3's blocks over the model axis (whole blocks on every device,
    # the float weight's sharding); GPTQ's and MXFP4's there are scored in the default tier
    # (`test_the_packed_model_scores_as_the_dequantized_one`, test_quantized_device.py).
    fast = (name, mesh) == ("deepseek_v3_fp8", "model_8")
    return pytest.param(name, mesh, marks=() if fast else pytest.mark.slow)


@pytest.mark.parametrize(("name", "mesh"), [_sharded_tier(n, m) for n in LAYOUTS for m in MESHES])
def test_every_packed_weight_dequantizes_on_the_device_as_on_the_host(name, mesh):
    folder = os.path.join(GOLDEN, name)
    for dtype in ("float32", "bfloat16"):
        _, host, none = restored_packed(folder, _mesh(MESHES[mesh]), "host", dtype)
        model, device, found = restored_packed(folder, _mesh(MESHES[mesh]), "auto", dtype)
        # Every quantized weight of the goldens is packed.
        assert not none.device and not found.host and set(found.device.values()) == {KINDS[name]}
        flat_host, flat_device = weight_paths(host), weight_paths(device)
        assert flat_host.keys() == flat_device.keys()
        for weight, leaf in flat_device.items():
            if weight in found.device:
                assert packed.is_packed(leaf) and leaf.data.dtype == jnp.uint8, weight
                assert _spec(leaf) == _packed_spec(leaf, flat_host[weight]), weight
            np.testing.assert_array_equal(bits(leaf), bits(flat_host[weight]), err_msg=weight)
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
    model, params, found = restored_packed(folder, mesh, setting, dtype)
    assert bool(found.device) == (setting == "auto")
    if tokens is None:
        tokens = np.random.default_rng(1).integers(0, 128, (2, 24)).astype(np.int32)
    t = jnp.asarray(tokens)
    positions = jnp.broadcast_to(jnp.arange(t.shape[1] - 1), (t.shape[0], t.shape[1] - 1))
    x, y = t[:, :-1], t[:, 1:]
    out = jax.jit(model.apply)(params, x, positions, jnp.ones_like(x))
    return np.asarray(token_nll(out, y), np.float64)


def _scoring_tier(name: str, mesh: str):
    fast = (name, mesh) == ("gptq_act_order", "model_8")
    return pytest.param(name, mesh, marks=() if fast else pytest.mark.slow)


@pytest.mark.parametrize(("name", "mesh"), [_scoring_tier(n, m) for n in LAYOUTS for m in MESHES])
def test_the_packed_model_scores_as_the_dequantized_one(name, mesh):
    """Each token's NLL with the weights packed is the host path's, within 1e-6 relative, in
    float32 and bfloat16 (equal on CPU), DeepSeek-V3's experts over a model axis of 8 included:
    their blocks are whole on every device there (16 columns in one FP8 block), and the
    dequantized weights take the float weights' sharding, so XLA splits their products as it
    does the host's."""
    folder = os.path.join(GOLDEN, name)
    for dtype in ("float32", "bfloat16"):
        host = _nll(folder, _mesh(MESHES[mesh]), "host", dtype)
        device = _nll(folder, _mesh(MESHES[mesh]), "auto", dtype)
        np.testing.assert_allclose(device, host, rtol=1e-6, atol=0, err_msg=dtype)


def test_blocks_whole_on_every_device_dequantize_into_the_float_weights_sharding():
    # DeepSeek-V3's expert `down [experts, mlp 16, embed]`: one 16-column FP8 block along `mlp`,
    # which the model axis of 8 cannot split, so the blocks are whole on every device; the
    # dequantized weight (in the step, and in the `Scorer`'s abstract params) is split along
    # `mlp` as the host's float weight is.
    folder, mesh = os.path.join(GOLDEN, "deepseek_v3_fp8"), _mesh(MESHES["model_8"])
    _, host, _ = restored_packed(folder, mesh, "host", "bfloat16")
    model, device, _ = restored_packed(folder, mesh, "auto", "bfloat16")
    want, leaf = weight_paths(host)["layers/1/mlp/down"], weight_paths(device)["layers/1/mlp/down"]
    assert _spec(leaf) == (None,) * 4 and tuple(want.sharding.spec) == (None, "model", None)
    value = jax.jit(lambda p: p[...])(leaf)
    assert value.sharding.is_equivalent_to(want.sharding, value.ndim)
    np.testing.assert_array_equal(bits(value), bits(want))
    assert leaf.layout.sharding == want.sharding
    _, shardings = mesh_lib.param_targets(
        model.abstract_params, model.logical_axes, mesh, DEFAULT_RULES, jnp.bfloat16
    )
    abstract = weight_paths(Scorer(model, mesh, shardings)._abstract_params()[1])
    assert abstract["layers/1/mlp/down"].layout.sharding == want.sharding


def _collectives(leaf) -> list[str]:
    """The collectives of the compiled dequantization of the packed weight `leaf`."""
    text = jax.jit(lambda p: p[...]).lower(leaf).compile().as_text()
    return re.findall(r"(all-gather|all-reduce|collective-permute|all-to-all)(?:-start)?\(", text)


def test_records_sharded_over_the_mesh_dequantize_where_they_lie():
    # Every weight whose records the model axis splits (the experts' `gate`, `up [experts, 1
    # record, mlp, bytes]` split along `mlp`; the dense ones'): no collective, each device
    # dequantizes its own records only.
    folder, mesh = os.path.join(GOLDEN, "deepseek_v3_fp8"), _mesh(MESHES["model_8"])
    _, device, found = restored_packed(folder, mesh, "auto", "bfloat16")
    sharded = [n for n in found.device if any(_spec(weight_paths(device)[n]))]
    assert {"layers/1/mlp/gate", "layers/1/mlp/up", "layers/0/mlp/gate"} <= set(sharded)
    for name in sharded:
        assert _collectives(weight_paths(device)[name]) == [], name


@pytest.mark.slow  # 14 s: the MoE golden scored twice on 8 devices
def test_a_run_over_a_model_axis_scores_packed_experts_as_the_host(tmp_path):
    # The `Scorer`'s step (not the model's apply), bfloat16, DeepSeek-V3's experts over 8.
    def configure(c):
        c.model.dtype, c.mesh.data, c.mesh.model = "bfloat16", 1, 8

    folder = os.path.join(GOLDEN, "deepseek_v3_fp8")
    runs = helpers.host_and_packed_runs(tmp_path, folder, configure)
    assert runs["auto"]["nll_sum"] == runs["host"]["nll_sum"]


@pytest.mark.parametrize(
    "name",  # the default tier: compressed-tensors' words, cut (act-order GPTQ is not: g_idx)
    [n if n == "ct_int4" else pytest.param(n, marks=pytest.mark.slow) for n in LAYOUTS],
)
def test_weights_cut_in_chunks_dequantize_as_on_the_host(name, monkeypatch):
    # The goldens' narrow weights, cut in records of fewer columns than the default allows
    # (AWQ's, compressed-tensors' and GPTQ's words, block FP8, MXFP4 blocks).
    monkeypatch.setattr(rows, "SHARDS", 1)
    folder = os.path.join(GOLDEN, name)
    _, host, _ = restored_packed(folder, _mesh(MESHES["one"]), "host")
    _, device, found = restored_packed(folder, _mesh(MESHES["one"]), "auto")
    flat_host, flat_device = weight_paths(host), weight_paths(device)
    cut = [
        n
        for n in found.device
        if flat_device[n].layout.block < flat_device[n].layout.dequantize.width
    ]
    assert cut or name in ("gptq_act_order", "gpt_oss_mxfp4")  # g_idx; one MXFP4 block wide
    for weight in found.device:
        leaf = flat_device[weight]
        np.testing.assert_array_equal(bits(leaf), bits(flat_host[weight]), err_msg=weight)


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


@pytest.mark.slow  # 25 s: a wide GPTQ model scored on 8 devices
def test_records_are_cut_along_the_input_axis_and_sharded_as_the_floats(wide_gptq):
    """Row-parallel weights (the output projection `[heads, head_dim, embed]`, the MLP's down
    projection) keep their records sharded over the model axis along their input columns:
    each device holds its own chunks (the GPTQ `g_idx` of no act-order dropped); the weights and each
    token's NLL are the host path's, in bfloat16 too."""
    mesh = mesh_lib.make_mesh(1, 8)
    for dtype in ("float32", "bfloat16"):
        _, host, _ = restored_packed(wide_gptq, mesh, "host", dtype)
        _, device, found = restored_packed(wide_gptq, mesh, "auto", dtype)
        assert len(found.device) == 7 and not found.host
        flat_host, flat_device = weight_paths(host), weight_paths(device)
        for name in found.device:
            leaf = flat_device[name]
            assert _spec(leaf) == _packed_spec(leaf, flat_host[name]), name
            np.testing.assert_array_equal(bits(leaf), bits(flat_host[name]), err_msg=name)
        for name in ("layers/0/attn/o", "layers/0/mlp/down"):
            leaf = flat_device[name]
            assert leaf.layout.block == 32 * (2 if name.endswith("down") else 1)
            # Each device holds an eighth of the records: its heads', or its input columns'.
            assert leaf.data.addressable_shards[0].data.size * 8 == leaf.data.size, name
            assert not leaf.layout.dequantize.shared  # the g_idx of no act-order, dropped
        for name in ("layers/0/attn/q", "layers/0/mlp/gate", "layers/0/mlp/up"):
            # Column-parallel: records `[in / C, out, bytes]` split along `out`, dequantized
            # where they lie (merged into one axis, XLA would gather them on every device).
            assert _spec(flat_device[name])[1] == "model", name
            assert _collectives(flat_device[name]) == [], name
        assert _nll_of(wide_gptq, mesh, dtype, "auto") == pytest.approx(
            _nll_of(wide_gptq, mesh, dtype, "host"), rel=1e-6, abs=0
        )


# The records of each layout the goldens' models lack (GPTQ 2, 3 and 8 bits, v1 and v2 and
# act-order; compressed-tensors per group, channel, tensor and block; FP8 per tensor), whole
# and cut in chunks, against the host's dequantization.


@functools.cache
def tensor_entries() -> dict:
    with open(os.path.join(GOLDEN, "tensors", "tensors.json"), encoding="utf-8") as f:
        return json.load(f)


@pytest.mark.parametrize("shards", [rows.SHARDS, 1])
@pytest.mark.parametrize("entry", sorted(tensor_entries()))
def test_records_dequantize_as_the_host(entry, shards, monkeypatch):
    # SHARDS of 1 cuts these narrow weights in chunks; the default keeps most of them whole.
    monkeypatch.setattr(rows, "SHARDS", shards)
    e = tensor_entries()[entry]
    folder = os.path.join(GOLDEN, "tensors")
    weights = huggingface.RangedSafetensors(
        folder, ranges.read_header(folder, "tensors.safetensors")
    )
    stored = {k: v for k, v in weights.stored((), False).items() if k.startswith(entry + ".")}
    source = quantized_parts.view(methods.parse(e, entry), weights, stored, weights.real, entry)[0]
    made = _check_records(source, e["weight"])
    t = source.tensors[e["weight"]]
    if shards == 1 and "g_idx" not in t.parts and made.width % 32 == 0:
        assert made.block < made.width, entry  # cut in chunks (codes: whole runs of 32)


def _check_records(source, name: str) -> rows.Rows:
    """The records of the quantized weight `name`, dequantized as a `Packed` weight, equal
    the host's dequantization in float32, bit for bit; their `Rows`."""
    t = source.tensors[name]
    common = rows.shared(t, source.method, source.storage)
    made = rows.Rows.of(rows.plain(t, common), source.method, source.raw, common)
    got = rows.records(t, source.method, source.storage, made)
    data = np.ascontiguousarray(got).view(np.uint8).reshape(*got.shape, made.nbytes)
    layout = packed.Layout(made, "kind", made.in_axis, made.block, made.nbytes, t.shape, "float32")
    assert layout.packed_shape == data.shape
    value = np.asarray(jax.jit(packed.Packed.value)(packed.Packed(jnp.asarray(data), layout)))
    with np.errstate(over="ignore"):
        host = source.read(name, ()).astype(np.float32)
    np.testing.assert_array_equal(value.view(np.uint32), host.view(np.uint32))
    return made


def test_mxfp4_experts_cut_in_chunks(monkeypatch):
    # Experts [2, 128, 16] of random E2M1 codes and E8M0 scales: records of 32 input columns.
    monkeypatch.setattr(rows, "SHARDS", 1)
    monkeypatch.setattr(rows, "CHUNK", 32)
    rng = np.random.default_rng(2)
    arrays = {"e.w_blocks": rng.integers(0, 256, (2, 16, 4, 16)).astype(np.uint8),
              "e.w_scales": rng.integers(100, 150, (2, 16, 4)).astype(np.uint8)}  # fmt: skip
    stored = {k: (v.shape, "U8") for k, v in arrays.items()}
    scheme = methods.parse({"quantization_config": {"quant_method": "mxfp4"}}, "random")
    source = quantized_parts.view(scheme, storage.Arrays(arrays), stored, str, "random")[0]
    made = _check_records(source, "e.w")
    assert (made.block, made.width, made.in_axis) == (32, 128, 1)


def _quantized(kind, shape, **fields) -> quantized_base.Quantized:
    return quantized_base.Quantized(kind, {"x": "x"}, shape, "F16", **fields)


def test_the_chunks_of_an_8b_models_weights_shard_over_8_devices():
    # Llama 3 8B's projections: 128 input columns a record (a multiple of 8 records a row);
    # act-order keeps the input axis whole; MXFP4 experts of GPT-OSS's 2880 columns too.
    gptq = functools.partial(_quantized, "gptq", bits=4, group=128)
    assert rows.chunk(gptq((4096, 4096), groups=32)) == 128
    assert rows.chunk(gptq((4096, 14336), groups=112)) == 128
    assert rows.chunk(gptq((14336, 4096), group=4096, groups=1)) == 128  # one group: repeated
    act_order = quantized_base.Quantized("gptq", {"g_idx": "g"}, (4096, 4096), "F16", 4, 128, 32)
    assert rows.chunk(act_order) == 4096
    fp8 = _quantized("scaled", (4096, 14336), bits=8, block=(128, 128))
    assert rows.chunk(fp8) == 128
    channel = _quantized("scaled", (4096, 4096), bits=8, block=(1, 4096))
    assert rows.chunk(channel) == 128
    assert rows.chunk(_quantized("mxfp4", (32, 2880, 5760), bits=4)) == 2880


def test_a_g_idx_naming_a_missing_group_is_refused_before_reading(tmp_path):
    folder = str(tmp_path / "bad")
    shutil.copytree(os.path.join(GOLDEN, "gptq_act_order"), folder)
    path = os.path.join(folder, "model.safetensors")
    tensors = load_file(path)
    tensors["model.layers.1.mlp.up_proj.g_idx"][3] = 99
    save_file(tensors, path)
    ckpt = open_checkpoint(folder)
    model = architecture.resolve(ckpt).model()
    with pytest.raises(CheckpointError, match="names group 99"):
        architecture.packed(ckpt, None, model, "auto")


def test_parts_that_do_not_fit_are_refused_before_reading(tmp_path):
    # config.json's group size says 32, the scales hold groups of 16: the Finder refuses it.
    folder = str(tmp_path / "bad")
    shutil.copytree(os.path.join(GOLDEN, "gptq_sym"), folder)
    config_path = os.path.join(folder, "config.json")
    with open(config_path, encoding="utf-8") as f:
        config = json.load(f)
    config["quantization_config"]["group_size"] = 32
    with open(config_path, "w", encoding="utf-8") as f:
        json.dump(config, f)
    ckpt = open_checkpoint(folder)
    model = architecture.resolve(ckpt).model()
    with pytest.raises(CheckpointError, match="scales"):
        architecture.packed(ckpt, None, model, "auto")


def test_a_run_records_the_packed_weights(tmp_path):
    runs = helpers.host_and_packed_runs(tmp_path, os.path.join(GOLDEN, "gptq_act_order"))
    host, auto = runs["host"], runs["auto"]
    assert "packed_on_device" not in host["model"]
    assert auto["model"]["packed_on_device"]["types"] == {"gptq-4": 14}
    assert auto["nll_sum"] == host["nll_sum"]


def test_byte_range_reads_place_the_same_records():
    # A remote directory's path (huggingface.load_ranged, here over the local file).
    folder = os.path.join(GOLDEN, "awq")
    mesh = _mesh(MESHES["model_8"])
    ckpt = open_checkpoint(folder)
    model, found = architecture.packed(ckpt, None, architecture.resolve(ckpt).model(), "auto")
    target, _ = mesh_lib.param_targets(
        model.abstract_params, model.logical_axes, mesh, DEFAULT_RULES
    )
    local = weight_paths(ckpt.restore(None, target))
    ranged = weight_paths(huggingface.load_ranged(folder, ckpt.entries(None), target))
    assert found.device and local.keys() == ranged.keys()
    for name in found.device:
        assert packed.is_packed(ranged[name]), name
        np.testing.assert_array_equal(np.asarray(ranged[name].data), np.asarray(local[name].data))


def test_a_rule_that_reorders_the_input_axis_dequantizes_on_the_host():
    # rope's reordering of the input columns (each record's columns moved apart), a `scale`:
    # both read as floats, named with the reason; a rule moving whole rows packs.
    source = _source(os.path.join(GOLDEN, "gptq_sym"))
    q, o = "layers.0.self_attn.q_proj.weight", "layers.0.self_attn.o_proj.weight"
    stored = {q: ((64, 64), "F16"), o: ((64, 64), "F16")}
    rules = [
        {"from": q.replace(".", "\\."), "to": "q", "transpose": [1, 0], "rope": {"axis": 0}},
        {"from": o.replace(".", "\\."), "to": "o", "transpose": [1, 0], "scale": 2.0},
    ]
    abstract = {n: jax.ShapeDtypeStruct((64, 64), jnp.float32) for n in ("q", "o")}
    sources = mapping.resolve(rules, stored, abstract, {}, "test")
    layouts, host = rows.layouts(source, sources, stored, abstract, {})
    assert not layouts and set(host) == {"q", "o"}
    assert (
        host["q"]
        == host["o"]
        == "its mapping rule cuts or reorders the input columns, or scales them"
    )
    del rules[0]["rope"]
    layouts, host = rows.layouts(source, mapping.resolve(rules, stored, abstract, {}, "t"),
                                 stored, abstract, {})  # fmt: skip
    assert set(layouts) == {"q"} and set(host) == {"o"}
