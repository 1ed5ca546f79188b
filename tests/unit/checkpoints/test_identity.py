"""`Checkpoint.identity(step)`: what names a checkpoint's weights in a run's fingerprint, answered
by its reader (issue 25.1: nothing outside `ppl_jax/checkpoints` asks which kind a checkpoint
is). The files of the step, the mapping file's content, and the source module of an entry point
are in it; and no module outside the checkpoints package switches on a checkpoint's format."""

import os
import pathlib
import re
import shutil

import pytest

from ppl_jax.checkpoints import open_checkpoint

import helpers

GOLDEN_HF = os.path.join(helpers.GOLDEN, "hf")
V1_RUN = os.path.join(helpers.GOLDEN, "readers", "orbax_v1_run", "checkpoints")
PACKAGE = pathlib.Path(__file__).resolve().parents[3] / "ppl_jax"


def test_the_files_of_the_step_are_in_the_identity(tmp_path):
    path = str(tmp_path / "ckpt")
    helpers.save_random_checkpoint(path, steps=(3, 7))
    ckpt = open_checkpoint(path)
    three, seven = ckpt.identity(3), ckpt.identity(7)
    assert three["path"] == os.path.abspath(path) and three["step"] == 3
    assert three["format"] == "orbax" and three["files"] != seven["files"]
    # A file of step 3 rewritten: step 3's identity changes, step 7's does not.
    name = next(f for f in sorted((tmp_path / "ckpt" / "3").rglob("*")) if f.is_file())
    name.write_bytes(name.read_bytes() + b"\0")
    assert ckpt.identity(3)["files"] != three["files"]
    assert ckpt.identity(7) == seven


def test_a_hugging_face_directory_names_its_folder(tmp_path):
    folder = tmp_path / "llama"
    shutil.copytree(os.path.join(GOLDEN_HF, "llama"), folder)
    identity = open_checkpoint(str(folder)).identity(None)
    assert identity["format"] == "hf" and identity["step"] is None
    (folder / "config.json").write_text((folder / "config.json").read_text() + "\n")
    assert open_checkpoint(str(folder)).identity(None)["files"] != identity["files"]


def same_size_and_time(path: pathlib.Path, at: int) -> None:
    """One byte of `path` changed at `at`, its size and modification time kept."""
    raw, st = bytearray(path.read_bytes()), path.stat()
    raw[at] ^= 0xFF
    path.write_bytes(bytes(raw))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


@pytest.mark.parametrize("kind", ["gguf", "safetensors"])
def test_a_weights_file_rewritten_with_its_size_and_time_kept_is_another_identity(tmp_path, kind):
    """A file replaced by another of the same size, its modification time set back: its
    sampled blocks tell (the last byte of the file is in the last one)."""
    if kind == "gguf":
        path = tmp_path / "model.gguf"
        shutil.copy(os.path.join(helpers.GOLDEN, "gguf", "qwen3.gguf"), path)
        checkpoint = str(path)
    else:
        shutil.copytree(os.path.join(GOLDEN_HF, "qwen2"), tmp_path / "qwen2")
        path = tmp_path / "qwen2" / "model.safetensors"
        checkpoint = str(tmp_path / "qwen2")
    before = open_checkpoint(checkpoint).identity(None)
    same_size_and_time(path, path.stat().st_size - 1)
    assert open_checkpoint(checkpoint).identity(None)["files"] != before["files"]


def test_orbax_v1_steps_are_named_by_their_own_folder():
    ckpt = open_checkpoint(V1_RUN)
    assert ckpt.identity(1)["files"] != ckpt.identity(2)["files"]


def test_a_mapping_file_is_named_by_its_content_and_a_preset_by_its_name(tmp_path):
    path = str(tmp_path / "ckpt")
    helpers.save_random_checkpoint(path, steps=(1,))
    mapping = tmp_path / "mapping.yaml"
    mapping.write_text("rules:\n  - {from: '(.*)', to: '\\1'}\n")
    first = open_checkpoint(path, mapping=str(mapping)).identity(1)["mapping"]
    mapping.write_text("rules:\n  - {from: '(.+)', to: '\\1'}\n")
    assert open_checkpoint(path, mapping=str(mapping)).identity(1)["mapping"] != first
    assert open_checkpoint(path, mapping="identity").identity(1)["mapping"] == "identity"
    assert "mapping" not in open_checkpoint(path).identity(1)


def test_no_module_outside_the_checkpoints_package_asks_the_format():
    """A switch on `.format` of a checkpoint (or on `kind()`) outside `ppl_jax/checkpoints`
    would let the harness, the command line and the library drift apart again."""
    switch = re.compile(r"(ckpt|checkpoint)\w*\.(format|kind\(\))\s*(==|!=|in\b)")
    found = [
        f"{source.relative_to(PACKAGE)}:{n}"
        for source in PACKAGE.rglob("*.py")
        if "checkpoints" not in source.relative_to(PACKAGE).parts
        for n, line in enumerate(source.read_text().splitlines(), 1)
        if switch.search(line)
    ]
    assert found == []
