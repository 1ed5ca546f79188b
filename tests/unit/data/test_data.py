"""Reading a corpus (`ppl_jax.data.documents`), tokenizers, and the token stream (`windows.build_stream`).

The byte-level BPE is trained at test time (`bpe_tokenizer` in conftest.py); the same tests on the
GPT-2 tokenizer itself are in tests/shared_data/."""

from __future__ import annotations

import json

import numpy as np
import pytest

from ppl_jax.data.documents import Document, read_documents, resolve_paths
from ppl_jax.errors import ConfigError, DataError
from ppl_jax.plans.protocols import PlanInputs, get
from ppl_jax.tokenizer import ByteTokenizer, HFTokenizer, from_description

import helpers


def write(path, data: bytes | str) -> str:
    if isinstance(data, str):
        data = data.encode("utf-8")
    path.write_bytes(data)
    return str(path)


@pytest.fixture(scope="module")
def bpe(bpe_tokenizer) -> HFTokenizer:
    return HFTokenizer.from_file(bpe_tokenizer)


def token_bytes(tok: HFTokenizer, token_id: int) -> bytes:
    """The bytes a byte-level BPE token stands for."""
    return byte_level_token_bytes(tok._tok.id_to_token(int(token_id)))


def byte_level_token_bytes(token: str) -> bytes:
    """The bytes a GPT-2 byte-level token string stands for (the inverse of GPT-2's
    `bytes_to_unicode`, written out here independently of `ppl_jax.tokenizer`)."""
    printable = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    chars = dict(zip(printable, printable, strict=True))
    extra = 0
    for b in range(256):
        if b not in chars:
            chars[b] = 256 + extra
            extra += 1
    to_byte = {chr(c): b for b, c in chars.items()}
    return bytes(to_byte[c] for c in token)


# ------------------------------------------------------------------------------------- formats


def test_text_format_is_one_document_per_file(tmp_path):
    a = write(tmp_path / "a.txt", "first line\n\nsecond paragraph\n")
    b = write(tmp_path / "b.txt", "other")
    docs = read_documents(f"{a},{b}", "text")
    assert docs == [Document("first line\n\nsecond paragraph\n", a), Document("other", b)]


def test_lines_format_skips_blank_lines_and_numbers_lines_from_one(tmp_path):
    p = write(tmp_path / "l.txt", "alpha beta\n\n   \ngamma\r\n\ndelta")
    docs = read_documents(p, "lines")
    assert docs == [
        Document("alpha beta", f"{p}:1"),
        Document("gamma", f"{p}:4"),
        Document("delta", f"{p}:6"),
    ]


def test_lines_format_splits_only_at_line_ends(tmp_path):
    # A form feed (common in Python source) and U+2028 are not line ends of a file.
    p = write(tmp_path / "l.txt", "ab\x0ccd\nef\u2028gh\nij\n")
    docs = read_documents(p, "lines")
    assert docs == [
        Document("ab\x0ccd", f"{p}:1"),
        Document("ef\u2028gh", f"{p}:2"),
        Document("ij", f"{p}:3"),
    ]


def test_jsonl_format_reads_the_text_field(tmp_path):
    lines = [json.dumps({"text": "one", "id": 1}), "", json.dumps({"text": "two\nlines", "id": 2})]
    p = write(tmp_path / "d.jsonl", "\n".join(lines) + "\n")
    docs = read_documents(p, "jsonl")
    assert docs == [Document("one", f"{p}:1"), Document("two\nlines", f"{p}:3")]


def test_jsonl_field_override(tmp_path):
    p = write(tmp_path / "d.jsonl", '{"body": "abc", "text": 5}\n{"body": "de"}\n')
    docs = read_documents(p, "jsonl", jsonl_field="body")
    assert [d.text for d in docs] == ["abc", "de"]
    assert [d.source for d in docs] == [f"{p}:1", f"{p}:2"]


def test_jsonl_keeps_an_unescaped_line_separator_inside_a_string(tmp_path):
    # json.dumps(ensure_ascii=False) writes U+2028 raw; the line is still one valid JSON object.
    line = json.dumps({"text": "a\u2028b\u0085c"}, ensure_ascii=False)
    p = write(tmp_path / "d.jsonl", line + "\r\n")
    assert read_documents(p, "jsonl") == [Document("a\u2028b\u0085c", f"{p}:1")]


