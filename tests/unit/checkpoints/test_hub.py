"""Hub ids resolved offline from a hand-made hub cache (refs, snapshots linking into blobs, as
huggingface_hub lays it out; docs/other-trainers.md): revisions as steps, the commit recorded, unknown
revisions and pickled weights refused in one sentence."""

from __future__ import annotations

import hashlib
import os
import shutil

import numpy as np
import pytest

from ppl_jax.checkpoints import architecture, open_checkpoint
from ppl_jax.checkpoints.formats import hub
from ppl_jax.checkpoints.readers.huggingface import HubRepo
from ppl_jax.config import defaults, settings
from ppl_jax.errors import CheckpointError, ConfigError
from ppl_jax.evaluation.run import setup

HF_LLAMA = os.path.join(os.path.dirname(__file__), "..", "..", "golden", "hf", "llama")


def add_revision(cache, repo, branch, files: dict[str, str]) -> str:
    """A snapshot of `files` (name -> source path) under refs/<branch>; returns its commit."""
    folder = cache / ("models--" + repo.replace("/", "--"))
    commit = hashlib.sha1(f"{repo}@{branch}".encode()).hexdigest()
    (folder / "refs").mkdir(parents=True, exist_ok=True)
    (folder / "refs" / branch).write_text(commit)  # no newline, as huggingface_hub writes
    snap = folder / "snapshots" / commit
    snap.mkdir(parents=True, exist_ok=True)
    (folder / "blobs").mkdir(exist_ok=True)
    for name, src in files.items():
        data = open(src, "rb").read()
        blob = folder / "blobs" / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        os.symlink(os.path.relpath(blob, snap), snap / name)
    return commit


@pytest.fixture
def cache(tmp_path, monkeypatch):
    root = tmp_path / "hub"
    monkeypatch.setenv("HF_HUB_CACHE", str(root))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    files = {n: os.path.join(HF_LLAMA, n) for n in os.listdir(HF_LLAMA)}
    for branch in ("main", "step1000", "step2000"):
        add_revision(root, "org/tiny", branch, files)
    pickled = {"config.json": os.path.join(HF_LLAMA, "config.json")}
    (tmp_path / "pytorch_model.bin").write_bytes(b"not read")
    pickled["pytorch_model.bin"] = str(tmp_path / "pytorch_model.bin")
    add_revision(root, "org/tiny", "step3000", pickled)
    return root


def test_hub_id_resolves_offline_with_its_commit(cache):
    ckpt = open_checkpoint("hf://org/tiny@step1000")
    assert isinstance(ckpt, HubRepo) and ckpt.format == "hub"
    commit = hashlib.sha1(b"org/tiny@step1000").hexdigest()
    identity = ckpt.identity(None)
    assert {k: identity[k] for k in ("repo", "revision", "commit", "format")} == {
        "repo": "org/tiny",
        "revision": "step1000",
        "commit": commit,
        "format": "hub",
    }
    assert ckpt.description() == open_checkpoint(HF_LLAMA).description()
    # A bare org/name that is not a path is a hub id too.
    assert hub.is_hub_id("org/tiny") and not hub.is_hub_id(HF_LLAMA)
    assert open_checkpoint("org/tiny").identity(None)["revision"] == "main"


def test_revisions_are_steps_and_restore_like_the_directory(cache):
    from ppl_jax.config.defaults import DEFAULT_RULES
    from ppl_jax.models.interface import weight_paths
    from ppl_jax.runtime import mesh as mesh_lib

    ckpt = open_checkpoint("hf://org/tiny")
    assert ckpt.steps() == [1000, 2000, 3000]
    model = architecture.resolve(ckpt).model()
    mesh = mesh_lib.make_mesh(-1, 1)
    target = mesh_lib.param_targets(model.abstract_params, model.logical_axes, mesh, DEFAULT_RULES)[
        0
    ]
    want = weight_paths(open_checkpoint(HF_LLAMA).restore(None, target))
    got = weight_paths(ckpt.restore(2000, target))
    for name in want:
        np.testing.assert_array_equal(np.asarray(got[name]), np.asarray(want[name]))


