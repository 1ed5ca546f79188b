"""The token cache (`ppl_jax.plans.token_cache`, `ppl_jax.plans.stream_plans`): a corpus tokenized once, in shares across processes,
into flat memory-mapped arrays, and the per-document protocols planned from document lengths.
Plans equal `Protocol.plan`'s array for array whatever the number of shares and chunk sizes; a
second run, another protocol or another sequence length tokenizes nothing; a changed file or
tokenizer is tokenized again (two real processes: tests/multiprocess/test_token_cache_processes.py)."""

from __future__ import annotations

import dataclasses
import itertools
import json
import os

import numpy as np
import pytest
from test_plan_cache import same_plan, settings

from ppl_jax import tokenizer
from ppl_jax.data import documents as data
from ppl_jax.errors import DataError
from ppl_jax.plans import planner, protocols, stream_plans, token_cache

import helpers

TEXTS = [
    "",  # an empty first document: the stream's first token is a separator's
    "Hello world  ",
    "  leading space and\nnewline",
    "",
    "émoji 🎉 and ünïcode",
    "x",
    "   ",
    helpers.stdlib_text(700),  # longer than the pieces below: tokenized in pieces
    "last",
]


def corpus(tmp_path, texts=TEXTS) -> str:
    """Two JSONL files (a glob), so that shares cross a file boundary."""
    half = len(texts) // 2
    for name, part in (("a", texts[:half]), ("b", texts[half:])):
        with open(tmp_path / f"{name}.jsonl", "w", encoding="utf-8") as f:
            f.writelines(json.dumps({"text": t}) + "\n" for t in part)
    return str(tmp_path / "*.jsonl")


def entry_of(tmp_path, path, tok, count: int) -> token_cache.Entry:
    """An entry written as `count` processes would, one share each."""
    s = settings(path, str(tmp_path), "sliding", format="jsonl")
    folder = tmp_path / f"entry-{count}"
    folder.mkdir()
    n = data.count_documents(path, "jsonl")
    names = [token_cache.build_part(s.data, tok, str(folder), i, count, n) for i in range(count)]
    assert names == token_cache.part_names(count)
    token_cache.write_parts(str(folder), count, n)
    return token_cache.open_entry(str(folder))


@pytest.fixture
def small_chunks(monkeypatch):
    monkeypatch.setattr(token_cache, "BATCH_CHARS", 40)
    monkeypatch.setattr(token_cache, "COPY_TOKENS", 7)
    monkeypatch.setattr(stream_plans, "DOCS_CHUNK", 2)  # word counts joined across chunks


@pytest.mark.parametrize("kind", ["byte", "bpe", "bpe_with_bos"])
def test_plans_equal_protocols_plan_for_any_shares(tmp_path, bpe_tokenizer, kind, small_chunks):
    tok = tokenizer.load_tokenizer("byte" if kind == "byte" else bpe_tokenizer, None)
    tok.piece_chars = 256  # the long document is encoded in pieces
    if kind == "bpe_with_bos":
        tok.bos_id = tok.token_id(helpers.EOT)
    path = corpus(tmp_path)
    docs = data.read_documents(path, "jsonl")
    rolling = tok.bos_id is not None or tok.eos_id is not None
    for count in (1, 2, 3, 11):  # 11 shares of 9 documents: some are empty
        entry = entry_of(tmp_path, path, tok, count)
        assert entry.num_documents == len(docs)
        assert entry.sources == [d.source for d in docs]  # the parts' file lists merged
        streamed = [n for n, p in protocols.PROTOCOLS.items() if p.stream_plan is not None]
        ran = set()
        assert "sliding" in streamed and "whole_documents" in streamed
        cases = itertools.product(
            [n for n in streamed if rolling or n != "lm_eval_rolling"],
            ["\n\n", "", "|"],
            [False, True] if tok.bos_id is not None else [False],
            [(8, 3), (16, 16), (1000, 500)],
            ["", "sliding", "truncate"],
        )
        for protocol, separator, add_bos, (seq_len, stride), rule in cases:
            rules = protocols.get(protocol)
            if rules.document_level and separator != "\n\n":
                continue  # no separator between documents scored one by one
            # whole_documents: every document in one window, or the long one cut by a rule
            if (bool(rule) != (rules.splits_documents and seq_len < 1000)) or (
                seq_len == 1000 and not rules.splits_documents
            ):
                continue
            options = {"long_documents": rule} if rule else {}
            ran.add((protocol, rule))
            used = rules.strided or options.get("long_documents") == "sliding"
            stride = stride if used else None
            inputs = protocols.PlanInputs(tok, 600, seq_len, stride, add_bos, separator, options)
            want = rules.plan(docs, inputs)
            stream = str(tmp_path / f"stream-{count}.npy")
            got = rules.stream_plan(entry, inputs, stream)
            assert got.tokens_digest == protocols.tokens_digest(want.windows.tokens)
            same_plan(got, dataclass_with(want, tokens_digest=got.tokens_digest))
        assert {("whole_documents", r) for r in ("", "sliding", "truncate")} <= ran