def test_unknown_format_is_named(tmp_path):
    p = write(tmp_path / "a.txt", "x")
    with pytest.raises(DataError, match=r"data.format='csv' is not one of text, lines, jsonl"):
        read_documents(p, "csv")


# ----------------------------------------------------------------------------------- data.path


def test_single_file(tmp_path):
    p = write(tmp_path / "a.txt", "x")
    assert resolve_paths(p) == [p]


def test_glob_matches_sorted_files_only(tmp_path):
    for name in ("b.txt", "a.txt", "c.md"):
        write(tmp_path / name, "x")
    (tmp_path / "d.txt").mkdir()  # a directory matching the glob is not a file
    assert resolve_paths(str(tmp_path / "*.txt")) == [
        str(tmp_path / "a.txt"),
        str(tmp_path / "b.txt"),
    ]


def test_comma_list_keeps_order_and_drops_repeats(tmp_path):
    a, b, c = (write(tmp_path / f"{n}.txt", n) for n in "abc")
    spec = f"{c}, {a},{tmp_path}/*.txt,{c},{tmp_path}/./b.txt,"
    assert resolve_paths(spec) == [c, a, b]
    assert [d.text for d in read_documents(spec, "text")] == ["c", "a", "b"]


# ------------------------------------------------------------------------------ bytes and text


def test_byte_order_mark_is_dropped_and_crlf_kept(tmp_path):
    p = write(tmp_path / "bom.txt", b"\xef\xbb\xbfone\r\ntwo\r\n")
    assert read_documents(p, "text") == [Document("one\r\ntwo\r\n", p)]
    assert read_documents(p, "lines") == [Document("one", f"{p}:1"), Document("two", f"{p}:2")]


def test_byte_order_mark_is_dropped_in_jsonl(tmp_path):
    p = write(tmp_path / "bom.jsonl", b'\xef\xbb\xbf{"text": "x"}\n')
    assert read_documents(p, "jsonl") == [Document("x", f"{p}:1")]


def test_non_utf8_names_file_and_byte_offset(tmp_path):
    p = write(tmp_path / "latin1.txt", "caf\u00e9 ok".encode("latin-1"))
    with pytest.raises(DataError) as e:
        read_documents(p, "text")
    assert str(e.value).startswith(f"{p}: not UTF-8 text at byte offset 3 (byte 0xe9).")
    assert "--config.data.errors=replace" in str(e.value)


def test_non_utf8_offset_counts_the_byte_order_mark(tmp_path):
    # The offset is into the file as it is on disk, BOM included.
    p = write(tmp_path / "bom.txt", b"\xef\xbb\xbfabc\xffdef")
    with pytest.raises(DataError, match=r"at byte offset 6 \(byte 0xff\)"):
        read_documents(p, "text")


def test_errors_replace_gives_replacement_characters(tmp_path):
    p = write(tmp_path / "bad.txt", b"ab\xffc\xe9")
    assert read_documents(p, "text", errors="replace") == [Document("ab\ufffdc\ufffd", p)]


# -------------------------------------------------------------------------------------- errors


def test_missing_path(tmp_path):
    p = str(tmp_path / "nope.txt")
    with pytest.raises(DataError, match=f"data.path: no such file '{p}'. Check the path."):
        read_documents(p, "text")


def test_missing_path_in_a_list(tmp_path):
    a = write(tmp_path / "a.txt", "x")
    p = str(tmp_path / "nope.txt")
    with pytest.raises(DataError, match=f"no such file '{p}'"):
        read_documents(f"{a},{p}", "text")


def test_empty_path_spec():
    with pytest.raises(DataError, match="data.path is empty: give a file, a glob"):
        resolve_paths(" , ")


def test_glob_matching_nothing(tmp_path):
    pattern = str(tmp_path / "*.jsonl")
    write(tmp_path / "a.txt", "x")
    with pytest.raises(DataError) as e:
        read_documents(pattern, "jsonl")
    assert f"the glob '{pattern}' matches no file" in str(e.value)
    assert "Check the folder and the pattern" in str(e.value)


