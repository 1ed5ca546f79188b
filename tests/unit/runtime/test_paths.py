"""Paths beyond the local disk (`ppl_jax.runtime.paths`): corpora, fingerprints, output folders and
checkpoints at `gs://`, and gzip/zstd-compressed corpora.

`gs://` is faked with fsspec's own `DirFileSystem` over a local folder, registered as fsspec's
`gs`/`gcs` implementation: `etils.epath` (and fsspec's `url_to_fs`) then reach it through their
real backends, exactly as they reach `gcsfs` on Google Cloud. Nothing of ppl_jax is mocked.
Orbax itself cannot be pointed at the fake (for `gs://` it asks `google-cloud-storage` about the
bucket, and TensorStore reads arrays with its own GCS client), so checkpoints are saved locally
and copied there, and only ppl_jax's own checks around Orbax are run on them.
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
import sys
import time

import jax
import numpy as np
import pytest
import zstandard
from etils.epath import backend as epath_backend
from fsspec.implementations.dirfs import DirFileSystem
from fsspec.implementations.local import LocalFileSystem
from fsspec.registry import _registry as fsspec_registry

from ppl_jax import tokenizer as tokenizer_lib
from ppl_jax.checkpoints.formats import orbax as checkpoint
from ppl_jax.checkpoints.formats import safetensors
from ppl_jax.data import documents as data
from ppl_jax.errors import CheckpointError, ConfigError, DataError
from ppl_jax.outputs import folder as outputs
from ppl_jax.runtime import fingerprint, paths

import helpers

DOCS = ["first doc, ASCII.\n", "zweites Dokument: Grüße, 日本語 ✓", "", "third\r\nwith CRLF\n"]
GOLDEN_HF = os.path.join(helpers.GOLDEN, "hf")


@pytest.fixture
def bucket(tmp_path, monkeypatch):
    """A fake `gs://` whose objects are the files below `tmp_path/'gcs'` (`gs://b/x` is
    `tmp_path/gcs/b/x`); returns that local folder."""
    root = tmp_path / "gcs"
    root.mkdir()

    class FakeGCS(DirFileSystem):
        protocol = ("gs", "gcs")
        cachable = False

        def __init__(self, *args, **kwargs):  # gcsfs's options (finalize_on_close) are ignored
            super().__init__(path=str(root), fs=LocalFileSystem())

    for name in ("gs", "gcs"):
        monkeypatch.setitem(fsspec_registry, name, FakeGCS)  # undone after the test
    epath_backend.fsspec_backend._get_filesystem.cache_clear()  # epath caches the filesystem
    yield root
    epath_backend.fsspec_backend._get_filesystem.cache_clear()


def write_corpus(folder, compress: str) -> dict[str, str]:
    """The corpus in `text`, `lines` and `jsonl` files, compressed with `compress` ("" / "gz" /
    "zst"); returns format -> glob (relative to `folder`)."""
    folder.mkdir(parents=True, exist_ok=True)
    suffix = f".{compress}" if compress else ""
    pack = {
        "": lambda b: b,
        "gz": gzip.compress,
        "zst": zstandard.ZstdCompressor().compress,
    }[compress]
    files = {}
    for i, doc in enumerate(DOCS):
        files[f"t{i}.txt{suffix}"] = doc
    files[f"l.lines{suffix}"] = "\n".join(d for d in DOCS if "\r" not in d)
    files[f"j.jsonl{suffix}"] = "".join(json.dumps({"text": d}) + "\n" for d in DOCS)
    for name, text in files.items():
        (folder / name).write_bytes(pack(text.encode("utf-8")))
    return {"text": f"t*.txt{suffix}", "lines": f"l.lines{suffix}", "jsonl": f"j.jsonl{suffix}"}


def expected_texts(fmt: str) -> list[str]:
    """What each format's documents are, from DOCS alone."""
    if fmt == "text":
        return DOCS
    if fmt == "jsonl":
        return DOCS
    return [line for d in DOCS if "\r" not in d for line in d.split("\n") if line.strip()]


# ------------------------------------------------------------------------------------- corpora


