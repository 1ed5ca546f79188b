"""`data.fingerprint=content` (issue 19 item 4): a corpus file edited to the same size with its
modification time set back keeps its key under the default rule (path, size, mtime) and gets a
new one by content, in the plan and token caches and in the journal's fingerprint alike."""

from __future__ import annotations

import hashlib
import os

import pytest
from test_plan_cache import settings

from ppl_jax.data.spec import DatasetSpec
from ppl_jax.errors import ConfigError
from ppl_jax.plans import plan_cache, suite, token_cache
from ppl_jax.runtime import fingerprint
from ppl_jax.tokenizer import base as tokenizer

import helpers


def edit_in_place(path: str, old: bytes, new: bytes) -> None:
    """Replaces `old` by `new` (same length) and sets the modification time back."""
    st = os.stat(path)
    data = open(path, "rb").read()
    assert len(old) == len(new) and old in data
    with open(path, "wb") as f:
        f.write(data.replace(old, new, 1))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def test_content_identity_is_the_sha256_of_the_bytes(tmp_path):
    path = tmp_path / "a.txt"
    path.write_bytes(b"hello world\n")
    found = fingerprint.file_identity(str(path), content=True)
    assert found == {
        "path": str(path),
        "size": 12,
        "sha256": hashlib.sha256(b"hello world\n").hexdigest(),
    }
    assert fingerprint.file_identity(str(tmp_path / "no"), content=True)["missing"]


@pytest.mark.parametrize("protocol", ["sliding", "hf_strided"])
def test_an_edit_with_its_mtime_set_back_is_seen_by_content_only(tmp_path, bpe_tokenizer, protocol):
    text = helpers.stdlib_text(800)
    path = helpers.corpus_files(tmp_path, [text])
    tok = tokenizer.load(bpe_tokenizer, None)
    by_stat = settings(path, str(tmp_path / "cache"), protocol)
    by_content = settings(path, str(tmp_path / "cache"), protocol, fingerprint="content")
    assert by_content.data.fingerprint == "content"
    keys = {
        name: (plan_cache.key(s.data, s.eval, tok, 512), token_cache.key(s.data, tok))
        for name, s in (("stat", by_stat), ("content", by_content))
    }
    first = suite.planned(by_content.data, by_content.eval, tok, 512)[0]
    word = text.split()[3].encode()
    edit_in_place(path, word, word.upper() if word.upper() != word else word.lower())
    assert plan_cache.key(by_stat.data, by_stat.eval, tok, 512) == keys["stat"][0]  # unseen
    assert token_cache.key(by_stat.data, tok) == keys["stat"][1]
    assert plan_cache.key(by_content.data, by_content.eval, tok, 512) != keys["content"][0]
    assert token_cache.key(by_content.data, tok) != keys["content"][1]
    again = suite.planned(by_content.data, by_content.eval, tok, 512)[0]
    assert again.tokens_digest != first.tokens_digest  # planned anew from the new text


def test_the_journal_fingerprint_follows_the_content(tmp_path):
    path = tmp_path / "a.txt"
    path.write_bytes(b"some text here\n")
    parts = dict(
        checkpoint={"path": "c", "format": "orbax", "step": 1},
        checkpoint_files=str(tmp_path / "none"),
        model={},
        data_paths=[str(path)],
        tokenizer={},
        protocol={},
        layout={},
        mesh={},
    )
    stat = fingerprint.of_run(data={}, **parts)
    content = fingerprint.of_run(data={"fingerprint": "content"}, **parts)
    edit_in_place(str(path), b"some", b"SOME")
    fingerprint._content_memo.clear()  # a new run (a new process)
    assert fingerprint.of_run(data={}, **parts) == stat
    assert fingerprint.of_run(data={"fingerprint": "content"}, **parts) != content


def test_an_unknown_rule_is_refused():
    with pytest.raises(ConfigError, match="data.fingerprint='md5' is not one of stat, content"):
        DatasetSpec(path="/x.txt", fingerprint="md5")
