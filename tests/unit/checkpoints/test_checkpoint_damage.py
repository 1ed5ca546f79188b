"""Damaged and hostile checkpoints: a clear `CheckpointError`, never a traceback or wrong weights.

Orbax steps whose files were truncated, deleted or corrupted after the save, and Hugging Face
indexes that name files outside their directory.
"""

from __future__ import annotations

import gc
import glob
import json
import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from safetensors.numpy import save_file

from ppl_jax.checkpoints import open_checkpoint
from ppl_jax.checkpoints.formats import checksums, safetensors
from ppl_jax.checkpoints.formats import orbax as checkpoint
from ppl_jax.config.defaults import DEFAULT_RULES
from ppl_jax.errors import CheckpointError
from ppl_jax.models import registry
from ppl_jax.runtime import mesh as mesh_lib

# ------------------------------------------------------------------------------ Orbax: damage

# `big` (64 x 64 float32, 16 KiB of random bits: zstd cannot shrink it below OCDBT's 1 KiB inline
# limit) is the only array whose chunk lands in a data file under `state/ocdbt.process_0/d/`;
# `small` and `step` are stored inline in the B+tree. So damage to that data file is damage to
# `big`, and to nothing else.
BIG, SMALL = (64, 64), (8,)


# Orbax's reads of a damaged step leave coroutines and closed event loops to the collector;
# collect them inside each test, where their "exception ignored" reports are expected.
pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")


@pytest.fixture(autouse=True)
def _collect_orbax_leftovers():
    yield
    gc.collect()