def test_directory(tmp_path):
    d = tmp_path / "corpus"
    d.mkdir()
    with pytest.raises(DataError) as e:
        read_documents(str(d), "text")
    assert f"'{d}' is a directory; give its files, e.g. '{d}/*.txt'" in str(e.value)


def test_empty_files(tmp_path):
    a = write(tmp_path / "a.txt", b"")
    b = write(tmp_path / "b.txt", b"\xef\xbb\xbf")  # a BOM alone is no text
    with pytest.raises(DataError) as e:
        read_documents(f"{a},{b}", "text")
    msg = str(e.value)
    assert f"data.path='{a},{b}' holds no text to score (format 'text')" in msg
    assert "Check data.path and data.format." in msg


def test_only_blank_lines(tmp_path):
    p = write(tmp_path / "blank.txt", "\n  \n\t\r\n\n")
    with pytest.raises(DataError, match=f"data.path='{p}' holds no text to score .format 'lines'"):
        read_documents(p, "lines")


def test_jsonl_with_only_empty_texts(tmp_path):
    p = write(tmp_path / "e.jsonl", '{"text": ""}\n\n{"text": ""}\n')
    with pytest.raises(DataError, match="holds no text to score .format 'jsonl'"):
        read_documents(p, "jsonl")


def test_bad_json_line_names_file_and_line(tmp_path):
    p = write(tmp_path / "d.jsonl", '{"text": "ok"}\n\n{"text": "cut\n')
    with pytest.raises(DataError) as e:
        read_documents(p, "jsonl")
    assert str(e.value).startswith(f"{p}:3: not valid JSON (Unterminated string")


def test_jsonl_missing_field_names_file_line_and_setting(tmp_path):
    p = write(tmp_path / "d.jsonl", '{"text": "ok"}\n{"content": "x"}\n')
    with pytest.raises(DataError) as e:
        read_documents(p, "jsonl")
    assert str(e.value) == (
        f"{p}:2: no string field 'text'; set --config.data.jsonl_field to the field that holds "
        f"the text."
    )


def test_jsonl_field_that_is_not_a_string(tmp_path):
    p = write(tmp_path / "d.jsonl", '{"text": ["a", "b"]}\n')
    with pytest.raises(DataError, match=f"{p}:1: no string field 'text'"):
        read_documents(p, "jsonl")


def test_jsonl_line_that_is_not_an_object(tmp_path):
    p = write(tmp_path / "d.jsonl", '"just a string"\n')
    with pytest.raises(DataError, match=f"{p}:1: no string field 'text'"):
        read_documents(p, "jsonl")


# ---------------------------------------------------------------------------------- tokenizers


def test_byte_tokenizer():
    tok = ByteTokenizer()
    ids = tok.encode(["aé", ""])
    assert [i.tolist() for i in ids] == [[97, 0xC3, 0xA9], []]
    assert ids[0].dtype == np.int32
    assert tok.first_token_bytes("é") == 1
    assert tok.first_token_bytes("") == 0
    assert isinstance(from_description(tok.describe()), ByteTokenizer)


def test_bpe_tokenizer(bpe, bpe_tokenizer):
    from tokenizers import Tokenizer

    lib = Tokenizer.from_file(bpe_tokenizer)
    assert bpe.vocab_size == 512
    assert bpe.name == "bpe.json"
    ids = bpe.encode(["Hello world", ""])
    assert ids[0].tolist() == lib.encode("Hello world").ids
    assert len(ids[0]) < len("Hello world")  # merges are used
    assert ids[0].dtype == np.int32
    assert ids[1].tolist() == []
    for text in ("Hello world", " Hello", "\U0001f917 hi", "caf\u00e9"):
        assert bpe.first_token_bytes(text) == len(token_bytes(bpe, lib.encode(text).ids[0]))
    # A character split over several byte-level tokens: the first token is 1 of its 4 bytes.
    assert bpe.first_token_bytes("\U0001f917 hi") == 1
    again = from_description(bpe.describe())
    assert again.encode(["Hello world"])[0].tolist() == ids[0].tolist()


