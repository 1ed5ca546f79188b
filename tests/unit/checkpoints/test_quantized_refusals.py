"""Damaged, hostile and unsupported quantized checkpoints: one sentence naming the file, tensor
or key, raised before any weight is read (the storage's `read` is never called), except a
`g_idx` naming a group the scales lack, which only its block's read can see.

Each case is a copy of a golden folder of tests/golden/quantized/ with one thing changed.
"""

from __future__ import annotations

import json
import os
import shutil
import struct

import jax
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from ppl_jax.checkpoints.formats import safetensors
from ppl_jax.config.defaults import DEFAULT_RULES
from ppl_jax.errors import CheckpointError
from ppl_jax.models import registry
from ppl_jax.runtime import mesh as mesh_lib

import helpers

GOLDEN = os.path.join(helpers.GOLDEN, "quantized")
Q = "model.layers.0.self_attn.q_proj."


def copy(tmp_path, name: str = "gptq_act_order") -> str:
    folder = str(tmp_path / name)
    shutil.copytree(os.path.join(GOLDEN, name), folder)
    return folder


def edit_config(folder: str, **changes) -> None:
    path = os.path.join(folder, "config.json")
    with open(path, encoding="utf-8") as f:
        config = json.load(f)
    for key, value in changes.items():
        if value is None:
            config["quantization_config"].pop(key, None)
        elif key == "quantization_config":
            config[key] = value
        else:
            config["quantization_config"][key] = value
    with open(path, "w", encoding="utf-8") as f:
        json.dump(config, f)


def edit_tensors(folder: str, change) -> None:
    path = os.path.join(folder, "model.safetensors")
    tensors = load_file(path)
    change(tensors)
    save_file(tensors, path)


def load(folder: str, monkeypatch) -> None:
    """Restores the folder's weights with the storage's reads counted; raises what it raises
    (after checking the sentence is one line), and that no read came before the refusal."""
    reads = []
    real_read = safetensors.Safetensors.read
    monkeypatch.setattr(
        safetensors.Safetensors, "read", lambda self, *a: reads.append(a[0]) or real_read(self, *a)
    )
    try:
        model = registry.build(safetensors.read_description(folder), np.float32)
        target, _ = mesh_lib.param_targets(
            model.abstract_params, model.logical_axes, mesh_lib.make_mesh(-1, 1), DEFAULT_RULES
        )
        jax.block_until_ready(safetensors.load_params(folder, target))
    except CheckpointError as e:
        assert "\n" not in str(e) and str(e).endswith("."), str(e)
        assert not reads, f"read {reads[:3]} before refusing: {e}"
        raise


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"bits": 5}, "GPTQ bits=5, not one of 2, 3, 4, 8"),
        ({"bits": "4"}, "bits='4', not a whole number"),
        ({"group_size": 0}, "group_size=0, not a size"),
        ({"checkpoint_format": "marlin"}, "checkpoint_format 'marlin', a kernel's layout"),
        ({"quant_method": "hqq"}, "the method 'hqq', which ppl_jax does not read"),
        ({"quant_method": None}, "the method None, which ppl_jax does not read"),
        ({"quant_method": ["gptq"]}, "the method \\['gptq'\\], which ppl_jax does not read"),
        ({"dynamic": {"re:.*": {"bits": 8}}}, "per-module overrides"),
        ({"quantization_config": ["gptq"]}, "quantization_config is \\['gptq'\\], not an object"),
    ],
)
def test_a_configuration_outside_the_layouts_is_refused(tmp_path, monkeypatch, changes, message):
    folder = copy(tmp_path)
    edit_config(folder, **changes)
    with pytest.raises(CheckpointError, match=message):
        load(folder, monkeypatch)


@pytest.mark.parametrize(
    "name, changes, message",
    [
        ("awq", {"version": "gemv"}, "AWQ version 'gemv', a kernel's layout"),
        ("awq", {"bits": 8}, "AWQ bits=8"),
        ("ct_int4", {"format": "nvfp4-pack-quantized", "config_groups": {"g": {"weights": {
            "num_bits": 4, "type": "float"}}}}, "format 'nvfp4-pack-quantized', which"),
        ("ct_int4", {"quantization_status": "frozen"}, "quantization_status 'frozen'"),
        ("ct_int4", {"transform_config": {"x": 1}}, "a transform_config"),
        ("deepseek_v3_fp8", {"weight_block_size": [16]}, "weight_block_size=\\[16\\], not two"),
        ("deepseek_v3_fp8", {"fmt": "e5m2"}, "fmt='e5m2'"),
    ],
)  # fmt: skip
def test_other_layouts_outside_what_is_read_are_refused(
    tmp_path, monkeypatch, name, changes, message
):
    folder = copy(tmp_path, name)
    edit_config(folder, **changes)
    with pytest.raises(CheckpointError, match=message):
        load(folder, monkeypatch)


def _grow(name):
    def change(t):
        t[name] = np.concatenate([t[name], t[name][:1]])

    return change