@pytest.mark.parametrize("compress", ["", "gz", "zst"])
def test_remote_corpus_reads_as_the_local_one(bucket, tmp_path, compress):
    local = tmp_path / "local"
    globs = write_corpus(local, compress)
    shutil.copytree(local, bucket / "b" / "corpus")
    for fmt, pattern in globs.items():
        here = data.read_documents(str(local / pattern), fmt)
        there = data.read_documents(f"gs://b/corpus/{pattern}", fmt)
        assert [d.text for d in here] == expected_texts(fmt)
        assert [d.text for d in there] == expected_texts(fmt)
        # Same sources, with the remote prefix in place of the local folder.
        assert [d.source.replace(str(local), "gs://b/corpus") for d in here] == [
            d.source for d in there
        ]
    # Bits per byte count the decompressed text: the bytes of the documents are the original's.
    docs = data.read_documents(f"gs://b/corpus/{globs['text']}", "text")
    assert sum(len(d.text.encode()) for d in docs) == sum(len(d.encode()) for d in DOCS)


def test_remote_lists_and_globs(bucket, tmp_path):
    write_corpus(bucket / "b" / "c" / "x", "")
    write_corpus(bucket / "b" / "c" / "y", "gz")
    got = data.resolve_paths("gs://b/c/*/t1.txt*, gs://b/c/x/t0.txt,gs://b/c/x/t1.txt")
    # Each glob's matches sorted, the list in the order given, a repeat dropped.
    assert got == ["gs://b/c/x/t1.txt", "gs://b/c/y/t1.txt.gz", "gs://b/c/x/t0.txt"]
    # A glob matches files only (not the folders x, y).
    with pytest.raises(DataError, match=r"the glob 'gs://b/c/\*' matches no file"):
        data.resolve_paths("gs://b/c/*")
    # Local and remote entries mix.
    local = helpers.corpus_files(tmp_path, ["a"])
    assert data.resolve_paths(f"{local},gs://b/c/x/t0.txt") == [local, "gs://b/c/x/t0.txt"]


@pytest.mark.parametrize(
    "spec, message",
    [
        ("gs://b/none.txt", r"data.path: no such file 'gs://b/none.txt'\. Check the path\."),
        ("gs://b/c/x", r"'gs://b/c/x' is a directory; give its files, e.g. 'gs://b/c/x/\*.txt'"),
        ("gs://b/c/*.md", r"the glob 'gs://b/c/\*.md' matches no file"),
        ("gs://b/**/t0.txt", r"uses '\*\*', which remote paths do not support"),
    ],
)
def test_remote_path_errors(bucket, spec, message):
    write_corpus(bucket / "b" / "c" / "x", "")
    with pytest.raises(DataError, match=message):
        data.resolve_paths(spec)