def test_tokenizer_file_errors(tmp_path):
    with pytest.raises(ConfigError, match="data.tokenizer: no such file"):
        HFTokenizer.from_file(str(tmp_path / "missing.json"))
    bad = write(tmp_path / "bad.json", b"{not json\xff")
    with pytest.raises(ConfigError, match=f"data.tokenizer: '{bad}' is not a valid tokenizer.json"):
        HFTokenizer.from_file(bad)


# ------------------------------------------------------------------------------------- streams


def stream(docs, tokenizer, separator, vocab_size):
    """The `sliding` protocol's stream of `docs` (one-token windows, so window k starts at k)."""
    from types import SimpleNamespace

    p = get("sliding").plan(
        docs, PlanInputs(tokenizer, vocab_size, 1, 1, False, separator=separator)
    )
    joined = separator.join(d.text for d in docs) if len(docs) > 1 else docs[0].text
    return SimpleNamespace(
        tokens=p.windows.tokens,
        doc_starts=p.doc_starts,
        num_documents=p.num_documents,
        sources=p.sources,
        text_bytes=len(joined.encode("utf-8")),
        num_bytes=p.num_bytes,
        num_words=p.num_words,
        plan=p,
    )


def test_stream_places_separators_between_documents():
    docs = [Document("ab", "x:1"), Document("", "x:2"), Document("cde", "x:3")]
    s = stream(docs, ByteTokenizer(), "\n\n", vocab_size=256)
    assert s.tokens.tolist() == [97, 98, 10, 10, 10, 10, 99, 100, 101]
    assert s.tokens.dtype == np.int32
    assert s.doc_starts.tolist() == [0, 4, 6]
    assert s.num_documents == 3
    assert s.sources == ("x:1", "x:2", "x:3")
    assert s.text_bytes == 9
    assert s.plan.describe_window(7) == "window 7, document 2 (x:3), token 1"
    # The empty document shares its offset with the next separator.
    assert s.plan.describe_window(4) == "window 4, document 1 (x:2), token 0"


def test_stream_without_separator():
    docs = [Document("ab", "a"), Document("c", "b")]
    s = stream(docs, ByteTokenizer(), "", vocab_size=256)
    assert s.tokens.tolist() == [97, 98, 99]
    assert s.doc_starts.tolist() == [0, 2]


def test_single_document_gets_no_separator():
    s = stream([Document("abc", "a")], ByteTokenizer(), "\n\n", vocab_size=256)
    assert s.tokens.tolist() == [97, 98, 99]
    assert (s.text_bytes, s.num_bytes, s.num_words) == (3, 2, 1)


def test_bpe_stream_separators_and_offsets(bpe):
    docs = [Document("Hello world", "a"), Document("Hello world", "b")]
    s = stream(docs, bpe, "\n", vocab_size=bpe.vocab_size)
    hello, newline = bpe.encode(["Hello world", "\n"])
    assert s.tokens.tolist() == [*hello, *newline, *hello]
    assert s.doc_starts.tolist() == [0, len(hello) + len(newline)]


def test_token_id_outside_the_vocabulary_names_document_and_source():
    docs = [Document("abc", "f.txt:1"), Document("xyz", "f.txt:2")]
    with pytest.raises(DataError) as e:
        stream(docs, ByteTokenizer(), "\n", vocab_size=100)
    assert str(e.value).startswith(
        "document 1 (f.txt:2): token id 120 is outside the model's vocabulary of 100. "
        "The tokenizer (byte, 256 ids) does not match the model"
    )


def test_bpe_ids_beyond_a_byte_vocabulary(bpe):
    first_merge = next(int(i) for i in bpe.encode(["Hello world"])[0] if i >= 256)
    with pytest.raises(
        DataError,
        match=rf"document 0 \(c.txt\): token id {first_merge} is outside the "
        r"model's vocabulary of 256. The tokenizer \(bpe.json, 512 ids\)",
    ):
        stream([Document("Hello world", "c.txt")], bpe, "\n\n", vocab_size=256)


def test_separator_beyond_the_vocabulary():
    docs = [Document("ab", "a"), Document("cd", "b")]
    with pytest.raises(DataError, match="data.separator '~': token id 126 is outside the model's"):
        stream(docs, ByteTokenizer(), "~", vocab_size=120)