def test_unknown_revisions_repos_and_pickles_are_one_sentence(cache):
    with pytest.raises(CheckpointError, match=r"hub revision 'step5' of 'org/tiny': it is not "
                       r"in the local hub cache .*checkpoint.allow_download=true"):  # fmt: skip
        open_checkpoint("hf://org/tiny@step5").resolve_step(None)
    with pytest.raises(CheckpointError, match="hub revision 'main' of 'org/none'"):
        open_checkpoint("hf://org/none").description()
    with pytest.raises(CheckpointError, match=r"holds only pickled weights \(pytorch_model.bin\); "
                       r"ppl_jax reads safetensors only"):  # fmt: skip
        open_checkpoint("hf://org/tiny").resolve_step(3000)
    with pytest.raises(ConfigError, match="is not a hub id"):
        open_checkpoint("hf://not a repo")


def test_settings_keep_a_hub_id_and_its_reader_resolves_it(cache):
    c = defaults.get_config()
    c.checkpoint.dir = "hf://org/tiny@step2000"
    spec = settings.from_config(c)
    assert spec.checkpoint_dir == "hf://org/tiny@step2000"  # the config reads nothing
    ckpt = open_checkpoint(spec.checkpoint_dir)
    commit = hashlib.sha1(b"org/tiny@step2000").hexdigest()
    # The revision's commit is in the fingerprint (`identity`) and in results.json.
    assert isinstance(ckpt, HubRepo) and ckpt.identity(None)["commit"] == commit
    c.checkpoint.step = "step1000,step2000"
    spec = settings.from_config(c)
    assert spec.steps.steps == (1000, 2000) and spec.steps.kind == "list"
    ckpt = open_checkpoint(spec.checkpoint_dir)
    assert ckpt.steps() == [1000, 2000, 3000]  # the repository's step revisions
    # The sweep's fingerprint records each revision's commit.
    assert ckpt.identity(1000)["commit"] == hashlib.sha1(b"org/tiny@step1000").hexdigest()
    shutil.rmtree(cache / "models--org--tiny")
    spec = settings.from_config(c)  # still nothing read
    with pytest.raises(CheckpointError, match="'org/tiny': it is not in the local hub cache"):
        setup.check(spec, open_checkpoint(spec.checkpoint_dir))


def test_a_ref_naming_a_folder_outside_the_cache_is_refused(cache, tmp_path):
    # refs/main names '../../../elsewhere', a folder of weights outside the cache (it
    # was read and scored as the hub id): one sentence, from the library and from a run's
    # first read (the settings read nothing).
    elsewhere = tmp_path / "elsewhere"
    shutil.copytree(HF_LLAMA, elsewhere)
    ref = cache / "models--org--tiny" / "refs" / "main"
    ref.write_text(os.path.relpath(elsewhere, cache / "models--org--tiny" / "snapshots"))
    with pytest.raises(CheckpointError) as e:
        open_checkpoint("hf://org/tiny").description()
    assert str(e.value).startswith("hub revision 'main' of 'org/tiny' resolves to ")
    assert "outside the hub cache's snapshots" in str(e.value) and "refs/main" in str(e.value)
    c = defaults.get_config()
    c.checkpoint.dir = "hf://org/tiny"
    spec = settings.from_config(c)
    with pytest.raises(CheckpointError, match="outside the hub cache's snapshots"):
        open_checkpoint(spec.checkpoint_dir).resolve_step(spec.checkpoint_step)
    # A snapshot that is itself a link out of the cache is refused the same way.
    commit = ref.read_text()
    ref.write_text("b" * 40)
    os.symlink(elsewhere, cache / "models--org--tiny" / "snapshots" / ("b" * 40))
    with pytest.raises(CheckpointError, match="outside the hub cache's snapshots"):
        open_checkpoint("hf://org/tiny").description()
    assert commit
