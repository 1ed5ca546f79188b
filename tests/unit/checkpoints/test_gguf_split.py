"""A split GGUF model (llama.cpp's `llama-gguf-split` layout: `qwen3-00001-of-00003.gguf`, ...)
opens in place by any part or its folder and scores exactly as the file it was split from (the
same tensor bytes: the NLL of every token equal bit for bit); a missing part, a part whose
`split.*` keys disagree, a part of another model, a tensor in two parts and a part named
otherwise are each refused in one sentence before any weight is read; the checkpoint's identity
covers every part. The parts are the golden tests/golden/gguf/qwen3.gguf split by gguf-py's own
writer (`ppl_jax.testing.split_gguf`)."""

from __future__ import annotations

import functools
import os
import shutil
import struct

import jax.numpy as jnp
import numpy as np
import pytest

from ppl_jax import testing
from ppl_jax.checkpoints import architecture, open_checkpoint
from ppl_jax.checkpoints.formats import gguf_file
from ppl_jax.cli import inspect as inspect_cli
from ppl_jax.config.defaults import DEFAULT_RULES
from ppl_jax.errors import CheckpointError
from ppl_jax.models.interface import weight_paths
from ppl_jax.runtime import mesh as mesh_lib
from ppl_jax.scoring.nll import token_nll

import helpers

GOLDEN = os.path.join(helpers.GOLDEN, "gguf")


@pytest.fixture
def parts(tmp_path):
    """The golden Qwen3 split into 3 parts of 5, 5 and 3 tensors."""
    return [os.path.basename(p) for p in testing.split_gguf(
        os.path.join(GOLDEN, "qwen3.gguf"), str(tmp_path), 3)]  # fmt: skip


@functools.cache
def scored(path: str) -> tuple[dict, np.ndarray]:
    """(the restored weights, the NLL of each next token of the first 48 tokens of a text) of the checkpoint `path`."""
    ckpt = open_checkpoint(str(path))
    model = architecture.resolve(ckpt).model(dtype="float32")
    target, _ = mesh_lib.param_targets(
        model.abstract_params, model.logical_axes, mesh_lib.make_mesh(-1, 1), DEFAULT_RULES
    )
    params = ckpt.restore(None, target)
    text = "a split model scores exactly as the file it was split from, token by token"
    ids = jnp.asarray(ckpt.tokenizer().encode([text])[0][:48])
    ids, positions = ids[None], jnp.arange(len(ids))[None]
    logits = model.apply(params, ids[:, :-1], positions[:, :-1], jnp.ones_like(ids[:, :-1]))
    return weight_paths(params), np.asarray(token_nll(logits, ids[:, 1:]))


def refused(path, match: str) -> None:
    with pytest.raises(CheckpointError, match=match):
        architecture.resolve(open_checkpoint(str(path))).model()


def patch(path, old: bytes, new: bytes) -> None:
    """Replaces the one occurrence of `old` in the file by `new` (as long)."""
    raw = path.read_bytes()
    assert raw.count(old) == 1 and len(old) == len(new)
    path.write_bytes(raw.replace(old, new))


def split_key(key: str, kind: str, value: int) -> bytes:
    """A `split.*` key's bytes in a header: its name, its GGUF value type, its value."""
    code = {"H": 2, "i": 5}[kind]
    return struct.pack("<Q", len(key)) + key.encode() + struct.pack(f"<I{kind}", code, value)


@pytest.mark.parametrize("opened", ["qwen3-00001-of-00003.gguf", "qwen3-00003-of-00003.gguf", "."])
def test_any_part_or_the_folder_scores_as_the_unsplit_file_bit_for_bit(tmp_path, parts, opened):
    weights, nll = scored(str(tmp_path / opened))
    want_weights, want = scored(os.path.join(GOLDEN, "qwen3.gguf"))
    assert nll.shape == want.shape and nll.size > 8
    np.testing.assert_array_equal(nll, want)
    assert float(nll.sum()) == float(want.sum())
    assert weights.keys() == want_weights.keys()
    for name, value in weights.items():
        np.testing.assert_array_equal(np.asarray(value), np.asarray(want_weights[name]), name)


def test_inspect_lists_the_parts_and_their_tensors(tmp_path, parts, capsys):
    assert inspect_cli.main([str(tmp_path / parts[1])]) == 0
    out = capsys.readouterr().out
    assert "files: 3 parts of a split model" in out
    for name, count in zip(parts, (5, 5, 3), strict=True):
        assert f"{tmp_path / name} ({count} tensors)" in out
    assert "weights: 13 tensors" in out and "architecture: 'qwen3'" in out


@pytest.mark.parametrize("gone", [0, 1, 2])
def test_a_missing_part_is_named(tmp_path, parts, gone):
    os.remove(tmp_path / parts[gone])
    opened = parts[(gone + 1) % 3]
    refused(tmp_path / opened, f"part {(gone + 1) % 3 + 1} of a GGUF model split into 3 parts, "
            f"and {parts[gone]} is missing from .*; download every part into that folder")  # fmt: skip