def _params(seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    return {
        "big": rng.standard_normal(BIG).astype(np.float32),
        "small": rng.standard_normal(SMALL).astype(np.float32),
    }


def _target() -> dict:
    mesh = mesh_lib.make_mesh(2, 4)
    spec = jax.sharding.PartitionSpec
    return {
        "big": jax.ShapeDtypeStruct(
            BIG, jnp.float32, sharding=jax.sharding.NamedSharding(mesh, spec(None, "model"))
        ),
        "small": jax.ShapeDtypeStruct(
            SMALL, jnp.float32, sharding=jax.sharding.NamedSharding(mesh, spec())
        ),
    }


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> str:
    path = str(tmp_path_factory.mktemp("damage") / "ckpt")
    checkpoint.save_train_state(path, 1, {"step": 1, "params": _params()}, {"model": {}})
    return path


@pytest.fixture
def copy(saved, tmp_path) -> str:
    """A fresh copy of the saved checkpoint, to damage."""
    path = str(tmp_path / "ckpt")
    shutil.copytree(saved, path)
    return path


def _state(path: str) -> str:
    return os.path.join(path, "1", checkpoint.STATE)


def _data_files(path: str) -> list[str]:
    files = glob.glob(os.path.join(_state(path), "ocdbt.process_0", "d", "*"))
    return [f for f in files if os.path.getsize(f) > 4096]


def _restore(path: str):
    return checkpoint.restore_params(path, 1, _target())


def _damaged(path: str) -> str:
    with pytest.raises(CheckpointError) as e:
        _restore(path)
    msg = str(e.value)
    assert msg.startswith(f"step 1 of {path!r} is damaged: "), msg
    assert msg.endswith(
        "Restore the step's files from a copy, or evaluate another step (checkpoint.step)."
    ), msg
    assert "\n" not in msg and "tensorstore_spec" not in msg
    return msg


def test_the_intact_copy_restores_exactly(copy):
    # The control: the layout the damage tests rely on, and a restore that reads real values.
    assert len(_data_files(copy)) == 1
    got = _restore(copy)
    for name, want in _params().items():
        np.testing.assert_array_equal(np.asarray(got[name]), want, err_msg=name)


def test_truncated_array_file_names_the_weight(copy, capfd):
    (data,) = _data_files(copy)
    os.truncate(data, os.path.getsize(data) // 2)
    msg = _damaged(copy)
    assert "weight 'big' cannot be read (OUT_OF_RANGE: " in msg, msg
    assert "'small'" not in msg
    # Orbax's failed reads leave no traceback behind either.
    assert "Traceback" not in capfd.readouterr().err


def test_deleted_array_file_names_the_weight(copy):
    (data,) = _data_files(copy)
    os.remove(data)
    msg = _damaged(copy)
    assert "weight 'big' cannot be read (" in msg, msg


def test_missing_ocdbt_manifest(copy):
    os.remove(os.path.join(_state(copy), "manifest.ocdbt"))
    assert "its OCDBT manifest 'state/manifest.ocdbt' is missing." in _damaged(copy)


def _flip(file: str, at: int) -> None:
    with open(file, "r+b") as f:
        f.seek(at)
        byte = f.read(1)[0]
        f.seek(at)
        f.write(bytes([byte ^ 0x10]))


def test_corrupt_ocdbt_manifest_fails_its_checksum(copy):
    manifest = os.path.join(_state(copy), "manifest.ocdbt")
    _flip(manifest, os.path.getsize(manifest) // 2)
    msg = _damaged(copy)
    assert "the OCDBT index of its arrays cannot be read (DATA_LOSS: " in msg, msg
    assert "CRC-32C checksum verification failed" in msg


def test_corrupt_btree_nodes(copy):
    # The B+tree nodes are the small files under `state/d/` and `state/ocdbt.process_0/d/`.
    nodes = [
        f
        for f in glob.glob(os.path.join(_state(copy), "**", "d", "*"), recursive=True)
        if f not in _data_files(copy)
    ]
    assert nodes
    for node in nodes:
        _flip(node, os.path.getsize(node) // 2)
    msg = _damaged(copy)
    assert "the OCDBT index of its arrays cannot be read (" in msg, msg
    assert "Error decoding b-tree node: " in msg


def test_missing_or_truncated_tree_metadata(copy):
    meta = os.path.join(_state(copy), "_METADATA")
    os.truncate(meta, 100)
    assert "its tree metadata 'state/_METADATA' is not valid JSON (" in _damaged(copy)
    os.remove(meta)
    assert "its tree metadata 'state/_METADATA' is missing." in _damaged(copy)


def test_flipped_bits_in_array_data_are_caught_by_the_checksums(copy):
    (data,) = _data_files(copy)
    _flip(data, os.path.getsize(data) // 2)
    msg = _damaged(copy)
    assert "the stored bytes of weight 'big' changed after the save (they do not match the " in msg


def test_without_checksums_flipped_bits_go_unnoticed(copy):
    # What the checksums are for: Orbax's zstd chunks carry no checksum, so the same flip as
    # above restores silently, with a different value.
    shutil.rmtree(os.path.join(copy, "1", checkpoint.CHECKSUMS))
    (data,) = _data_files(copy)
    _flip(data, os.path.getsize(data) // 2)
    got = _restore(copy)
    assert not np.array_equal(np.asarray(got["big"]), _params()["big"])
    np.testing.assert_array_equal(np.asarray(got["small"]), _params()["small"])


def test_checked_weights_are_cast_in_groups(copy, monkeypatch):
    # float32 stored, bfloat16 wanted: restored in float32 a group at a time, checked, cast.
    monkeypatch.setattr(checkpoint, "CAST_GROUP_BYTES", 1024)
    restores = []
    real_restore = checkpoint._restore_names
    monkeypatch.setattr(
        checkpoint,
        "_restore_names",
        lambda d, p: restores.append(sorted(p)) or real_restore(d, p),
    )
    target = {
        k: jax.ShapeDtypeStruct(v.shape, jnp.bfloat16, sharding=v.sharding)
        for k, v in _target().items()
    }
    got = checkpoint.restore_params(copy, 1, target)
    assert restores == [["params/big"], ["params/small"]]
    for name, want in _params().items():
        assert got[name].dtype == jnp.bfloat16
        assert got[name].sharding == target[name].sharding
        np.testing.assert_array_equal(
            np.asarray(got[name]), np.asarray(jnp.asarray(want, jnp.bfloat16))
        )
    (data,) = _data_files(copy)
    _flip(data, os.path.getsize(data) // 2)
    with pytest.raises(CheckpointError, match="the stored bytes of weight 'big' changed"):
        checkpoint.restore_params(copy, 1, target)


@pytest.mark.parametrize("host_bytes", [-1, checksums.HOST_BYTES])
def test_fingerprint_against_numpy_and_over_shardings(monkeypatch, host_bytes):
    """On the device (jit) and, for small arrays held whole, in NumPy (`checksums.HOST_BYTES`:
    no compilation per shape): the same fingerprint. 40,000 bytes: positions past 2**15."""
    monkeypatch.setattr(checksums, "HOST_BYTES", host_bytes)
    x = np.random.default_rng(1).standard_normal((100, 100)).astype(np.float32)
    # The formula, in NumPy uint64 arithmetic: byte b at row-major position i, weights odd.
    b = x.reshape(-1).view(np.uint8).astype(np.uint64)
    i = np.arange(b.size, dtype=np.uint64)
    m = np.uint64(2**32 - 1)
    w1 = ((i * np.uint64(0x9E3779B1) + np.uint64(0x7F4A7C15)) & m) | np.uint64(1)
    w2 = (((i ^ (i >> np.uint64(15))) * np.uint64(0x2C1B3C6D) + np.uint64(0x297A2D39)) & m) | 1
    want = f"float32:{int((b * w1).sum() & m):08x}{int((b * w2).sum() & m):08x}"
    assert checkpoint.fingerprint(x) == want
    mesh = mesh_lib.make_mesh(2, 4)
    for spec in [("data", "model"), ("model", None), ()]:
        sharded = jax.device_put(
            x, jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(*spec))
        )
        assert checkpoint.fingerprint(sharded) == want, spec
    for at in (0, 1, b.size // 2, b.size - 1):  # any one flipped bit changes it
        y = x.copy()
        y.reshape(-1).view(np.uint8)[at] ^= 0x80
        assert checkpoint.fingerprint(y) != want, at
    assert checkpoint.fingerprint(x.astype(jnp.bfloat16)).startswith("bfloat16:")
    for y in (x.astype(jnp.bfloat16), x[:3, :5].astype(np.int8), np.float32(2.5), x[:0]):
        monkeypatch.setattr(checksums, "HOST_BYTES", -1)
        on_device = checkpoint.fingerprint(jnp.asarray(y))
        monkeypatch.setattr(checksums, "HOST_BYTES", 1 << 24)
        assert checkpoint.fingerprint(jnp.asarray(y)) == checkpoint.fingerprint(y) == on_device


# --------------------------------------------------------------- Hugging Face: shards outside

D, F, V, H, KV, HD = 16, 32, 64, 2, 1, 8
CONFIG = {
    "model_type": "llama",
    "hidden_size": D,
    "intermediate_size": F,
    "vocab_size": V,
    "num_hidden_layers": 1,
    "num_attention_heads": H,
    "num_key_value_heads": KV,
    "max_position_embeddings": 32,
}
SHAPES = {  # transformers' modeling_llama names; nn.Linear stores [out, in]
    "model.embed_tokens.weight": (V, D),
    "model.norm.weight": (D,),
    "lm_head.weight": (V, D),
    "model.layers.0.input_layernorm.weight": (D,),
    "model.layers.0.post_attention_layernorm.weight": (D,),
    "model.layers.0.self_attn.q_proj.weight": (H * HD, D),
    "model.layers.0.self_attn.k_proj.weight": (KV * HD, D),
    "model.layers.0.self_attn.v_proj.weight": (KV * HD, D),
    "model.layers.0.self_attn.o_proj.weight": (D, H * HD),
    "model.layers.0.mlp.gate_proj.weight": (F, D),
    "model.layers.0.mlp.up_proj.weight": (F, D),
    "model.layers.0.mlp.down_proj.weight": (D, F),
}
SHARD_A = [n for n in SHAPES if "layers" not in n]  # the first shard: embeddings and norm


def _write_shards(where: str) -> tuple[str, str]:
    """Two safetensors shards of a 1-layer Llama under `where`; returns their paths."""
    rng = np.random.default_rng(0)
    tensors = {n: rng.standard_normal(s).astype(np.float32) for n, s in SHAPES.items()}
    os.makedirs(where, exist_ok=True)
    a, b = os.path.join(where, "model-1.safetensors"), os.path.join(where, "model-2.safetensors")
    save_file({n: tensors[n] for n in SHARD_A}, a)
    save_file({n: t for n, t in tensors.items() if n not in SHARD_A}, b)
    return a, b


def _hf_dir(path: str, second: str) -> str:
    """A checkpoint directory whose index maps the layer weights to the file named `second`."""
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(CONFIG, f)
    weight_map = {n: "model-1.safetensors" if n in SHARD_A else second for n in SHAPES}
    with open(os.path.join(path, safetensors.INDEX), "w") as f:
        json.dump({"metadata": {}, "weight_map": weight_map}, f)
    return path


def _hf_target(path: str):
    model = registry.build(safetensors.read_description(path), jnp.float32)
    shardings = mesh_lib.param_shardings(
        model.abstract_params, model.logical_axes, mesh_lib.make_mesh(2, 4), DEFAULT_RULES
    )
    return jax.tree.map(
        lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
        model.abstract_params,
        shardings,
    )


@pytest.fixture
def opened(monkeypatch) -> list[str]:
    """Every file that `ppl_jax.checkpoints.formats.safetensors` opens with `safe_open`, as real
    paths."""
    files: list[str] = []
    real_open = safetensors.safe_open

    def recording(file, *args, **kwargs):
        files.append(os.path.realpath(file))
        return real_open(file, *args, **kwargs)

    monkeypatch.setattr(safetensors, "safe_open", recording)
    return files


def _layout(tmp_path, how: str) -> tuple[str, str, str]:
    """(checkpoint dir, the index entry for the second shard, that shard's real path)."""
    ckpt = str(tmp_path / "models" / "tiny")
    inside, outside = _write_shards(ckpt)[1], _write_shards(str(tmp_path / "elsewhere"))[1]
    os.remove(inside)
    if how == "dotdot":
        return ckpt, "../../elsewhere/model-2.safetensors", outside
    if how == "absolute":
        return ckpt, outside, outside
    if how == "symlink":  # a plain name inside the directory, but a link that leads out
        os.symlink(outside, inside)
        return ckpt, "model-2.safetensors", outside
    if how == "linked_dir":  # a subdirectory that is a link out of the directory
        os.symlink(os.path.dirname(outside), os.path.join(ckpt, "sub"))
        return ckpt, "sub/model-2.safetensors", outside
    raise AssertionError(how)


@pytest.mark.parametrize("how", ["dotdot", "absolute", "symlink", "linked_dir"])
def test_index_naming_a_file_outside_is_refused_unread(tmp_path, opened, how):
    ckpt, entry, outside = _layout(tmp_path, how)
    _hf_dir(ckpt, entry)
    target = _hf_target(ckpt)
    with pytest.raises(CheckpointError) as e:
        safetensors.load_params(ckpt, target)
    index = os.path.join(ckpt, safetensors.INDEX)
    assert str(e.value).startswith(
        f"{index!r} names the shard {entry!r} (for 'model.layers.0.input_layernorm.weight'), "
        f"which lies outside the checkpoint directory {ckpt!r} (at {outside!r}); "
    ), str(e.value)
    assert opened == []  # refused before any weight file was opened


def test_shards_inside_the_directory_still_load(tmp_path, opened):
    # Controls for the refusal: a subdirectory and a link that stays inside are fine.
    ckpt = str(tmp_path / "ckpt")
    a, b = _write_shards(os.path.join(ckpt, "shards"))
    os.symlink(a, os.path.join(ckpt, "model-1.safetensors"))
    _hf_dir(ckpt, "shards/model-2.safetensors")
    params = safetensors.load_params(ckpt, _hf_target(ckpt))
    want = np.random.default_rng(0).standard_normal((V, D)).astype(np.float32)
    np.testing.assert_array_equal(np.asarray(params["embedding"]), want)
    assert set(opened) == {a, b}


def test_an_index_naming_the_wrong_shard_is_damage_named_by_weight_and_shard(tmp_path):
    """An index whose weight_map names a shard that does not hold the weight: one sentence
    naming both (was safetensors' raw SafetensorError), through the reader and the opener."""
    ckpt = str(tmp_path / "ckpt")
    _write_shards(ckpt)
    _hf_dir(ckpt, "model-2.safetensors")
    index = os.path.join(ckpt, safetensors.INDEX)
    with open(index) as f:
        data = json.load(f)
    data["weight_map"]["model.norm.weight"] = "model-2.safetensors"  # it is in model-1
    with open(index, "w") as f:
        json.dump(data, f)
    want = (
        f"{index!r} names the shard 'model-2.safetensors' for the weight 'model.norm.weight', "
        f"which that shard does not hold (it is in 'model-1.safetensors'): the index does not "
        f"match its shards"
    )
    with pytest.raises(CheckpointError) as e:
        safetensors.load_params(ckpt, _hf_target(ckpt))
    assert str(e.value).startswith(want), str(e.value)
    with pytest.raises(CheckpointError, match="names the shard 'model-2.safetensors' for the"):
        open_checkpoint(ckpt).restore(None, _hf_target(ckpt))


def test_hub_cache_snapshot_links_into_its_blobs(tmp_path):
    # The Hugging Face hub cache: snapshots/<revision>/* are links into the repository's blobs.
    repo = tmp_path / "models--org--tiny"
    a, b = _write_shards(str(repo / "blobs"))
    snapshot = str(repo / "snapshots" / "0123abc")
    _hf_dir(snapshot, "model-2.safetensors")
    os.symlink(os.path.relpath(a, snapshot), os.path.join(snapshot, "model-1.safetensors"))
    os.symlink(os.path.relpath(b, snapshot), os.path.join(snapshot, "model-2.safetensors"))
    params = safetensors.load_params(snapshot, _hf_target(snapshot))
    assert params["layers"]["0"]["mlp"]["up"].shape == (D, F)


def test_single_file_link_leading_out_is_refused(tmp_path, opened):
    outside = str(tmp_path / "elsewhere" / "model.safetensors")
    os.makedirs(os.path.dirname(outside))
    rng = np.random.default_rng(0)
    save_file({n: rng.standard_normal(s).astype(np.float32) for n, s in SHAPES.items()}, outside)
    ckpt = str(tmp_path / "ckpt")
    _hf_dir(ckpt, "unused")
    os.remove(os.path.join(ckpt, safetensors.INDEX))
    os.symlink(outside, os.path.join(ckpt, safetensors.SINGLE))
    with pytest.raises(CheckpointError, match="is a link, which lies outside the checkpoint"):
        safetensors.load_params(ckpt, _hf_target(ckpt))
    assert opened == []
