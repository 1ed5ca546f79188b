"""Every setting and file that could change a run's numbers is in its fingerprint, so that a run
stopped halfway and resumed with it changed refuses the journal (naming what changed) before any
weight is read, rather than adding the batches of two runs into one `nll_sum`; a setting that
changes no number resumes.

One run, read through a mapping file with an architecture file and stopped by a signal after a
few batches, leaves its journal; each case copies that journal into a fresh folder and runs again
with one thing changed. (tests/slow/test_resume_settings_cli.py kills a command-line run with
SIGKILL and edits its mapping file.)
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal

import pytest
from test_resume import signal_after

import ppl_jax
from ppl_jax.checkpoints import Checkpoint
from ppl_jax.config.defaults import DEFAULT_RULES, get_config
from ppl_jax.config.settings import from_config
from ppl_jax.errors import ConfigError, Interrupted
from ppl_jax.evaluation.run import evaluate
from ppl_jax.outputs import journal
from ppl_jax.outputs.folder import OutputDir
from ppl_jax.runtime import fingerprint

MAPPING = "rules:\n  - {from: '(?P<name>.*)', to: '{name}'}\n"
# The same weights, but the final norm doubled: another model, and other numbers.
SCALED = "rules:\n  - {from: final_norm, to: final_norm, scale: 2.0}\n" + MAPPING.split("\n", 1)[1]


@pytest.fixture(scope="module")
def world(tmp_path_factory, tiny_checkpoint):
    """A copy of the tiny checkpoint (steps 3 and 5), its architecture as a file, a mapping file
    of its own names, a corpus, and copies of the checkpoint and corpus elsewhere."""
    root = tmp_path_factory.mktemp("settings")
    shutil.copytree(tiny_checkpoint, root / "ckpt")
    shutil.copytree(tiny_checkpoint, root / "ckpt_copy")
    description = ppl_jax.open_checkpoint(str(root / "ckpt")).description(5)
    (root / "arch.json").write_text(json.dumps(description))
    (root / "map.yaml").write_text(MAPPING)
    text = "\n".join(f"line {i}: " + "the quick brown fox " * (i % 7) for i in range(120))
    (root / "text.txt").write_text(text)
    (root / "text_copy.txt").write_text(text)
    return root


def config(root, out, **overrides):
    c = get_config()
    c.checkpoint.dir = str(root / "ckpt")
    c.checkpoint.mapping = str(root / "map.yaml")
    c.checkpoint.architecture = str(root / "arch.json")
    c.data.path, c.data.format, c.data.tokenizer = str(root / "text.txt"), "lines", "byte"
    c.eval.seq_len, c.eval.stride, c.eval.batch_size = 32, 24, 8
    c.output.dir, c.output.progress, c.output.gzip_baseline = str(out), False, False
    c.output.journal_every = 1
    c.metrics.bootstrap_samples = 0
    for key, value in overrides.items():
        section, name = key.split("__")
        value = value(root) if callable(value) else value
        setattr(getattr(c, section), name, value)
    return c


@pytest.fixture(scope="module")
def killed(world) -> bytes:
    """The journal of the run stopped by SIGTERM after 3 batches (of about 20)."""
    out = world / "killed"
    with OutputDir.open(str(out)) as o, pytest.raises(Interrupted):
        evaluate(from_config(config(world, out)), signal_after(3, signal.SIGTERM), out=o)
    with journal_of(out) as done:
        assert 3 <= done.sum() < done.size
    return (out / journal.NAME).read_bytes()


@contextlib.contextmanager
def journal_of(out):
    import numpy as np

    with np.load(out / journal.NAME) as z:
        yield z["batch_done"]


@contextlib.contextmanager
def rewritten(path, text: str):
    """`path` holds `text` meanwhile; then its old bytes and times again."""
    old, st = path.read_bytes(), os.stat(path)
    path.write_text(text)
    try:
        yield
    finally:
        path.write_bytes(old)
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


@contextlib.contextmanager
def touched(path):
    """`path` with another modification time meanwhile (a file rewritten with the same size)."""
    st = os.stat(path)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    try:
        yield
    finally:
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def weights_file(root):
    step = root / "ckpt" / "5"
    return next(p for p in sorted(step.rglob("*")) if p.is_file())


def changed_description(root):
    description = json.loads((root / "arch.json").read_text())
    return rewritten(root / "arch.json", json.dumps({**description, "rope_theta": 20000.0}))


RULES = tuple((k, None if k == "mlp" else v) for k, v in DEFAULT_RULES)  # the MLP unsharded
# (what changes, the settings changed, a file changed meanwhile, the change the refusal names)
CASES = [
    ("checkpoint.dir", {"checkpoint__dir": lambda r: str(r / "ckpt_copy")}, None, "checkpoint.path"),
    ("checkpoint.step", {"checkpoint__step": "3"}, None, "checkpoint.step: 5 -> 3"),
    ("checkpoint.mapping preset", {"checkpoint__mapping": "identity"}, None, "checkpoint.mapping"),
    ("checkpoint.mapping file", {}, lambda r: rewritten(r / "map.yaml", SCALED), "checkpoint.mapping"),
    ("checkpoint.item", {"checkpoint__item": "state"}, None, 'checkpoint.item: null -> "state"'),
    ("checkpoint.params", {"checkpoint__params": "params"}, None, "checkpoint.params"),
    ("checkpoint.architecture file", {}, changed_description, "model.description"),
    ("checkpoint files", {}, lambda r: touched(weights_file(r)), "checkpoint.files"),
    ("data.path", {"data__path": lambda r: str(r / "text_copy.txt")}, None, "data.files"),
    ("data file", {}, lambda r: touched(r / "text.txt"), "data.files"),
    ("data.format", {"data__format": "text"}, None, "data.format"),
    ("data.errors", {"data__errors": "replace"}, None, "data.errors"),
    ("data.separator", {"data__separator": "\n"}, None, "data.separator"),
    ("data.jsonl_field", {"data__jsonl_field": "body"}, None, "data.jsonl_field"),
    ("data.preparation", {"data__format": "text", "data__preparation": "hf_guide_wikitext"},
     None, "data.preparation"),
    ("data.max_documents", {"data__max_documents": 100}, None, "data.max_documents"),
    ("data.max_tokens", {"data__max_tokens": 4000}, None, "data.max_tokens"),
    ("data.fingerprint", {"data__fingerprint": "content"}, None, "data.fingerprint"),
    ("eval.protocol", {"eval__protocol": "hf_strided"}, None, "protocol.name"),
    ("eval.seq_len", {"eval__seq_len": 40}, None, "protocol.seq_len: 32 -> 40"),
    ("eval.stride", {"eval__stride": 16}, None, "protocol.stride: 24 -> 16"),
    ("eval.batch_size", {"eval__batch_size": 16}, None, "layout.batch_size: 8 -> 16"),
    ("eval.packing", {"eval__packing": False}, None, "layout.packing: true -> false"),
    ("eval.length_buckets", {"eval__length_buckets": 2}, None, "layout.length_buckets: 1 -> 2"),
    ("model.dtype", {"model__dtype": "bfloat16"}, None, "model.dtype"),
    ("mesh.data and mesh.model", {"mesh__data": 4, "mesh__model": 2}, None,
     "mesh.data: 8 -> 4; mesh.model: 1 -> 2"),
    ("mesh.rules", {"mesh__rules": RULES}, None, "mesh.rules"),
]  # fmt: skip


@pytest.mark.parametrize(("what", "settings", "edit", "named"), CASES, ids=[c[0] for c in CASES])
def test_a_change_that_changes_the_numbers_refuses_the_journal(
    world, killed, tmp_path, monkeypatch, what, settings, edit, named
):
    (tmp_path / journal.NAME).write_bytes(killed)
    c = config(world, tmp_path, **settings)
    monkeypatch.setattr(Checkpoint, "restore", lambda *a, **k: pytest.fail("weights were read"))
    with edit(world) if edit else contextlib.nullcontext():
        with OutputDir.open(str(tmp_path)) as out, pytest.raises(ConfigError) as info:
            evaluate(from_config(c), out=out)
    message = str(info.value)
    assert "is the journal of another run, which differs in" in message and named in message


def test_another_environment_refuses_the_journal(world, killed, tmp_path, monkeypatch):
    """A resume on another platform, device or JAX version (which may round otherwise)."""
    (tmp_path / journal.NAME).write_bytes(killed)
    here = fingerprint.environment()
    monkeypatch.setattr(fingerprint, "environment", lambda: {**here, "device_kind": "TPU v5"})
    with OutputDir.open(str(tmp_path)) as out, pytest.raises(ConfigError, match="environment"):
        evaluate(from_config(config(world, tmp_path)), out=out)


def test_a_change_that_changes_no_number_resumes(world, killed, tmp_path):
    (tmp_path / journal.NAME).write_bytes(killed)
    c = config(
        world, tmp_path, model__attention="xla", output__journal_every=5, data__name="other",
        data__tags="domain=code", eval__add_bos="false", metrics__bootstrap_samples=200,
        data__sample_seed=3,  # a seed without a budget draws nothing
    )  # fmt: skip
    with OutputDir.open(str(tmp_path)) as out:
        ev = evaluate(from_config(c), out=out)
    assert ev.resumed_batches >= 3
    assert not (tmp_path / journal.NAME).exists()
