"""Nothing a GGUF file claims is trusted blindly: damaged or hostile files (truncated tensor data,
a header claiming more than the file holds, unknown or undequantizable types, shapes that are not
whole blocks or not the architecture's, names outside the architecture's, absurd sizes, another
format) are refused in one sentence naming the file before any weight is used, and `ppl-jax
inspect` exits with status 2 and no traceback. Each damage is made by patching the bytes of a
golden file (tests/golden/gguf/qwen3.gguf) where its header stores the field."""

from __future__ import annotations

import os
import shutil
import struct

import numpy as np
import pytest

from ppl_jax.checkpoints import architecture, open_checkpoint
from ppl_jax.checkpoints.formats import gguf_file
from ppl_jax.cli import inspect as inspect_cli
from ppl_jax.config.defaults import DEFAULT_RULES
from ppl_jax.errors import CheckpointError
from ppl_jax.runtime import mesh as mesh_lib

import helpers

GOLDEN = os.path.join(helpers.GOLDEN, "gguf", "qwen3.gguf")
TENSOR = b"blk.0.attn_q.weight"


@pytest.fixture
def copy(tmp_path):
    path = tmp_path / "model.gguf"
    shutil.copy(GOLDEN, path)
    return path


def patch(path, at: int, data: bytes) -> None:
    raw = bytearray(path.read_bytes())
    raw[at : at + len(data)] = data
    path.write_bytes(bytes(raw))


def tensor_info(path, name: bytes = TENSOR) -> int:
    """Where a tensor's entry (after its name: n_dims, dims, type, offset) starts."""
    raw = path.read_bytes()
    return raw.index(struct.pack("<Q", len(name)) + name) + 8 + len(name)


def metadata_value(path, key: bytes) -> int:
    """Where a metadata key's value (after its type) starts."""
    raw = path.read_bytes()
    return raw.index(struct.pack("<Q", len(key)) + key) + 8 + len(key) + 4


def restore(path):
    ckpt = open_checkpoint(str(path))
    model = architecture.resolve(ckpt).model()
    mesh = mesh_lib.make_mesh(-1, 1)
    target = mesh_lib.param_targets(model.abstract_params, model.logical_axes, mesh,
                                    DEFAULT_RULES)[0]  # fmt: skip
    return ckpt.restore(None, target)


def refused(path, match: str) -> None:
    """The file is refused by the first thing that reads it, in one sentence naming it."""
    with pytest.raises(CheckpointError, match=match) as e:
        restore(path)
    assert str(path) in str(e.value) and "\n" not in str(e.value)


def test_truncated_tensor_data(copy):
    patch_size = copy.stat().st_size - 100
    copy.write_bytes(copy.read_bytes()[:patch_size])
    refused(copy, r"claims [\d,]+ bytes at [\d,]+, past the end of the file \([\d,]+ bytes: "
            r"truncated\)")  # fmt: skip


def test_a_tensor_offset_past_the_end(copy):
    at = tensor_info(copy) + 4 + 16 + 4  # n_dims, two dims, type
    patch(copy, at, struct.pack("<Q", 1 << 40))
    refused(copy, "past the end of the file")


def test_a_tensor_over_another_tensors_bytes(copy):
    """An offset of 0 puts blk.0.attn_q.weight over token_embd.weight's data (llama.cpp refuses
    it: each tensor starts where the previous one ends)."""
    patch(copy, tensor_info(copy) + 4 + 16 + 4, struct.pack("<Q", 0))
    refused(copy, r"tensor 'blk.0.attn_q.weight' starts at 0 in the data section, inside the "
            r"data of tensor 'token_embd.weight' \(0 to 6,600\); each tensor needs bytes of its "
            r"own")  # fmt: skip


def test_a_tensor_reaching_into_the_next_ones_bytes(copy):
    """32 bytes past its place: blk.0.attn_q.weight's last block is attn_k's first."""
    patch(copy, tensor_info(copy) + 4 + 16 + 4, struct.pack("<Q", 6624 + 32))
    refused(copy, r"tensor 'blk.0.attn_k.weight' starts at 7,328 in the data section, inside the "
            r"data of tensor 'blk.0.attn_q.weight' \(6,656 to 7,360\)")  # fmt: skip


def test_a_header_claiming_more_keys_and_tensors_than_the_file_holds(copy):
    patch(copy, 8, struct.pack("<QQ", 1 << 50, 1 << 50))
    refused(copy, "claims .* metadata keys and .* tensors, more than the file holds")


def test_a_metadata_array_claiming_more_items_than_the_file_holds(copy):
    at = metadata_value(copy, b"tokenizer.ggml.merges")  # item type, then the count
    patch(copy, at + 4, struct.pack("<Q", 1 << 60))
    refused(copy, r"metadata 'tokenizer.ggml.merges' claims [\d,]+ items, more than the file")


def test_a_string_longer_than_the_file(copy):
    raw = copy.read_bytes()
    at = raw.index(b"general.architecture") - 8
    patch(copy, at, struct.pack("<Q", 1 << 62))
    refused(copy, "a metadata key claims .* bytes .* past the end of the file")


