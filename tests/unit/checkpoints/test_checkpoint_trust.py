"""Nothing read from an Orbax checkpoint is trusted blindly (issue 19): links leading out of the
checkpoint folder are not followed, damaged `metadata` JSON and an unknown model family are one
sentence (exit 2 on the command line: tests/e2e/test_other_trainers_cli.py), and a `gs://`
checkpoint without the gcs extra too."""

from __future__ import annotations

import glob
import logging
import os
import shutil

import pytest
from absl import logging as absl_logging

from ppl_jax.checkpoints import architecture, open_checkpoint
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
    model = architecture.resolve(ckpt).model()
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
        architecture.resolve(open_checkpoint(str(own))).model()


def test_an_unknown_model_family_is_named_before_any_key(own):
    (own / "3" / "metadata" / "metadata").write_text('{"model": {"family": "mamba", "d": 1}}')
    ckpt = open_checkpoint(str(own))
    with pytest.raises(CheckpointError, match="unknown model family 'mamba'"):
        architecture.resolve(ckpt)  # was KeyError: 'embed_dim'
    with pytest.raises(CheckpointError, match="unknown model family 'mamba'"):
        architecture.resolve(ckpt).model()


def test_gcs_without_the_extra_is_one_sentence():
    try:
        import gcsfs  # noqa: F401
    except ImportError:
        with pytest.raises(ConfigError, match="'gs://bucket/run' cannot be read without gcsfs"):
            open_checkpoint("gs://bucket/run")
    else:
        pytest.skip("gcsfs is installed here")


# ------------------------------------------------------------- every reader, one check of links

TRAINERS = os.path.join(os.path.dirname(__file__), "..", "..", "golden", "trainers")


def _moved_out(path, outside):
    """`path` moved to the folder `outside` and replaced by a link to it."""
    outside.mkdir(exist_ok=True)
    target = outside / os.path.basename(path)
    shutil.move(path, target)
    os.symlink(target, path)


def _levanter(tmp_path):
    run = tmp_path / "levanter"
    shutil.copytree(os.path.join(TRAINERS, "levanter", "llama_scanned", "run"), run)
    arch = os.path.join(TRAINERS, "levanter", "llama_scanned", "description.json")
    return run, {"architecture": arch}


def _easydel(tmp_path):
    run = tmp_path / "easydel"
    shutil.copytree(os.path.join(TRAINERS, "easydel", "llama", "run"), run)
    return run, {}


def _t5x(tmp_path):
    run = tmp_path / "t5x"
    shutil.copytree(os.path.join(TRAINERS, "t5x", "model_dir"), run)
    t5x = os.path.join(TRAINERS, "t5x")
    return run, {"architecture": os.path.join(t5x, "description.json"),
                 "mapping": os.path.join(t5x, "mapping.yaml")}  # fmt: skip


@pytest.mark.parametrize(
    "layout, moved, step",
    [
        (_levanter, "step-2", 2),  # the step folder
        (_levanter, "step-1/manifest.ocdbt", 1),  # its OCDBT manifest
        (_easydel, "run-2/model/model/layers/0/self_attn/q_proj/kernel", 2),  # a leaf folder
        (_t5x, "checkpoint_2/target.decoder.layers_1.self_attention.out.kernel", 2),  # a leaf
    ],
)  # fmt: skip
def test_every_trainer_reader_refuses_a_link_out_of_its_checkpoint(tmp_path, layout, moved, step):
    run, options = layout(tmp_path)
    _moved_out(str(run / moved), tmp_path / "elsewhere")
    ckpt = open_checkpoint(str(run), **options)
    assert step in ckpt.steps()  # listed: a step's name is no file read
    want = rf"'{run / moved}' in the checkpoint '{run}' is a link to '{tmp_path}/elsewhere/"
    latest = None if step == max(ckpt.steps()) else step  # None: the latest step's folder
    for answer in (lambda: ckpt.stored(step), lambda: ckpt.layout_lines(latest)):
        with pytest.raises(CheckpointError, match=want):
            answer()
    other = min(ckpt.steps())  # the other step, without the link, is read
    if other != step:
        assert ckpt.stored(other)