def dataclass_with(plan, **changes):

    return dataclasses.replace(plan, **changes)


def test_an_id_outside_the_vocabulary_names_the_document(tmp_path):
    path = corpus(tmp_path, ["ok", "ok too", "ÿ here"])
    tok = tokenizer.load_tokenizer("byte", None)
    entry = entry_of(tmp_path, path, tok, 2)
    with pytest.raises(DataError) as e:  # "ÿ" is UTF-8 0xc3 0xbf: byte ids past 150
        inputs = protocols.PlanInputs(tok, 150, 8, 4, False, "\n\n")
        protocols.SLIDING.stream_plan(entry, inputs, str(tmp_path / "s.npy"))
    assert "document 2 (" in str(e.value) and "b.jsonl:2" in str(e.value)


def test_a_part_keeps_its_document_arrays_in_files(tmp_path, bpe_tokenizer, monkeypatch):
    """Many short documents (issue 19): a part holds no array per document in memory; on disk
    its counts are uint32 and the file index of two files uint8; one process does not count the
    corpus before tokenizing it."""
    path = corpus(tmp_path)
    docs = data.read_documents(path, "jsonl")
    tok = tokenizer.load_tokenizer(bpe_tokenizer, None)
    s = settings(path, str(tmp_path / "cache"), "sliding", format="jsonl")
    monkeypatch.setattr(data, "count_documents", lambda *a, **k: pytest.fail("counted first"))
    entry = token_cache.build(s.data, tok)
    (part,) = entry.parts
    assert part.documents == (0, len(docs)) and entry.num_documents == len(docs)
    assert part.dtypes == {
        **dict.fromkeys(token_cache.COUNTS, "uint32"),
        "doc_edges": "uint8",
        "source_file": "uint8",
        "source_line": "uint32",
    }
    assert not [k for k, v in vars(part).items() if isinstance(v, np.ndarray)]
    assert part.column("doc_bytes").tolist() == [len(d.text.encode()) for d in docs]
    assert part.column("doc_words", 2, 4).tolist() == [len(d.text.split()) for d in docs[2:4]]
    assert entry.sources == [d.source for d in docs]


def test_a_count_past_uint32_turns_its_column_into_int64(tmp_path):
    big = np.iinfo(np.uint32).max
    kept = token_cache._Column(str(tmp_path), "doc_bytes", "uint32", widens=True)
    kept.append([big, 0])
    widened = token_cache._Column(str(tmp_path), "doc_tokens", "uint32", widens=True)
    widened.append([1, 2])
    widened.append(np.asarray([big + 1, 3]))
    widened.append([7])
    for column in (kept, widened):
        column.file.close()
    assert kept.summary()[0] == "uint32"
    dtype, digest = widened.summary()
    path = str(tmp_path / "doc_tokens.bin")
    assert dtype == "int64" and digest == token_cache.file_digest(path)
    assert np.fromfile(path, np.int64).tolist() == [1, 2, big + 1, 3, 7]


def test_a_second_run_and_other_protocols_tokenize_nothing(tmp_path, bpe_tokenizer, monkeypatch):
    path = corpus(tmp_path)
    tok = tokenizer.load_tokenizer(bpe_tokenizer, None)
    cache = str(tmp_path / "cache")
    s = settings(path, cache, "sliding", format="jsonl")
    first, docs, _ = planner.planned(s.data, s.protocol, tok, 512)
    assert docs is None and isinstance(first.windows.tokens, np.memmap)
    want = protocols.SLIDING.plan(
        data.read_documents(path, "jsonl"),
        protocols.PlanInputs(tok, 512, 48, s.protocol.stride, False),
    )
    same_plan(first, dataclass_with(want, tokens_digest=first.tokens_digest))
    # From now on nothing is read or tokenized: the token cache serves every protocol and length.
    monkeypatch.setattr(token_cache, "_write_part", lambda *a: pytest.fail("tokenized again"))
    monkeypatch.setattr(data, "iter_documents", lambda *a, **k: pytest.fail("read again"))
    again, _, _ = planner.planned(s.data, s.protocol, tok, 512)
    same_plan(again, first)
    other = settings(path, cache, "lm_eval_rolling", format="jsonl")
    rolling, _, _ = planner.planned(
        other.data, dataclass_with(other.protocol, seq_len=16), tok, 512
    )
    assert rolling.protocol == "lm_eval_rolling" and rolling.windows.seq_len == 16
    names = sorted(os.listdir(cache))
    assert sum(n.startswith("tokens-") for n in names) == 1 and len(names) == 3


