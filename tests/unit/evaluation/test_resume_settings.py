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
from ppl_jax.evaluation.run.setup import set_up
from ppl_jax.outputs import journal
from ppl_jax.outputs.folder import OutputDir
from ppl_jax.runtime import fingerprint

import helpers

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


@contextlib.contextmanager
def edited(path):
    """`path` with its first byte changed meanwhile, its size and times kept (a file replaced by
    another of the same size, its time set back)."""
    old, st = path.read_bytes(), os.stat(path)
    path.write_bytes(bytes([old[0] ^ 0xFF]) + old[1:])
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    try:
        yield
    finally:
        path.write_bytes(old)
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def largest_weights_file(root):
    return max((p for p in (root / "ckpt" / "5").rglob("*") if p.is_file()),
               key=lambda p: (p.stat().st_size, str(p)))  # fmt: skip


def weights_file(root):
    step = root / "ckpt" / "5"
    return next(p for p in sorted(step.rglob("*")) if p.is_file())


def changed_description(root):
    description = json.loads((root / "arch.json").read_text())
    return rewritten(root / "arch.json", json.dumps({**description, "rope_theta": 20000.0}))


@contextlib.contextmanager
def smaller_logits_budget(root):
    """A budget of 4 kB for a block of logits: the NLL takes one token of each row at once."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("ppl_jax.scoring.step.LOGITS_BUDGET", 4096)
        yield


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
    ("checkpoint content, same size and time", {}, lambda r: edited(largest_weights_file(r)),
     "checkpoint.files"),
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
    # 353 windows in 2 batches of 178 rows, not of 352: the rows shared out are named.
    ("the rows shared out", {"eval__batch_size": 352, "mesh__data": 2, "mesh__model": 4}, None,
     "layout.rows: null -> 178"),
    ("model.dtype", {"model__dtype": "bfloat16"}, None, "model.dtype"),
    ("model.rope_angles", {"model__rope_angles": "exact"}, None, "model.description"),
    ("model.matmul_precision", {"model__matmul_precision": "default"}, None,
     'model.matmul_precision: "highest" -> "default"'),
    ("mesh.data and mesh.model", {"mesh__data": 4, "mesh__model": 2}, None,
     "mesh.data: 8 -> 4; mesh.model: 1 -> 2"),
    ("mesh.rules", {"mesh__rules": RULES}, None, "mesh.rules"),
    ("mesh.context", {"mesh__data": 2, "mesh__context": 4}, None, "mesh.context: null -> 4"),
    ("model.token_chunk", {"model__token_chunk": 8}, None, "mesh.token_chunk: null -> 8"),
    ("the NLL's own chunk", {}, smaller_logits_budget, "mesh.nll_chunk: null -> [1]"),
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


@pytest.fixture(scope="module")
def killed_whole(world) -> bytes:
    """The journal of a `whole_documents` run (its long lines cut into sliding windows) stopped
    by SIGTERM after 3 batches."""
    out = world / "killed_whole"
    c = config(world, out, **WHOLE)
    with OutputDir.open(str(out)) as o, pytest.raises(Interrupted):
        evaluate(from_config(c), signal_after(3, signal.SIGTERM), out=o)
    with journal_of(out) as done:
        assert 3 <= done.sum() < done.size
    return (out / journal.NAME).read_bytes()


WHOLE = {"eval__protocol": "whole_documents", "eval__long_documents": "sliding"}
WHOLE_CASES = [
    ("eval.long_documents", {"eval__long_documents": "truncate"}, 'protocol.long_documents: "sliding" -> "truncate"'),
    ("eval.stride", {"eval__stride": 16}, "protocol.stride: 24 -> 16"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("what", "settings", "named"), WHOLE_CASES, ids=[c[0] for c in WHOLE_CASES]
)
def test_a_change_of_whole_documents_refuses_the_journal(
    world, killed_whole, tmp_path, monkeypatch, what, settings, named
):
    (tmp_path / journal.NAME).write_bytes(killed_whole)
    c = config(world, tmp_path, **{**WHOLE, **settings})
    monkeypatch.setattr(Checkpoint, "restore", lambda *a, **k: pytest.fail("weights were read"))
    with OutputDir.open(str(tmp_path)) as out, pytest.raises(ConfigError) as info:
        evaluate(from_config(c), out=out)
    message = str(info.value)
    assert "is the journal of another run, which differs in" in message and named in message


@pytest.fixture(scope="module")
def longppl_world(tmp_path_factory):
    """The LongPPL golden's two tiny Llamas (the model and an evaluator with its own tokenizer),
    copied, with a copy of the evaluator elsewhere."""
    root = tmp_path_factory.mktemp("longppl")
    folder = os.path.join(helpers.GOLDEN, "longppl")
    shutil.copytree(folder, root / "golden")
    shutil.copytree(os.path.join(folder, "evaluator"), root / "evaluator_copy")
    return root


def long_context_fingerprint(root, **overrides) -> dict:
    """The fingerprint of a `whole_documents` run with the long-context measures and LongPPL's
    evaluator (set up only: no weight is read)."""
    c = get_config()
    c.checkpoint.dir = str(root / "golden" / "model")
    c.data.path, c.data.format = str(root / "golden" / "documents.jsonl"), "jsonl"
    c.eval.protocol, c.eval.seq_len = "whole_documents", 768
    c.eval.short_context, c.eval.short_targets = 32, 16
    c.longppl.evaluator.dir = str(root / "golden" / "evaluator")
    for key, value in overrides.items():
        *sections, name = key.split("__")
        node = c
        for section in sections:
            node = getattr(node, section)
        setattr(node, name, value(root) if callable(value) else value)
    p = set_up(from_config(c), None)
    return p.fingerprint(p.datasets[0], p.first_step)


# A run with the long-context measures keeps no journal (as every run with diagnostics), but
# their settings and LongPPL's evaluator decide its numbers: they are in its fingerprint (the
# results' record), and a change is named.
LONG_CONTEXT_CASES = [
    ("eval.short_context", {"eval__short_context": 64}, "protocol.long_context"),
    ("eval.short_targets", {"eval__short_targets": 8}, "protocol.long_context"),
    ("longppl.alpha", {"longppl__alpha": 1.5}, "protocol.long_context"),
    ("longppl.beta", {"longppl__beta": -3.0}, "protocol.long_context"),
    ("longppl.evaluator.dir", {"longppl__evaluator__dir": lambda r: str(r / "evaluator_copy")},
     "protocol.long_context"),
    ("longppl.evaluator.dtype", {"longppl__evaluator__dtype": "bfloat16"}, "protocol.long_context"),
    ("the evaluator's files", {}, "protocol.long_context"),
]  # fmt: skip


def test_the_long_context_settings_are_in_the_fingerprint(longppl_world, monkeypatch):
    monkeypatch.setattr(Checkpoint, "restore", lambda *a, **k: pytest.fail("weights were read"))
    base = long_context_fingerprint(longppl_world)
    assert long_context_fingerprint(longppl_world) == base
    for what, settings, named in LONG_CONTEXT_CASES:
        edit = contextlib.nullcontext()
        if not settings:  # a weights file of the evaluator rewritten
            edit = touched(longppl_world / "golden" / "evaluator" / "model.safetensors")
        with edit:
            changed = long_context_fingerprint(longppl_world, **settings)
        found = fingerprint.differences(base, changed)
        assert found and all(f.startswith(named) for f in found), (what, found)
    without = long_context_fingerprint(
        longppl_world, eval__short_context=0, longppl__evaluator__dir=""
    )
    assert "long_context" not in without["protocol"]  # other runs' fingerprints as before
    assert {k: v for k, v in base["protocol"].items() if k != "long_context"} == without["protocol"]


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
