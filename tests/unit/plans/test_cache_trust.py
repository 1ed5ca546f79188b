"""Nothing in `data.cache_dir` is trusted blindly (issue 19): a token cache's `parts.json` names
only the entry's own parts, which tile the corpus once; a part or a plan whose files differ from
their digests is refused with one sentence; a cache that cannot be written (a file, no space) is
one sentence and leaves nothing half-written; temporaries of dead writers are removed."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys

import numpy as np
import pytest
from test_plan_cache import settings

from ppl_jax import tokenizer
from ppl_jax.errors import ConfigError, DataError
from ppl_jax.plans import plan_cache, planner, token_cache
from ppl_jax.runtime import temporaries

import helpers


@pytest.fixture
def cached(tmp_path, bpe_tokenizer):
    """A corpus planned once through the token cache: (spec, tokenizer, cache folder, plan)."""
    path = helpers.corpus_files(tmp_path, [helpers.stdlib_text(900), helpers.stdlib_text(500)])
    tok = tokenizer.load_tokenizer(bpe_tokenizer, None)
    s = settings(path, str(tmp_path / "cache"), "sliding")
    p = planner.planned(s.data, s.protocol, tok, 512)[0]
    return s, tok, tmp_path / "cache", p


def token_entry(cache):
    (name,) = [n for n in os.listdir(cache) if n.startswith("tokens-")]
    return cache / name


def plan_entry(cache):
    (name,) = [n for n in os.listdir(cache) if not n.startswith("tokens-")]
    return cache / name


def drop_plans(cache):
    """Removes the plan entry, so that the next run plans again from the token cache."""
    import shutil

    shutil.rmtree(plan_entry(cache))


def test_parts_json_naming_a_folder_outside_the_cache_is_refused(cached, tmp_path):
    s, tok, cache, _ = cached
    entry = token_entry(cache)
    elsewhere = tmp_path / "elsewhere"
    os.rename(entry / "part-00000-of-00001", elsewhere)
    meta = json.loads((entry / "parts.json").read_text())
    meta["parts"] = ["../../elsewhere"]
    (entry / "parts.json").write_text(json.dumps(meta))
    drop_plans(cache)
    with pytest.raises(DataError, match=r"damaged \(parts.json lists .*elsewhere.*not its own"):
        planner.planned(s.data, s.protocol, tok, 512)


def test_a_part_listed_twice_does_not_double_the_corpus(cached):
    s, tok, cache, _ = cached
    entry = token_entry(cache)
    meta = json.loads((entry / "parts.json").read_text())
    meta["parts"] = meta["parts"] * 2
    (entry / "parts.json").write_text(json.dumps(meta))
    drop_plans(cache)
    with pytest.raises(DataError, match="not its own parts"):
        planner.planned(s.data, s.protocol, tok, 512)


def test_parts_must_tile_the_corpus(cached):
    s, tok, cache, _ = cached
    entry = token_entry(cache)
    meta = json.loads((entry / "parts.json").read_text())
    meta["documents"] += 1  # a document no part holds
    (entry / "parts.json").write_text(json.dumps(meta))
    with pytest.raises(DataError, match="its parts hold 2 documents of 3"):
        token_cache.open_entry(str(entry))


def test_a_truncated_part_is_one_sentence(cached):
    s, tok, cache, _ = cached
    ids = token_entry(cache) / "part-00000-of-00001" / "ids.bin"
    raw = ids.read_bytes()
    ids.write_bytes(raw[: len(raw) // 2])
    drop_plans(cache)
    with pytest.raises(
        DataError, match=rf"ids.bin holds {len(raw) // 8} tokens of {len(raw) // 4}"
    ):
        planner.planned(s.data, s.protocol, tok, 512)


def test_a_part_edited_in_place_is_refused(cached):
    s, tok, cache, _ = cached
    ids = token_entry(cache) / "part-00000-of-00001" / "ids.bin"
    values = np.fromfile(ids, np.int32)
    values[3] = (values[3] + 1) % 300
    values.tofile(ids)  # same size, still valid token ids
    drop_plans(cache)
    with pytest.raises(DataError, match="ids.bin differs from the digest its part.json holds"):
        planner.planned(s.data, s.protocol, tok, 512)
    assert not [n for n in os.listdir(cache) if n.startswith(".")]  # no temporary left


def test_a_document_array_edited_in_place_is_refused(cached):
    s, tok, cache, _ = cached
    words = token_entry(cache) / "part-00000-of-00001" / "doc_words.bin"
    values = np.fromfile(words, np.uint32)
    values[0] += 1
    values.tofile(words)  # same size, a plausible count
    drop_plans(cache)
    with pytest.raises(DataError, match="doc_words.bin differs from the digest its part.json"):
        planner.planned(s.data, s.protocol, tok, 512)


def test_a_plan_tokens_npy_edited_in_place_is_refused(cached):
    s, tok, cache, p = cached
    tokens = plan_entry(cache) / "tokens.npy"
    stream = np.load(tokens)
    assert plan_cache.stream_digest(str(tokens)) == p.tokens_digest
    stream[5] = (stream[5] + 1) % 300
    np.save(tokens, stream)  # same size
    with pytest.raises(DataError, match="tokens.npy differs from the digest its plan.json holds"):
        planner.planned(s.data, s.protocol, tok, 512)


def test_a_plan_window_array_edited_is_refused(cached):
    s, tok, cache, _ = cached
    starts = plan_entry(cache) / "starts.npy"
    values = np.load(starts)
    values[-1] -= 1
    np.save(starts, values)
    with pytest.raises(DataError, match="starts.npy differs from the digest"):
        planner.planned(s.data, s.protocol, tok, 512)


def test_a_cache_dir_that_is_a_file_is_one_sentence(tmp_path, bpe_tokenizer):
    path = helpers.corpus_files(tmp_path, [helpers.stdlib_text(300)])
    (tmp_path / "file").write_text("x")
    tok = tokenizer.load_tokenizer(bpe_tokenizer, None)
    for protocol in ("sliding", "hf_strided"):  # the token cache, and the plan cache alone
        s = settings(path, str(tmp_path / "file"), protocol)
        with pytest.raises(ConfigError, match=r"data.cache_dir=.*file.*could not be written"):
            planner.planned(s.data, s.protocol, tok, 512)


@pytest.mark.parametrize("protocol", ["sliding", "hf_strided"])
def test_disk_full_while_caching_is_one_sentence_and_leaves_nothing(
    tmp_path, bpe_tokenizer, monkeypatch, protocol
):
    path = helpers.corpus_files(tmp_path, [helpers.stdlib_text(300)])
    tok = tokenizer.load_tokenizer(bpe_tokenizer, None)
    s = settings(path, str(tmp_path / "cache"), protocol)

    def full(*a, **k):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    if protocol == "sliding":  # the token cache's part is written first
        monkeypatch.setattr(token_cache._Column, "append", full)
    else:
        monkeypatch.setattr(plan_cache.np, "save", full)
    with pytest.raises(ConfigError, match="could not be written there .No space left on device"):
        planner.planned(s.data, s.protocol, tok, 512)
    left = [os.path.join(r, n) for r, ds, fs in os.walk(tmp_path / "cache") for n in ds + fs]
    assert not [x for x in left if "part-" in x or ".tmp-" in x or x.endswith(".npy")], left
    monkeypatch.undo()
    assert planner.planned(s.data, s.protocol, tok, 512)[0].text_tokens > 0  # and then it works


def test_stale_temporaries_of_dead_writers_are_removed(tmp_path):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    pid = int(dead.stdout)
    mine = temporaries.name("part-00000-of-00001")
    theirs = mine.replace(f"-{os.getpid()}-", f"-{pid}-")
    other_host = mine.replace(f".tmp-{temporaries._HOST}-", ".tmp-elsewhere-")
    for n in (mine, theirs, other_host):
        (tmp_path / n).mkdir()
        (tmp_path / n / "ids.bin").write_bytes(b"1234")
    (tmp_path / "part-00000-of-00001").mkdir()
    assert temporaries.remove_stale(str(tmp_path)) == [theirs]
    assert sorted(os.listdir(tmp_path)) == sorted([mine, other_host, "part-00000-of-00001"])


def test_sigterm_while_tokenizing_is_one_sentence_and_leaves_no_temporary(
    tmp_path, bpe_tokenizer, monkeypatch
):
    import signal

    from ppl_jax.errors import Interrupted

    path = helpers.corpus_files(tmp_path, [helpers.stdlib_text(300)])
    tok = tokenizer.load_tokenizer(bpe_tokenizer, None)
    s = settings(path, str(tmp_path / "cache"), "sliding")
    encode = type(tok).encode_flat_with_bytes  # the token cache's batch encoding

    def killed(self, texts):
        os.kill(os.getpid(), signal.SIGTERM)
        return encode(self, texts)

    monkeypatch.setattr(type(tok), "encode_flat_with_bytes", killed)
    with pytest.raises(Interrupted, match="SIGTERM while tokenizing data") as e:
        planner.planned(s.data, s.protocol, tok, 512)
    assert e.value.exit_code == 143
    entry = token_entry(tmp_path / "cache")
    assert os.listdir(entry) == []  # the part's temporary folder is gone
