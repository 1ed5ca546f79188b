"""The tokenizer of a GGUF file's metadata (`ppl_jax.tokenizer.gguf`; transformers' ids on the
golden files are tests/unit/checkpoints/test_gguf_golden.py): its description rebuilds it, a long
document encodes piece by piece to the ids of the whole, and metadata it cannot build from is one
sentence naming the file."""

from __future__ import annotations

import os

import gguf
import pytest

from ppl_jax.errors import CheckpointError
from ppl_jax.tokenizer import from_description
from ppl_jax.tokenizer import gguf as gguf_tokenizer

import helpers


def metadata(name: str) -> dict:
    reader = gguf.GGUFReader(os.path.join(helpers.GOLDEN, "gguf", f"{name}.gguf"))
    return {k: f.contents() for k, f in reader.fields.items() if not k.startswith("GGUF.")}


@pytest.mark.parametrize("name", ["llama_kquants", "gemma3", "qwen3", "gpt2"])
def test_description_rebuilds_it_and_long_documents_encode_as_a_whole(name):
    tok = gguf_tokenizer.build(metadata(name), name, name)
    text = ("On the fifth day the rain stopped; the water fell by 12 inches.  Then,\n\nat last "
            "the sun came out over ünïcödé fields. ") * 20  # fmt: skip
    whole = tok.encode([text])[0].tolist()
    again = from_description(tok.describe())
    assert (again.bos_id, again.eos_id, again.add_bos_default) == (
        tok.bos_id, tok.eos_id, tok.add_bos_default
    )  # fmt: skip
    assert again.encode([text])[0].tolist() == whole
    tok.piece_chars = 50  # cut into pieces at spaces where the tokenizer allows it
    ids, lengths = tok.encode_with_bytes([text])[0]
    assert ids.tolist() == whole and int(lengths.sum()) == len(text.encode("utf-8"))


@pytest.mark.parametrize("change,match", [
    ({"tokenizer.ggml.model": "t5"}, "the tokenizer model 't5', which ppl_jax does not build"),
    ({"tokenizer.ggml.tokens": None}, "has no tokenizer.ggml.tokens"),
    ({"tokenizer.ggml.token_type": [1, 1]}, "token_type is not a list of one entry per token"),
    ({"tokenizer.ggml.bos_token_id": 10**6}, "bos_token_id 1000000 is not a token id"),
    ({"tokenizer.ggml.merges": None}, "a byte-level vocabulary without tokenizer.ggml.merges"),
    ({"tokenizer.ggml.merges": ["ab"]}, "a tokenizer.ggml.merges entry is not two tokens"),
])  # fmt: skip
def test_metadata_it_cannot_build_from_is_one_sentence(change, match):
    meta = {**metadata("qwen3"), **change}
    with pytest.raises(CheckpointError, match=match):
        gguf_tokenizer.build(meta, "qwen3.gguf", "'qwen3.gguf'")


def test_sentencepiece_scores_of_the_wrong_length():
    meta = {**metadata("llama_kquants"), "tokenizer.ggml.scores": [0.0]}
    with pytest.raises(CheckpointError, match="scores is not a list of one entry per token"):
        gguf_tokenizer.build(meta, "x", "'x.gguf'")


def test_merges_that_make_no_token_are_left_out():
    """A merge whose result is not in the vocabulary (llama.cpp spells it out again; the
    `tokenizers` library would panic on it) changes no id."""
    meta = metadata("qwen3")
    tok = gguf_tokenizer.build(meta, "a", "a")
    spelled = gguf_tokenizer.byte_alphabet()
    odd = {**meta, "tokenizer.ggml.merges": [f"{spelled[0]} {spelled[1]}", *meta[
        "tokenizer.ggml.merges"]]}  # fmt: skip
    text = "the river rose \x00\x01 until the fields"
    assert gguf_tokenizer.build(odd, "b", "b").encode([text])[0].tolist() == tok.encode([text])[
        0].tolist()  # fmt: skip