def test_an_unknown_tensor_type(copy):
    patch(copy, tensor_info(copy) + 4 + 16, struct.pack("<I", 99))
    refused(copy, "tensor 'blk.0.attn_q.weight' has the GGML type 99, which the gguf package "
            ".* does not know")  # fmt: skip


def test_a_type_the_gguf_package_does_not_dequantize(copy):
    patch(copy, tensor_info(copy) + 4 + 16, struct.pack("<I", 26))  # I32
    refused(copy, "tensor 'blk.0.attn_q.weight' is I32, which the gguf package .* does not "
            "dequantize")  # fmt: skip


def test_a_row_that_is_not_whole_blocks(copy):
    patch(copy, tensor_info(copy) + 4, struct.pack("<Q", 31))
    refused(copy, r"'blk.0.attn_q.weight' has the shape \[32, 31\], not whole Q5_0 blocks of 32")


def test_a_shape_the_architecture_does_not_make(copy):
    at = tensor_info(copy) + 4 + 8
    patch(copy, at, struct.pack("<Q", 16))  # 16 rows of q where the architecture has 32
    refused(copy, r"stored 'blk.0.attn_q.weight' \[16, 32\] gives .* which the architecture "
            r"makes \[32, 2, 16\]")  # fmt: skip


def test_a_tensor_name_outside_the_architectures(copy):
    patch(copy, copy.read_bytes().index(TENSOR), b"blk.0.attn_x.weight")
    refused(copy, "no mapping rule takes the stored weight 'blk.0.attn_x.weight'.* the model "
            "weights 'layers/0/attn/q' .* are given by no stored weight")  # fmt: skip


@pytest.mark.parametrize("key,value,match", [
    (b"qwen3.block_count", 1 << 30, "num_layers=1073741824 is not a size ppl_jax builds"),
    (b"qwen3.embedding_length", 1 << 31, "embed_dim=2147483648 is not a size ppl_jax builds"),
    (b"qwen3.attention.head_count", 0, "num_heads=0 is not a size ppl_jax builds"),
])  # fmt: skip
def test_absurd_sizes_are_refused_before_anything_is_built(copy, key, value, match):
    patch(copy, metadata_value(copy, key), struct.pack("<I", value))
    refused(copy, match)


def test_an_architecture_ppl_jax_does_not_read(copy):
    raw = copy.read_bytes()
    at = raw.index(b"qwen3", raw.index(b"general.architecture") + 20)
    patch(copy, at, b"mamba")
    # every architecture a family declares (`Family.gguf`), written out here so that one lost
    # from its family fails
    refused(copy, "holds the GGUF architecture 'mamba', which ppl_jax does not read \\(it reads "
            "gemma2, gemma3, gpt-oss, gpt2, llama, olmo2, phi3, qwen2, qwen2moe, qwen3, "
            "qwen3moe\\)")  # fmt: skip


def test_not_a_gguf_file(tmp_path):
    path = tmp_path / "model.gguf"
    path.write_bytes(b"PK\x03\x04" + bytes(100))
    refused(path, "does not start with the GGUF magic bytes")


def test_a_big_endian_file(copy):
    patch(copy, 4, struct.pack(">I", 3))
    refused(copy, r"it is big-endian \(ppl_jax reads little-endian GGUF versions 2 and 3\)")


def test_a_folder_of_several_files_names_them(tmp_path):
    for name in ("a-Q4_K_M.gguf", "b-Q8_0.gguf"):
        shutil.copy(GOLDEN, tmp_path / name)
    ckpt = open_checkpoint(str(tmp_path))
    with pytest.raises(CheckpointError, match="holds 2 GGUF files \\(a-Q4_K_M.gguf, b-Q8_0.gguf"):
        architecture.resolve(ckpt).model()


def test_a_folder_of_one_file_opens_and_a_link_out_of_it_is_refused(tmp_path):
    inside = tmp_path / "inside"
    inside.mkdir()
    shutil.copy(GOLDEN, inside / "model.gguf")
    assert open_checkpoint(str(inside)).description()["num_layers"] == 1
    linked = tmp_path / "linked"
    linked.mkdir()
    os.symlink(inside / "model.gguf", linked / "model.gguf")
    with pytest.raises(CheckpointError, match="is a link to .* outside the checkpoint folder"):
        architecture.resolve(open_checkpoint(str(linked))).model()


def test_a_file_changed_after_it_was_opened(copy):
    ckpt = open_checkpoint(str(copy))
    header = ckpt.header
    copy.write_bytes(copy.read_bytes()[: header.tensors["output_norm.weight"].start])
    with pytest.raises(CheckpointError, match="ended while reading .* re-download it"):
        gguf_file.read_region(header, "output_norm.weight", (slice(0, 32),))


def test_inspect_exits_2_with_one_line(copy, capsys):
    copy.write_bytes(copy.read_bytes()[:-100])
    assert inspect_cli.main([str(copy)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("ppl-jax: error: ") and err.count("\n") == 1 and "Traceback" not in err


def test_the_golden_file_itself_restores(copy):
    params = restore(copy)
    assert np.isfinite(np.asarray(params["embedding"])).all()
