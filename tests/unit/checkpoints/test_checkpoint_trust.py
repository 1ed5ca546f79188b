"""Nothing read from an Orbax checkpoint is trusted blindly (issue 19): links leading out of the
checkpoint folder are not followed, damaged `metadata` JSON and an unknown model family are one
sentence (exit 2 on the command line: tests/e2e/test_other_trainers_cli.py), and a `gs://`
checkpoint without the gcs extra too."""

from __future__ import annotations

import glob
import os
import shutil

import pytest

from ppl_jax.checkpoints import open_checkpoint
from ppl_jax.config.defaults import DEFAULT_RULES
from ppl_jax.errors import CheckpointError, ConfigError
from ppl_jax.runtime import mesh as mesh_lib
from ppl_jax.testing import save_random_checkpoint


@pytest.fixture
def own(tmp_path):
    path = tmp_path / "models" / "ckpt"
    save_random_checkpoint(str(path), steps=(3,))
    return path


def _restore(path):
    ckpt = open_checkpoint(str(path))
    model = ckpt.model()
    mesh = mesh_lib.make_mesh(-1, 1)
    target = mesh_lib.param_targets(model.abstract_params, model.logical_axes, mesh, DEFAULT_RULES)[
        0
    ]
    return ckpt.restore(3, target)


def test_a_linked_array_file_leading_out_is_not_followed(own, tmp_path):
    (data,) = glob.glob(str(own / "3" / "state" / "d" / "*"))
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    shutil.move(data, outside / "chunk")
    os.symlink(outside / "chunk", data)
    with pytest.raises(CheckpointError, match=r"is a link to .*elsewhere/chunk', outside the "
                       r"checkpoint folder; ppl_jax reads no file outside it"):  # fmt: skip
        _restore(own)


def test_a_linked_item_folder_leading_out_is_not_followed(own, tmp_path):
    shutil.move(own / "3" / "state", tmp_path / "state")
    os.symlink(tmp_path / "state", own / "3" / "state")
    with pytest.raises(CheckpointError, match="outside the checkpoint folder"):
        _restore(own)


def test_links_inside_the_folder_and_a_linked_checkpoint_folder_are_fine(own, tmp_path):
    os.symlink(own, tmp_path / "alias")  # the checkpoint folder itself may be a link
    (data,) = glob.glob(str(own / "3" / "state" / "d" / "*"))
    shutil.move(data, own / "kept")
    os.symlink(own / "kept", data)  # a link that stays inside
    assert _restore(tmp_path / "alias")


@pytest.mark.parametrize(
    "text, message",
    [
        ("{not json", r"its 'metadata' item is not readable JSON"),
        ("[1, 2]", r"its 'metadata' item holds no 'model' description object"),
        ('"a string"', r"its 'metadata' item holds no 'model' description object"),
    ],
)
def test_damaged_metadata_is_one_sentence(own, text, message):
    (own / "3" / "metadata" / "metadata").write_text(text)
    with pytest.raises(CheckpointError, match=rf"step 3 of .* is damaged: {message}"):
        open_checkpoint(str(own)).model()


def test_an_unknown_model_family_is_named_before_any_key(own):
    (own / "3" / "metadata" / "metadata").write_text('{"model": {"family": "mamba", "d": 1}}')
    ckpt = open_checkpoint(str(own))
    with pytest.raises(CheckpointError, match="unknown model family 'mamba'"):
        ckpt.attention("auto", "float32")  # was KeyError: 'embed_dim'
    with pytest.raises(CheckpointError, match="unknown model family 'mamba'"):
        ckpt.model()


def test_gcs_without_the_extra_is_one_sentence():
    try:
        import gcsfs  # noqa: F401
    except ImportError:
        with pytest.raises(ConfigError, match="'gs://bucket/run' cannot be read without gcsfs"):
            open_checkpoint("gs://bucket/run")
    else:
        pytest.skip("gcsfs is installed here")