@pytest.mark.parametrize(
    "change, message",
    [
        (_grow(Q + "scales"), "q_proj.scales' is F16 of shape \\[5, 64\\], but .* make it \\[4, 64\\]"),
        (_grow(Q + "qzeros"), "q_proj.qzeros' is I32 of shape \\[5, 8\\]"),
        (_grow(Q + "qweight"), "q_proj.qweight' is I32 of shape \\[9, 64\\]"),
        (lambda t: t.pop(Q + "qzeros"), "lacks its part 'model.layers.0.self_attn.q_proj.qzeros'"),
        (lambda t: t.update({Q + "scales": t[Q + "scales"].astype(np.int16)}),
         "q_proj.scales' is I16 .* must be 2-dimensional F32/F16/BF16"),
        (lambda t: t.update({Q + "weight": np.zeros((64, 64), np.float16)}),
         "stores 'model.layers.0.self_attn.q_proj.weight' both as it is and quantized"),
    ],
)  # fmt: skip
def test_parts_that_do_not_fit_are_refused_before_any_read(tmp_path, monkeypatch, change, message):
    folder = copy(tmp_path)
    edit_tensors(folder, change)
    with pytest.raises(CheckpointError, match=message):
        load(folder, monkeypatch)


def test_a_g_idx_naming_a_missing_group_is_refused_when_read(tmp_path):
    folder = copy(tmp_path)
    edit_tensors(folder, lambda t: t[Q + "g_idx"].__setitem__(3, 4))  # 4 groups: 0..3
    model = registry.build(safetensors.read_description(folder), np.float32)
    target, _ = mesh_lib.param_targets(
        model.abstract_params, model.logical_axes, mesh_lib.make_mesh(-1, 1), DEFAULT_RULES
    )
    with pytest.raises(CheckpointError, match="q_proj.g_idx' names group 4, but its weight's "
                       "scales hold 4 groups; the checkpoint is damaged."):  # fmt: skip
        safetensors.load_params(folder, target)


def test_packed_tensors_without_a_quantization_config_are_refused(tmp_path, monkeypatch):
    folder = copy(tmp_path)
    edit_config(folder, quantization_config={})
    with pytest.raises(CheckpointError, match="part of a quantized layout, but config.json has no"):
        load(folder, monkeypatch)


def test_a_quantization_config_over_float_weights_is_refused(tmp_path, monkeypatch):
    folder = str(tmp_path / "plain")
    shutil.copytree(os.path.join(helpers.GOLDEN, "families", "gpt_oss"), folder)
    edit_config(folder, quantization_config={"quant_method": "mxfp4"})
    with pytest.raises(CheckpointError, match="names mxfp4, but no stored tensor is in its layout"):
        load(folder, monkeypatch)


def _header(folder: str) -> tuple[dict, bytes]:
    with open(os.path.join(folder, "model.safetensors"), "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    return json.loads(raw[8 : 8 + n]), raw[8 + n :]


def _write(folder: str, header: dict, data: bytes) -> None:
    text = json.dumps(header).encode()
    with open(os.path.join(folder, "model.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + data)


def test_truncated_tensor_data_is_refused(tmp_path, monkeypatch):
    folder = copy(tmp_path)
    header, data = _header(folder)
    _write(folder, header, data[: len(data) - 100])
    with pytest.raises(CheckpointError, match="is not a readable safetensors file"):
        load(folder, monkeypatch)


def test_a_header_claiming_more_than_the_file_holds_is_refused(tmp_path, monkeypatch):
    folder = copy(tmp_path)
    header, data = _header(folder)
    begin, end = header[Q + "qweight"]["data_offsets"]
    header[Q + "qweight"]["shape"] = [8, 64 * 1000]
    header[Q + "qweight"]["data_offsets"] = [begin, begin + (end - begin) * 1000]
    _write(folder, header, data)
    with pytest.raises(CheckpointError, match="is not a readable safetensors file"):
        load(folder, monkeypatch)


def test_an_unknown_dtype_is_refused(tmp_path, monkeypatch):
    folder = copy(tmp_path)
    header, data = _header(folder)
    header[Q + "qweight"]["dtype"] = "Q4_K"
    _write(folder, header, data)
    with pytest.raises(CheckpointError, match="is not a readable safetensors file"):
        load(folder, monkeypatch)


def test_fp8_and_mxfp4_scales_of_the_wrong_shape_are_refused(tmp_path, monkeypatch):
    folder = copy(tmp_path, "gpt_oss_mxfp4")
    edit_tensors(folder, _grow("model.layers.0.mlp.experts.down_proj_scales"))
    with pytest.raises(CheckpointError, match="down_proj_scales' is U8 of shape \\[5, 32, 1\\]"):
        load(folder, monkeypatch)
    folder = copy(tmp_path, "deepseek_v3_fp8")
    header, data = _header(folder)
    name = "model.layers.0.self_attn.o_proj.weight_scale_inv"
    header[name]["shape"] = header[name]["shape"][::-1]
    _write(folder, header, data)
    with pytest.raises(CheckpointError, match="o_proj.weight_scale_inv' is F32 of shape \\[3, 2\\]"
                       ", but blocks of 16x16 make it \\[2, 3\\]"):  # fmt: skip
        load(folder, monkeypatch)
