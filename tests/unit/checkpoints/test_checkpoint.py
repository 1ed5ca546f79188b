"""Orbax checkpoints (`ppl_jax.checkpoints.formats.orbax`): params-only restore onto a mesh,
metadata, errors."""

from __future__ import annotations

import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from ppl_jax.checkpoints.formats import orbax as checkpoint
from ppl_jax.config.defaults import DEFAULT_RULES
from ppl_jax.errors import CheckpointError
from ppl_jax.models import registry
from ppl_jax.runtime import mesh as mesh_lib

from helpers import TINY, random_params, save_random_checkpoint

# On a local filesystem Orbax finalizes a step by renaming `<step>.orbax-checkpoint-tmp-<time>`
# to `<step>` (its `commit_success.txt` marker is only consulted on object stores such as GCS).
TMP_SUFFIX = ".orbax-checkpoint-tmp-1700000000"


def flat(tree) -> dict:
    return {
        "/".join(str(k.key) for k in path): leaf
        for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]
    }


def targets(dtype):
    """The TINY model's params as ShapeDtypeStructs sharded over a 2 x 4 mesh."""
    model = registry.build(TINY.to_dict(), jnp.float32)
    mesh = mesh_lib.make_mesh(2, 4)
    shardings = mesh_lib.param_shardings(
        model.abstract_params, model.logical_axes, mesh, DEFAULT_RULES
    )
    return jax.tree.map(
        lambda a, s: jax.ShapeDtypeStruct(a.shape, dtype, sharding=s),
        model.abstract_params,
        shardings,
    )


def save_state(path, params, step: int = 1) -> None:
    """A training state (params + AdamW state) whose metadata describes TINY."""
    checkpoint.save_train_state(
        str(path),
        step,
        {"step": step, "params": params, "opt_state": optax.adamw(1e-3).init(params)},
        {"model": TINY.to_dict(), "tokenizer": {"type": "byte"}},
    )


# ------------------------------------------------------------------------------------- restore


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_restore_params_onto_another_mesh(tiny_checkpoint, dtype):
    saved = flat(random_params(TINY, seed=0))  # what the fixture saved at steps 3 and 5
    target = targets(dtype)
    params = checkpoint.restore_params(tiny_checkpoint, 5, target)

    got, want = flat(params), flat(target)
    assert sorted(got) == sorted(want) == sorted(saved)
    assert len(got) == 3 + 2 * 9  # embedding, final_norm, lm_head; 9 weights per layer
    for name, leaf in got.items():
        assert isinstance(leaf, jax.Array), name
        assert leaf.dtype == dtype, name
        assert leaf.shape == want[name].shape, name
        assert leaf.sharding.spec == want[name].sharding.spec, name
        assert leaf.sharding.mesh.shape == {"data": 2, "context": 1, "model": 4}, name
        expected = np.asarray(jnp.asarray(saved[name]).astype(dtype))
        np.testing.assert_array_equal(np.asarray(leaf), expected, err_msg=name)
    # The rules really split weights over `model`: 4 shards of the head, 2 KV heads replicated.
    assert got["lm_head"].sharding.spec == jax.sharding.PartitionSpec(None, "model")
    assert {s.data.shape for s in got["lm_head"].addressable_shards} == {(32, 64)}
    assert got["layers/0/attn/k"].sharding.spec == jax.sharding.PartitionSpec(None, None, None)
    # The norms were perturbed away from 1 before saving, so the restore read real values.
    assert not np.allclose(np.asarray(got["final_norm"], np.float32), 1.0)


def test_restore_params_reads_the_chosen_step(tmp_path):
    path = tmp_path / "ckpt"
    first = save_random_checkpoint(str(path), steps=(1,), seed=1)
    save_state(path, random_params(TINY, seed=2), step=2)
    target = targets(jnp.float32)
    one = checkpoint.restore_params(str(path), 1, target)
    two = checkpoint.restore_params(str(path), 2, target)
    np.testing.assert_array_equal(np.asarray(one["embedding"]), np.asarray(first["embedding"]))
    assert not np.array_equal(np.asarray(one["embedding"]), np.asarray(two["embedding"]))


# ------------------------------------------------------------------------------------ metadata


def test_read_metadata_takes_the_latest_step(tiny_checkpoint):
    step, meta = checkpoint.read_metadata(tiny_checkpoint, None)
    assert step == 5
    assert meta == {"model": TINY.to_dict(), "tokenizer": {"type": "byte"}}