def test_a_missing_part_exits_2_from_inspect_in_one_line(tmp_path, parts, capsys):
    os.remove(tmp_path / parts[2])
    assert inspect_cli.main([str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{parts[2]} is missing" in err and "Traceback" not in err


def test_a_tensor_in_two_parts(tmp_path, parts):
    patch(tmp_path / parts[1], b"blk.0.ffn_up.weight", b"blk.0.attn_q.weight")
    refused(tmp_path / parts[0], r"the tensor 'blk.0.attn_q.weight' is in two parts of a split "
            r"GGUF model, .*00001-of-00003.gguf' and .*00002-of-00003.gguf'")  # fmt: skip


def test_a_part_whose_number_disagrees_with_its_name(tmp_path, parts):
    patch(tmp_path / parts[1], split_key("split.no", "H", 1), split_key("split.no", "H", 2))
    refused(tmp_path / parts[0], r"00002-of-00003.gguf' says it is split.no 2 of split.count 3 "
            r"with split.tensors.count 13, where its name and the first part make it 1 of 3")  # fmt: skip


def test_a_part_whose_count_disagrees_with_the_first(tmp_path, parts):
    patch(tmp_path / parts[2], split_key("split.count", "H", 3), split_key("split.count", "H", 4))
    refused(tmp_path / parts[0], r"00003-of-00003.gguf' says it is split.no 2 of split.count 4")


@pytest.mark.parametrize("opened", [".", "qwen3-00002-of-00003.gguf"])
def test_a_part_of_another_model(tmp_path, parts, opened):
    qwen2 = testing.split_gguf(os.path.join(GOLDEN, "qwen2.gguf"), str(tmp_path / "other"), 3)
    shutil.copy(qwen2[1], tmp_path / parts[1])
    refused(tmp_path / opened, r"00002-of-00003.gguf' says it is split.no 1 of split.count 3 with "
            r"split.tensors.count 14, .* 1 of 3 with 13: a part of another model")  # fmt: skip


def test_fewer_tensors_than_the_parts_say(tmp_path, parts):
    for name in parts:
        patch(tmp_path / name, split_key("split.tensors.count", "i", 13),
              split_key("split.tensors.count", "i", 14))  # fmt: skip
    refused(tmp_path / parts[2], "the 3 parts of the split GGUF model .* hold 13 tensors, where "
            "its split.tensors.count says 14")  # fmt: skip


def test_a_part_not_named_as_llama_cpp_names_parts(tmp_path, parts):
    os.rename(tmp_path / parts[0], tmp_path / "qwen3.gguf")
    refused(tmp_path / "qwen3.gguf", r"is part 1 of 3 of a split GGUF model, but its name does "
            r"not end in -00001-of-00003.gguf, so its other parts cannot be found")  # fmt: skip


def test_a_folder_of_two_split_models_names_them(tmp_path, parts):
    testing.split_gguf(os.path.join(GOLDEN, "qwen2.gguf"), str(tmp_path), 2)
    refused(tmp_path, r"holds 5 GGUF files \(qwen2-00001-of-00002.gguf, .*\) of more than one "
            r"model; set checkpoint.dir to the one to score")  # fmt: skip


def test_the_identity_covers_every_part(tmp_path, parts):
    ckpt = open_checkpoint(str(tmp_path / parts[0]))
    before = ckpt.identity(None)["files"]
    last = tmp_path / parts[2]
    stat = os.stat(last)
    raw = bytearray(last.read_bytes())
    raw[-1] ^= 0xFF  # the last byte of output_norm.weight: size and time kept
    last.write_bytes(bytes(raw))
    os.utime(last, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert open_checkpoint(str(tmp_path / parts[0])).identity(None)["files"] != before


def test_each_tensor_is_read_from_its_own_part_by_byte_range(tmp_path, parts, monkeypatch):
    ckpt = open_checkpoint(str(tmp_path))
    header, model = ckpt.header, architecture.resolve(ckpt).model()
    mesh = mesh_lib.make_mesh(1, 8)
    target = mesh_lib.param_targets(model.abstract_params, model.logical_axes, mesh,
                                    DEFAULT_RULES)[0]  # fmt: skip
    held = {p: np.zeros(os.path.getsize(p), bool) for p in header.parts}  # tensor bytes
    for t in header.tensors.values():
        held[t.path][t.start : t.start + t.nbytes] = True
    read = {p: np.zeros(os.path.getsize(p), bool) for p in header.parts}
    pread = gguf_file._pread

    def counted(path, ranges):
        for at, n in ranges:
            assert held[path][at : at + n].all(), (path, at, n)  # only its own tensors' bytes
            read[path][at : at + n] = True
        return pread(path, ranges)

    monkeypatch.setattr(gguf_file, "_pread", counted)
    params = weight_paths(ckpt.restore(None, target))
    assert any("model" in p.sharding.spec for p in params.values())  # devices' blocks read
    assert [os.path.basename(p) for p in header.parts] == parts
    for path in header.parts:  # every tensor byte of every part read, from that part
        np.testing.assert_array_equal(read[path], held[path], path)


def test_a_damaged_part_is_named_as_a_damaged_file_is(tmp_path, parts):
    last = tmp_path / parts[2]
    last.write_bytes(last.read_bytes()[:-64])
    refused(tmp_path / parts[0], rf"{parts[2]}' is not a GGUF file ppl_jax can read: tensor "
            rf"'output_norm.weight' claims .* \(.* truncated\)")  # fmt: skip