def test_a_changed_file_or_tokenizer_is_tokenized_again(tmp_path, bpe_tokenizer):
    path = corpus(tmp_path)
    cache = str(tmp_path / "cache")
    s = settings(path, cache, "sliding", format="jsonl")
    bpe, byte = (
        tokenizer.load_tokenizer(bpe_tokenizer, None),
        tokenizer.load_tokenizer("byte", None),
    )
    before = planner.planned(s.data, s.protocol, bpe, 512)[0].text_tokens
    assert token_cache.key(s.data, byte) != token_cache.key(s.data, bpe)
    planner.planned(s.data, s.protocol, byte, 512)
    key = token_cache.key(s.data, bpe)
    with open(tmp_path / "b.jsonl", "a", encoding="utf-8") as f:
        f.write(json.dumps({"text": "one more document"}) + "\n")
    assert token_cache.key(s.data, bpe) != key
    after = planner.planned(s.data, s.protocol, bpe, 512)[0]
    assert after.num_documents == len(TEXTS) + 1 and after.text_tokens > before
    tokens = [n for n in os.listdir(cache) if n.startswith("tokens-")]
    assert len(tokens) == 3  # bpe, byte, and bpe of the changed file; stale entries stay


def test_harness_words_from_words_and_edges():
    """The harness's `len(re.split(r"\\s+", text))` from `str.split` words and the text's edges,
    on random strings of Python's whitespace (also the rare kinds) and other characters."""
    rng = np.random.default_rng(0)
    chars = [" ", "\t", "\n", "\r", "a", "b", "é", "\u3000", "\x1c", "\x85", "\u2028", "\xa0"]
    for _ in range(5000):
        text = "".join(rng.choice(chars, size=rng.integers(0, 9)))
        edges = token_cache.edges_of(text)
        got = token_cache._harness_words(text, len(text.split()), edges)
        assert got == protocols.count_harness_words(text), repr(text)


def test_a_word_level_tokenizer_without_bos_counts_the_scored_words(tmp_path):
    """A word-level tokenizer (its whitespace pre-tokenizer keeps no token of the separator
    "\\n\\n") without BOS (issue 39, item 14): sliding's cached plan crashed (IndexError) and
    whole_documents counted no words; the words are those after the stream's (each
    document's) context-only first token."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {w: i for i, w in enumerate(["<unk>", "hello", "world", "again", "."])}
    word_level = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    word_level.pre_tokenizer = pre_tokenizers.Whitespace()
    word_level.save(str(tmp_path / "tokenizer.json"))
    tok = tokenizer.load_tokenizer(str(tmp_path), None)
    texts = ["hello world.", "hello again world", "world a"]
    entry = entry_of(tmp_path, corpus(tmp_path, texts), tok, 2)
    inputs = protocols.PlanInputs(tok, 5, 8, 4, False, "\n\n")
    streamed = protocols.SLIDING.stream_plan(entry, inputs, str(tmp_path / "s.npy"))
    assert streamed.num_words == len("world.\n\nhello again world\n\nworld a".split()) == 6
    whole = protocols.WHOLE_DOCUMENTS.stream_plan(entry, inputs, str(tmp_path / "w.npy"))
    assert whole.doc_words.tolist() == [1, 2, 1] and whole.num_words == 4
    docs = data.read_documents(corpus(tmp_path, texts), "jsonl")
    assert protocols.WHOLE_DOCUMENTS.plan(docs, inputs).doc_words.tolist() == [1, 2, 1]
    # Read whole, the separator's bytes (no token holds them) no longer cut the span short.
    assert protocols.SLIDING.plan(docs, inputs).num_words == 6
