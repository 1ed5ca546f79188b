"""The GPT-2 tokenizer itself, and real text (Tiny Shakespeare), from the PPL_JAX_TEST_DATA folder
(data the project may not ship; this folder is collected only when that variable names one)."""

import os

import numpy as np
import pytest
from test_data import stream, token_bytes

from ppl_jax.data.documents import Document
from ppl_jax.errors import DataError
from ppl_jax.tokenizer import HFTokenizer, from_description


@pytest.fixture(scope="module")
def gpt2(test_data) -> HFTokenizer:
    return HFTokenizer.from_file(os.path.join(test_data, "tokenizers", "gpt2.json"))


def test_gpt2_tokenizer(gpt2):
    assert gpt2.vocab_size == 50257
    assert gpt2.name == "gpt2.json"
    ids = gpt2.encode(["Hello world", ""])
    assert ids[0].tolist() == [15496, 995]
    assert ids[0].dtype == np.int32
    assert ids[1].tolist() == []
    assert gpt2.first_token_bytes("Hello world") == 5
    assert gpt2.first_token_bytes(" Hello") == 6
    # A character split over several byte-level tokens: the first token is 2 of its 4 bytes.
    assert gpt2.first_token_bytes("\U0001f917 hi") == 2
    again = from_description(gpt2.describe())
    assert again.encode(["Hello world"])[0].tolist() == [15496, 995]


def test_gpt2_stream_separators_and_offsets(gpt2):
    docs = [Document("Hello world", "a"), Document("Hello world", "b")]
    s = stream(docs, gpt2, "\n", vocab_size=gpt2.vocab_size)
    assert s.tokens.tolist() == [15496, 995, 198, 15496, 995]
    assert s.doc_starts.tolist() == [0, 3]


def test_gpt2_ids_beyond_a_byte_vocabulary(gpt2):
    with pytest.raises(
        DataError,
        match=r"document 0 \(c.txt\): token id 15496 is outside the "
        r"model's vocabulary of 256. The tokenizer \(gpt2.json, 50257 ids\)",
    ):
        stream([Document("Hello world", "c.txt")], gpt2, "\n\n", vocab_size=256)


def test_gpt2_counts_on_a_real_text(gpt2, test_data):
    with open(os.path.join(test_data, "tinyshakespeare", "input.txt"), encoding="utf-8") as f:
        text = f.read(3000)
    s = stream([Document(text, "shakespeare")], gpt2, "\n\n", vocab_size=gpt2.vocab_size)
    assert text.startswith("First Citizen:")
    assert s.tokens[0] == gpt2.encode(["First"])[0][0]
    assert token_bytes(gpt2, s.tokens[0]) == b"First"
    assert s.num_bytes == len(text.encode("utf-8")) - len("First")
    assert s.num_words == len(text[len("First") :].split())
    # Every token decoded byte by byte gives back the text.
    assert b"".join(token_bytes(gpt2, i) for i in s.tokens) == text.encode("utf-8")


@pytest.mark.parametrize("protocol", ["sliding", "lm_eval_rolling"])
def test_wikitext_through_the_token_cache_in_three_shares(gpt2, test_data, tmp_path, protocol):
    """WikiText-2 test (its articles) through GPT-2: the token cache written in three shares
    plans exactly what `Protocol.plan` plans from the documents in memory."""
    from ppl_jax.data import documents as data
    from ppl_jax.plans import protocols, token_cache

    path = os.path.join(test_data, "wikitext-2", "test.txt")
    docs = data.read_documents(path, "wikitext")
    ds = type("DS", (), dict(path=path, format="wikitext", errors="strict", jsonl_field="text"))
    for i in range(3):
        token_cache.build_part(ds, gpt2, str(tmp_path), i, 3, len(docs))
    token_cache.write_parts(str(tmp_path), 3, len(docs))
    entry = token_cache.open_entry(str(tmp_path))
    stride = 512 if protocol == "sliding" else None
    inputs = protocols.PlanInputs(gpt2, gpt2.vocab_size, 1024, stride, False)
    want = protocols.get(protocol).plan(docs, inputs)
    got = protocols.get(protocol).stream_plan(entry, inputs, str(tmp_path / "s.npy"))
    assert got.tokens_digest == protocols.tokens_digest(want.windows.tokens)
    for name in ("starts", "lengths", "prefix", "first_scored", "document"):
        np.testing.assert_array_equal(getattr(got.windows, name), getattr(want.windows, name))
    np.testing.assert_array_equal(got.doc_starts, want.doc_starts)
    for name in ("num_bytes", "num_words", "text_tokens", "unscored_tokens", "num_documents"):
        assert getattr(got, name) == getattr(want, name), name
    if protocol == "sliding":
        np.testing.assert_array_equal(got.window_bytes, want.window_bytes)
    else:
        np.testing.assert_array_equal(got.doc_words, want.doc_words)