@pytest.mark.parametrize("texts", [["a"], [""], ["", ""]])
def test_fewer_than_two_tokens(texts):
    docs = [Document(t, f"d{i}") for i, t in enumerate(texts)]
    with pytest.raises(DataError) as e:
        stream(docs, ByteTokenizer(), "", vocab_size=256)
    n = len("".join(texts))
    assert str(e.value) == (
        f"the corpus ({len(texts)} documents) tokenizes to {n} token(s); at least two are needed "
        f"to score one. Check data.path and data.format."
    )


CORPORA = [
    ["Hello world"],
    ["  leading spaces, then words.", "second doc\twith\ttabs"],
    [
        "\U0001f917 hugging face",
        "caf\u00e9 na\u00efve \u00fcber",
        "\u65e5\u672c\u8a9e \u30c6\u30b9\u30c8",
    ],
    ["\n\nstarts with blank lines\r\nand CRLF", "", "x"],
    ["\u20ac5 costs", "end"],
]


def expected_counts(texts: list[str], separator: str, first_token: bytes) -> tuple[int, int]:
    raw = separator.join(texts).encode("utf-8")
    assert raw.startswith(first_token)
    rest = raw[len(first_token) :]
    return len(rest), len(rest.decode("utf-8", errors="ignore").split())


@pytest.mark.parametrize("texts", CORPORA)
def test_byte_stream_counts_bytes_and_words_after_the_first_token(texts):
    docs = [Document(t, f"d{i}") for i, t in enumerate(texts)]
    s = stream(docs, ByteTokenizer(), "\n\n", vocab_size=256)
    raw = "\n\n".join(texts).encode("utf-8")
    assert s.tokens.tolist() == list(raw)
    assert s.text_bytes == len(raw)
    assert (s.num_bytes, s.num_words) == expected_counts(texts, "\n\n", raw[:1])


@pytest.mark.parametrize("texts", CORPORA)
def test_bpe_stream_counts_bytes_and_words_after_the_first_token(texts, bpe):
    docs = [Document(t, f"d{i}") for i, t in enumerate(texts)]
    s = stream(docs, bpe, "\n\n", vocab_size=bpe.vocab_size)
    first = token_bytes(bpe, s.tokens[0])
    assert s.text_bytes == len("\n\n".join(texts).encode("utf-8"))
    assert (s.num_bytes, s.num_words) == expected_counts(texts, "\n\n", first)
    # The stream's tokens, decoded byte by byte, are the joined text.
    decoded = b"".join(token_bytes(bpe, i) for i in s.tokens)
    assert decoded == "\n\n".join(texts).encode("utf-8")


def test_bpe_counts_on_a_real_text(bpe):
    text = helpers.stdlib_text(3000)
    s = stream([Document(text, "stdlib")], bpe, "\n\n", vocab_size=bpe.vocab_size)
    first = token_bytes(bpe, s.tokens[0])
    assert s.tokens[0] == bpe.encode([text])[0][0]
    assert s.num_bytes == len(text.encode("utf-8")) - len(first)
    assert s.num_words == len(text.encode("utf-8")[len(first) :].decode("utf-8").split())


def test_first_token_is_the_streams_own_not_the_joined_texts(bpe):
    # Tokenized apart, the first document is one token `head`, although the joined text starts
    # with a longer token (`word`, of which `head` is a prefix).
    vocab = [bpe._tok.id_to_token(i) for i in range(256, bpe.vocab_size)]
    head, word = next(
        (w[:k], w)
        for w in vocab
        if w.isalpha() and len(w) >= 4
        for k in range(2, len(w))
        if len(bpe.encode([w[:k]])[0]) == 1
        and len(bpe.encode([w + " there"])[0]) >= 2
        and token_bytes(bpe, bpe.encode([w + " there"])[0][0]) == w.encode()
    )
    docs = [Document(head, "a"), Document(word[len(head) :] + " there", "b")]
    s = stream(docs, bpe, "", bpe.vocab_size)
    assert s.num_bytes == len(word) - len(head) + len(" there")
    assert s.num_words == 2