def test_a_link_that_stays_inside_and_a_linked_run_folder_are_read(tmp_path):
    run, options = _levanter(tmp_path)
    shutil.move(str(run / "step-1" / "d"), str(run / "kept"))
    os.symlink(run / "kept", run / "step-1" / "d")  # inside the run folder
    os.symlink(run, tmp_path / "alias")
    ckpt = open_checkpoint(str(tmp_path / "alias"), **options)
    assert ckpt.stored(1) == open_checkpoint(
        os.path.join(TRAINERS, "levanter", "llama_scanned", "run"), **options
    ).stored(1)


def test_every_reader_runs_the_one_check_of_links():
    """A reader cannot forget it: every answer that opens files, in every reader the opener
    knows (and any subclass of `Checkpoint`), is wrapped in `check_links`."""
    from ppl_jax.checkpoints import links, opener
    from ppl_jax.checkpoints.checkpoint import Checkpoint

    def subclasses(cls):
        for sub in cls.__subclasses__():
            yield sub
            yield from subclasses(sub)

    readers = set(subclasses(Checkpoint))
    assert set(opener.READERS) <= readers
    for reader in readers:
        for name in links.OPENING:
            method = getattr(reader, name)
            if name in ("stored", "read") or name in vars(reader):
                assert getattr(method, "links_checked", False), (reader.__name__, name)


@pytest.mark.parametrize("linked, answer", [
    ("model.safetensors", lambda ckpt: ckpt.identity(None)),  # which samples the file's bytes
    ("config.json", lambda ckpt: ckpt.quantization(None)),  # which reads config.json
])  # fmt: skip
def test_the_identity_and_the_quantization_refuse_a_link_out(tmp_path, linked, answer):
    folder = tmp_path / "qwen2"
    shutil.copytree(os.path.join(TRAINERS, "..", "hf", "qwen2"), folder)
    _moved_out(str(folder / linked), tmp_path / "elsewhere")
    with pytest.raises(
        CheckpointError, match=rf"'{folder / linked}' in the checkpoint .* is a link"
    ):
        answer(open_checkpoint(str(folder)))


def test_the_check_walks_through_inside_links_once_and_finds_a_link_out_below_them(tmp_path):
    from ppl_jax.runtime import paths

    ckpt = tmp_path / "ckpt"
    (ckpt / "a" / "b").mkdir(parents=True)
    os.symlink(ckpt, ckpt / "a" / "loop")  # a cycle, inside: walked once
    paths.refuse_links_out(str(ckpt / "a"), str(ckpt))
    (tmp_path / "secret").write_text("x")
    (ckpt / "hidden").mkdir()
    os.symlink(tmp_path / "secret", ckpt / "hidden" / "file")
    os.symlink(ckpt / "hidden", ckpt / "a" / "b" / "via")  # an inside link to a folder ...
    with pytest.raises(
        CheckpointError, match=r"/file' in the checkpoint .* is a link to .*secret'"
    ):
        paths.refuse_links_out(str(ckpt / "a"), str(ckpt))  # ... holding a link out


def test_a_restore_prints_none_of_orbaxs_read_only_notices(own, caplog):
    """Orbax said "Given directory is read only" and two more lines per `CheckpointManager`,
    five times a restore: what ppl_jax asked for (read-only), so not shown; its other warnings
    are."""
    with caplog.at_level(logging.WARNING, logger="absl"):
        _restore(own)
        absl_logging.warning("a warning of Orbax's own")
    messages = [
        r.getMessage() for r in caplog.records if r.name == "absl" and r.levelno >= logging.WARNING
    ]
    assert not [m for m in messages if "read only" in m or "read_only" in m], messages
    assert "a warning of Orbax's own" in messages