def test_read_metadata_of_a_given_step(tiny_checkpoint):
    step, meta = checkpoint.read_metadata(tiny_checkpoint, 3)
    assert step == 3
    assert meta["model"]["max_positions"] == 128


def test_read_metadata_of_a_missing_step_lists_the_steps(tiny_checkpoint):
    with pytest.raises(CheckpointError) as e:
        checkpoint.read_metadata(tiny_checkpoint, 4)
    assert str(e.value) == (
        f"checkpoint.step=4 is not in {tiny_checkpoint!r}; its finalized steps are [3, 5]. "
        f"Set checkpoint.step to one of them, or to 'latest'."
    )


def test_read_metadata_of_an_empty_directory(tmp_path):
    with pytest.raises(CheckpointError) as e:
        checkpoint.read_metadata(str(tmp_path), None)
    assert str(e.value).startswith(
        f"checkpoint.dir {str(tmp_path)!r} holds no finalized checkpoint step"
    )
    assert "Point checkpoint.dir at a directory of saved steps." in str(e.value)


def test_unfinalized_steps_are_not_steps(tiny_checkpoint, tmp_path):
    # An interrupted save leaves the step under its temporary name.
    only_tmp = tmp_path / "only_tmp"
    only_tmp.mkdir()
    shutil.copytree(os.path.join(tiny_checkpoint, "5"), only_tmp / f"5{TMP_SUFFIX}")
    with pytest.raises(CheckpointError, match="holds no finalized checkpoint step"):
        checkpoint.read_metadata(str(only_tmp), None)
    with pytest.raises(CheckpointError, match="holds no finalized checkpoint step"):
        checkpoint.read_metadata(str(only_tmp), 5)

    mixed = tmp_path / "mixed"
    mixed.mkdir()
    shutil.copytree(os.path.join(tiny_checkpoint, "3"), mixed / "3")
    shutil.copytree(os.path.join(tiny_checkpoint, "5"), mixed / f"5{TMP_SUFFIX}")
    assert checkpoint.read_metadata(str(mixed), None)[0] == 3
    with pytest.raises(CheckpointError, match=r"its finalized steps are \[3\]"):
        checkpoint.read_metadata(str(mixed), 5)


def test_read_metadata_of_a_missing_directory(tmp_path):
    path = str(tmp_path / "nowhere")
    with pytest.raises(CheckpointError) as e:
        checkpoint.read_metadata(path, None)
    assert str(e.value) == (
        f"checkpoint.dir: no such directory {path!r}. Give an Orbax checkpoint directory "
        f"(numbered step folders inside)."
    )
    assert not os.path.exists(path)  # reading never creates the directory


def test_step_without_metadata_item(tiny_checkpoint, tmp_path):
    shutil.copytree(os.path.join(tiny_checkpoint, "5"), tmp_path / "5")
    shutil.rmtree(tmp_path / "5" / checkpoint.METADATA)
    with pytest.raises(CheckpointError, match=r"step 5 of .* has no 'metadata' item"):
        checkpoint.read_metadata(str(tmp_path), None)


# ----------------------------------------------------------------------------- weight mismatch


def test_missing_weight_is_named(tmp_path):
    params = random_params(TINY)
    del params["layers"]["0"]["mlp"]["up"]
    save_state(tmp_path, params)
    with pytest.raises(CheckpointError) as e:
        checkpoint.restore_params(str(tmp_path), 1, targets(jnp.float32))
    assert str(e.value) == (
        f"step 1 of {str(tmp_path)!r} does not match the stored architecture: "
        f"'layers/0/mlp/up' is missing. The checkpoint is partial or belongs to another model."
    )


def test_misshapen_weight_is_named(tmp_path):
    params = random_params(TINY)
    params["layers"]["1"]["attn"]["q"] = params["layers"]["1"]["attn"]["q"][:, :, :4]
    save_state(tmp_path, params)
    with pytest.raises(CheckpointError) as e:
        checkpoint.restore_params(str(tmp_path), 1, targets(jnp.float32))
    assert "'layers/1/attn/q' has shape (32, 4, 4), the architecture says (32, 4, 8)" in str(
        e.value
    )


def test_every_bad_weight_is_named(tmp_path):
    params = random_params(TINY)
    del params["lm_head"]
    params["final_norm"] = params["final_norm"][:16]
    save_state(tmp_path, params)
    with pytest.raises(CheckpointError) as e:
        checkpoint.restore_params(str(tmp_path), 1, targets(jnp.bfloat16))
    msg = str(e.value)
    assert "'final_norm' has shape (16,), the architecture says (32,)" in msg
    assert "'lm_head' is missing" in msg