def test_unsupported_scheme_is_named(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # epath would take memory://x for the local folder memory:/x
    with pytest.raises(ConfigError, match=r"the scheme memory:// is not supported.*gs://"):
        data.read_documents("memory://corpus/a.txt", "text")


@pytest.mark.parametrize(
    "name, content, message",
    [
        ("bad.txt.gz", b"plain text, not gzip", r"bad.txt.gz: not a readable gzip file \(Not a"),
        ("cut.txt.gz", gzip.compress(b"x" * 1000)[:-9], r"cut.txt.gz: not a readable gzip file"),
        ("bad.txt.zst", b"plain text", r"bad.txt.zst: not a readable Zstandard file \(.*'.zst'"),
        (
            "cut.txt.zstd",
            zstandard.ZstdCompressor().compress(b"y" * 1000)[:-4],
            r"cut.txt.zstd: not a readable Zstandard file \(the file ends inside a frame",
        ),
        (
            "latin.txt.gz",
            gzip.compress("caf\xe9".encode("latin-1")),
            r"latin.txt.gz: not UTF-8 text at byte offset 3 of its decompressed text",
        ),
    ],
    ids=["not-gzip", "truncated-gzip", "not-zstd", "truncated-zstd", "latin-1-in-gzip"],
)
def test_damaged_compressed_files_are_one_sentence(bucket, tmp_path, name, content, message):
    (bucket / "b").mkdir()
    for folder, where in ((tmp_path, str(tmp_path)), (bucket / "b", "gs://b")):
        (folder / name).write_bytes(content)
        with pytest.raises(DataError, match=message) as e:
            data.read_documents(f"{where}/{name}", "text")
        assert str(e.value).startswith(f"{where}/{name}: ")
        assert "\n" not in str(e.value) and e.value.__cause__ is None


def test_concatenated_frames_and_members_are_all_read(tmp_path):
    (tmp_path / "a.txt.gz").write_bytes(gzip.compress(b"one ") + gzip.compress(b"two"))
    zc = zstandard.ZstdCompressor()
    (tmp_path / "a.txt.zst").write_bytes(zc.compress(b"one ") + zc.compress(b"two"))
    for name in ("a.txt.gz", "a.txt.zst"):
        assert [d.text for d in data.read_documents(str(tmp_path / name), "text")] == ["one two"]


def test_zstd_without_zstandard_asks_for_it(tmp_path, monkeypatch):
    (tmp_path / "a.txt.zst").write_bytes(zstandard.ZstdCompressor().compress(b"text"))
    monkeypatch.setitem(sys.modules, "zstandard", None)  # `import zstandard` raises ImportError
    with pytest.raises(ConfigError, match=r"a.txt.zst: .*needs the zstandard package; pip inst"):
        data.read_documents(str(tmp_path / "a.txt.zst"), "text")


def test_uncompressed_name():
    assert data.uncompressed_name("gs://b/a.jsonl.gz") == "gs://b/a.jsonl"
    assert data.uncompressed_name("a.txt.zstd") == "a.txt"
    assert data.uncompressed_name("a.zst.txt") == "a.zst.txt"


# --------------------------------------------------------------------------------- fingerprint


def test_remote_file_identity_changes_when_rewritten(bucket):
    (bucket / "b").mkdir()
    obj = paths.epath("gs://b/a.txt")
    obj.write_bytes(b"version one")
    first = fingerprint.file_identity("gs://b/a.txt")
    assert first["path"] == "gs://b/a.txt" and first["size"] == len(b"version one")
    time.sleep(0.05)  # past the file system's timestamp granularity
    obj.write_bytes(b"version two")  # same size
    second = fingerprint.file_identity("gs://b/a.txt")
    assert second["size"] == first["size"] and second != first
    assert fingerprint.file_identity("gs://b/gone.txt") == {
        "path": "gs://b/gone.txt",
        "missing": True,
    }


def test_remote_tree_identity_lists_every_file(bucket, tmp_path):
    local = tmp_path / "step"
    write_corpus(local, "")
    shutil.copytree(local, bucket / "b" / "ck" / "7")
    remote = fingerprint.tree_identity("gs://b/ck/7")
    here = fingerprint.tree_identity(str(local))
    assert [f["path"] for f in remote] == [
        f["path"].replace(str(local), "gs://b/ck/7") for f in here
    ]
    assert [f["size"] for f in remote] == [f["size"] for f in here]
    before = fingerprint.text_digest(remote)
    time.sleep(0.05)
    paths.epath("gs://b/ck/7/t0.txt").write_bytes(b"X" * len(DOCS[0].encode()))
    assert fingerprint.text_digest(fingerprint.tree_identity("gs://b/ck/7")) != before


# ------------------------------------------------------------------------------------- outputs


def test_remote_output_dir_writes_and_reads_back(bucket):
    (bucket / "b").mkdir()
    with outputs.OutputDir.open("gs://b/runs/one/") as out:
        assert out.path == "gs://b/runs/one"
        target = out.write_json("results.json", {"perplexity": 12.5})
        assert target == "gs://b/runs/one/results.json"
        assert json.loads(out.read_bytes("results.json")) == {"perplexity": 12.5}
        out.write_jsonl("documents.jsonl", [{"a": 1}, {"a": 2}])
        assert out.read_bytes("documents.jsonl") == b'{"a": 1}\n{"a": 2}\n'
        out.write_bytes("results.json", b"{}\n")  # replaced whole
        assert out.read_bytes("results.json") == b"{}\n"
        out.remove("documents.jsonl")
        out.remove("documents.jsonl")  # absent: no error
        assert out.read_bytes("documents.jsonl") is None
    # No lock file, no probe, no temporary file is left behind.
    assert sorted(os.listdir(bucket / "b" / "runs" / "one")) == ["results.json"]


def test_remote_output_dir_errors(bucket):
    (bucket / "b" / "taken" / "results.json").mkdir(parents=True)
    (bucket / "b" / "taken" / "results.json" / "x").write_text("x")
    with pytest.raises(ConfigError, match=r"'gs://b/taken/results.json' is a folder"):
        outputs.OutputDir.open("gs://b/taken")
    (bucket / "b" / "file").write_text("x")
    with pytest.raises(ConfigError, match=r"output.dir='gs://b/file' is a file, not a folder"):
        outputs.OutputDir.open("gs://b/file")


def test_local_output_dir_is_unchanged(tmp_path):
    with outputs.OutputDir.open(str(tmp_path / "o")) as out:
        out.write_json("results.json", {"x": 1})
        assert out.read_bytes("results.json") == b'{\n  "x": 1\n}\n'
        assert out.file("results.json") == str(tmp_path / "o" / "results.json")
    assert sorted(os.listdir(tmp_path / "o")) == [".lock", "results.json"]


# --------------------------------------------------------------------------------- checkpoints


@pytest.fixture(scope="module")
def saved_checkpoint(tmp_path_factory):
    """A small local Orbax checkpoint (step 3) written by `save_train_state`."""
    path = tmp_path_factory.mktemp("ckpt") / "ck"
    params = {"w": np.arange(8, dtype=np.float32)}
    checkpoint.save_train_state(
        str(path), 3, {"step": 3, "params": params, "opt_state": {}}, {"model": {}, "tokenizer": {}}
    )
    return path


def test_remote_checkpoint_checks(bucket, saved_checkpoint):
    target = {"w": jax.ShapeDtypeStruct((8,), np.float32)}
    shutil.copytree(saved_checkpoint, bucket / "b" / "ck")
    with pytest.raises(CheckpointError, match=r"checkpoint.dir: no such directory 'gs://b/nope'"):
        checkpoint.read_metadata("gs://b/nope", None)
    # The step's files are found, listed and identified through the fake store.
    remote = fingerprint.tree_identity("gs://b/ck/3")
    local = fingerprint.tree_identity(str(saved_checkpoint / "3"))
    assert [f["size"] for f in remote] == [f["size"] for f in local] and len(remote) > 5
    state = bucket / "b" / "ck" / "3" / "state"
    # Damage is diagnosed before Orbax or TensorStore is asked for anything.
    (state / "_METADATA").write_text("{not json")
    with pytest.raises(CheckpointError, match=r"step 3 of 'gs://b/ck' is damaged: its tree meta"):
        checkpoint.restore_params("gs://b/ck", 3, target)
    (state / "_METADATA").unlink()
    with pytest.raises(CheckpointError, match=r"'state/_METADATA' is missing"):
        checkpoint.restore_params("gs://b/ck", 3, target)
    shutil.copy(saved_checkpoint / "3" / "state" / "_METADATA", state / "_METADATA")
    assert any(n.startswith("ocdbt.process_") for n in os.listdir(state))
    (state / "manifest.ocdbt").unlink()
    with pytest.raises(CheckpointError, match=r"its OCDBT manifest 'state/manifest.ocdbt' is miss"):
        checkpoint.restore_params("gs://b/ck", 3, target)


# ---------------------------------------------------------------------------------- hugging face


def test_remote_hf_directory(bucket):
    shutil.copytree(os.path.join(GOLDEN_HF, "llama"), bucket / "b" / "llama")
    path = "gs://b/llama"
    assert safetensors.is_hf_checkpoint(path) and not safetensors.is_hf_checkpoint("gs://b/none")
    assert safetensors.read_description(path) == safetensors.read_description(
        os.path.join(GOLDEN_HF, "llama")
    )
    # Weights are refused with a request for a local copy, after the index is checked.
    with pytest.raises(CheckpointError, match=r"'gs://b/llama': Hugging Face weights are read fr"):
        safetensors.load_params(path, {})
    index = bucket / "b" / "llama" / safetensors.INDEX
    for bad in ("../other/x.safetensors", "gs://elsewhere/x.safetensors", "/etc/passwd"):
        value = json.loads(index.read_text())
        first = next(iter(value["weight_map"]))
        value["weight_map"][first] = bad
        index.write_text(json.dumps(value))
        with pytest.raises(CheckpointError, match=r"names the shard .* outside the checkpoint dir"):
            safetensors.load_params(path, {})
    # A tokenizer is read through the store, as from a local file.
    local = bucket / "tokenizer.json"
    helpers.train_bpe(["the cat sat on the mat. " * 20], vocab_size=300).save(str(local))
    shutil.copy(local, bucket / "b" / "llama" / "tokenizer.json")
    assert safetensors.has_tokenizer(path)
    tok = safetensors.read_tokenizer(path)
    assert tok.name == "llama/tokenizer.json"
    text = ["the cat sat on the mat, a cat."]
    want = tokenizer_lib.HFTokenizer.from_file(str(local)).encode(text)
    assert [t.tolist() for t in tok.encode(text)] == [t.tolist() for t in want]
