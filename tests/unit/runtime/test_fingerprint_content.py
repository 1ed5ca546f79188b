"""`data.fingerprint=content` (issue 19 item 4) and the stat rule's sampled blocks (issue 26): a
corpus file edited to the same size with its modification time set back gets a new key by
content, in the plan and token caches and in the journal's fingerprint alike; under the default
rule (path, size, mtime and 16 sampled blocks) when the edit touches a sampled block (any edit of
a file of at most 64 KiB), and not when it falls between the blocks of a larger file."""

from __future__ import annotations

import hashlib
import os

import pytest
from test_plan_cache import settings

from ppl_jax import tokenizer
from ppl_jax.data.spec import DatasetSpec
from ppl_jax.errors import ConfigError
from ppl_jax.plans import plan_cache, planner, token_cache
from ppl_jax.runtime import file_sample, fingerprint

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


def between_sampled_blocks(path: str) -> int:
    """An offset of `path` (over 64 KiB) that no sampled block covers."""
    starts = file_sample.offsets(os.path.getsize(path))
    return starts[1] // 2 + file_sample.BLOCK // 2


@pytest.mark.parametrize("protocol", ["sliding", "hf_strided"])
def test_an_edit_between_the_sampled_blocks_is_seen_by_content_only(
    tmp_path, bpe_tokenizer, protocol
):
    text = helpers.stdlib_text(800) * 200  # ~160 KB: larger than the 64 KiB read whole
    path = helpers.corpus_files(tmp_path, [text])
    tok = tokenizer.load_tokenizer(bpe_tokenizer, None)
    by_stat = settings(path, str(tmp_path / "cache"), protocol)
    by_content = settings(path, str(tmp_path / "cache"), protocol, fingerprint="content")
    assert by_content.data.fingerprint == "content"
    keys = {
        name: (plan_cache.key(s.data, s.protocol, tok, 512), token_cache.key(s.data, tok))
        for name, s in (("stat", by_stat), ("content", by_content))
    }
    first = planner.planned(by_content.data, by_content.protocol, tok, 512)[0]
    data = open(path, "rb").read()
    at = between_sampled_blocks(path)
    at = next(i for i in range(at, at + 100) if data[i : i + 1].isalpha())
    old = data[at : at + 1]
    with open(path, "r+b") as f:  # one letter's case, the size and time kept
        st = os.stat(path)
        f.seek(at)
        f.write(old.swapcase())
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert plan_cache.key(by_stat.data, by_stat.protocol, tok, 512) == keys["stat"][0]  # unseen
    assert token_cache.key(by_stat.data, tok) == keys["stat"][1]
    assert plan_cache.key(by_content.data, by_content.protocol, tok, 512) != keys["content"][0]
    assert token_cache.key(by_content.data, tok) != keys["content"][1]
    again = planner.planned(by_content.data, by_content.protocol, tok, 512)[0]
    assert again.tokens_digest != first.tokens_digest  # planned anew from the new text


def test_the_journal_fingerprint_follows_the_content(tmp_path):
    path = tmp_path / "a.txt"
    path.write_bytes(b"some text here\n")
    by_stat = DatasetSpec(path=str(path))
    by_content = DatasetSpec(path=str(path), fingerprint="content")
    stat, content = by_stat.fingerprint_part(), by_content.fingerprint_part()
    edit_in_place(str(path), b"some", b"SOME")
    fingerprint._content_memo.clear()  # a new run (a new process)
    # A file of at most 64 KiB is sampled whole: the stat rule sees the edit too.
    assert by_stat.fingerprint_part() != stat
    assert by_content.fingerprint_part() != content


def test_an_unknown_rule_is_refused():
    with pytest.raises(ConfigError, match="data.fingerprint='md5' is not one of stat, content"):
        DatasetSpec(path="/x.txt", fingerprint="md5")


def test_an_edit_of_a_sampled_block_or_of_a_small_file_is_seen_by_stat(tmp_path):
    """The same-size edit with its time set back was served from the cache under the default
    rule; the sampled blocks see it in a small file (read whole) and in a sampled block."""
    small = tmp_path / "small.txt"
    small.write_bytes(b"some text here\n" * 100)
    before = fingerprint.file_identity(str(small))
    edit_in_place(
        str(small), b"here\n" * 1 + b"some text here\nsome", b"HERE\nsome text here\nsome"
    )
    after = fingerprint.file_identity(str(small))
    assert (before["size"], before["mtime_ns"]) == (after["size"], after["mtime_ns"])
    assert before["sample"] != after["sample"]
    large = tmp_path / "large.bin"
    large.write_bytes(bytes(range(256)) * 1024)  # 256 KiB
    before = fingerprint.file_identity(str(large))
    last = file_sample.offsets(large.stat().st_size)[-1]
    st = large.stat()
    with open(large, "r+b") as f:
        f.seek(last + 10)
        f.write(b"\xff")
    os.utime(large, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert fingerprint.file_identity(str(large))["sample"] != before["sample"]


def test_the_sample_reads_little_and_spans_the_file():
    assert file_sample.offsets(64 * 1024) == [0]  # read whole
    size = 10**9
    starts = file_sample.offsets(size)
    assert len(starts) == file_sample.BLOCKS and starts[0] == 0
    assert starts[-1] == size - file_sample.BLOCK and starts == sorted(starts)
    assert len(set(starts)) == file_sample.BLOCKS


def test_checkpoint_files_are_sampled_as_corpus_files(tmp_path):
    """A checkpoint's files (a step's folder, or its one file) by the corpus's `stat` rule."""
    (tmp_path / "w.bin").write_bytes(b"x" * 100)
    (found,) = fingerprint.tree_identity(str(tmp_path))
    assert found == fingerprint.file_identity(str(tmp_path / "w.bin")) and found["sample"]
    assert fingerprint.tree_identity(str(tmp_path / "w.bin")) == [found]


def test_a_run_reusing_a_cached_corpus_says_how_it_was_matched(tiny_checkpoint, tmp_path):
    """Said where it bites: the summary of a run with data.cache_dir names the rule."""
    from test_diagnostics import run, settings

    from ppl_jax.evaluation import summary
    from ppl_jax.outputs import console

    corpus = helpers.corpus_files(tmp_path, [helpers.stdlib_text(400)])
    for name in ("first", "again"):
        s = settings(tiny_checkpoint, corpus, tmp_path / name, data__cache_dir=str(tmp_path / "c"))
        results = summary.results_dict(run(s))
        assert results["data"]["cache_dir"] == str(tmp_path / "c")
        assert results["data"]["fingerprint"] == "stat"
        (row,) = [
            line for line in console.summary_table(results).splitlines() if line.startswith("cache")
        ]
        assert "16 sampled 4 KiB blocks (data.fingerprint=stat)" in row
        assert "data.fingerprint=content hashes every byte" in row
    plain = settings(tiny_checkpoint, corpus, tmp_path / "plain")
    table = console.summary_table(summary.results_dict(run(plain)))
    assert not any(line.startswith("cache") for line in table.splitlines())
