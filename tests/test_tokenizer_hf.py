"""Tokenizers of Hugging Face directories: SentencePiece against the sentencepiece library, BOS/EOS
policy from tokenizer_config.json or from the tokenizer itself, description round trips."""

import json
import os
import shutil

import numpy as np
import pytest

from ppl_jax import hf
from ppl_jax.errors import CheckpointError
from ppl_jax.tokenizer import HFTokenizer, SentencePieceTokenizer, from_description, load

import helpers

SP_MODEL = os.path.join(helpers.SHARED_DATA, "tokenizers", "sentencepiece_test.model")
needs_shared_data = pytest.mark.skipif(
    not os.path.isdir(helpers.SHARED_DATA),
    reason=f"the shared test data folder {helpers.SHARED_DATA} is absent",
)
SENTENCES = [
    "Hello world.",
    "  leading spaces and   inner ones",
    "é café naïve 😀 日本語",
    "I saw a girl with a telescope.",
    "",
]


def _write_config(path, **config):
    with open(os.path.join(path, "tokenizer_config.json"), "w") as f:
        json.dump(config, f)


@needs_shared_data
def test_sentencepiece_matches_the_library():
    import sentencepiece

    sp = sentencepiece.SentencePieceProcessor(model_file=SP_MODEL)
    tok = SentencePieceTokenizer.from_file(SP_MODEL)
    assert tok.vocab_size == 1000 == sp.get_piece_size()
    ours = tok.encode(SENTENCES)
    for text, ids in zip(SENTENCES, ours, strict=True):
        assert ids.dtype == np.int32
        assert ids.tolist() == sp.encode(text)  # the library's default: no BOS, no EOS
    assert ours[0].tolist() == [151, 88, 21, 887, 6]  # ▁He ll o ▁world .
    assert (tok.bos_id, tok.eos_id, tok.add_bos_default) == (1, 2, False)
    # Bytes of the text up to the end of the first piece: "He"; the two leading spaces that
    # normalization drops before "▁"; nothing for a bare "▁" before an unknown "é".
    assert [tok.first_token_bytes(t) for t in SENTENCES] == [2, 2, 0, 1, 0]
    # Byte lengths per token cover the whole text; dropped whitespace counts with the next piece.
    for text, ids, (ids2, lengths) in zip(
        SENTENCES, ours, tok.encode_with_bytes(SENTENCES), strict=True
    ):
        assert ids2.tolist() == ids.tolist() and lengths.dtype == np.int64
        assert lengths.sum() == len(text.encode("utf-8"))
    assert tok.encode_with_bytes(["Hello world."])[0][1].tolist() == [2, 2, 1, 6, 1]
    # "  a" (leading spaces dropped before "▁a"), "b", "  c " (inner and trailing spaces).
    assert tok.encode_with_bytes(["  ab  c "])[0][1].tolist() == [3, 1, 4]


@needs_shared_data
def test_sentencepiece_description_round_trip():
    tok = SentencePieceTokenizer.from_file(SP_MODEL)
    tok.add_bos_default = True
    desc = json.loads(json.dumps(tok.describe()))  # JSON-able, as stored beside a checkpoint
    again = from_description(desc)
    assert isinstance(again, SentencePieceTokenizer) and again.name == "sentencepiece_test.model"
    assert (again.bos_id, again.eos_id, again.add_bos_default, again.vocab_size) == (
        1,
        2,
        True,
        1000,
    )
    for a, b in zip(tok.encode(SENTENCES), again.encode(SENTENCES), strict=True):
        assert a.tolist() == b.tolist()
    assert load(SP_MODEL, None).encode(["Hello"])[0].tolist() == tok.encode(["Hello"])[0].tolist()


@needs_shared_data
def test_sentencepiece_directory_with_llama_tokenizer_config(tmp_path):
    shutil.copy(SP_MODEL, tmp_path / "tokenizer.model")
    plain = hf.load_tokenizer(str(tmp_path))
    assert isinstance(plain, SentencePieceTokenizer)
    assert (plain.bos_id, plain.eos_id, plain.add_bos_default) == (1, 2, False)
    _write_config(
        tmp_path,
        bos_token={"content": "<s>", "lstrip": False},
        eos_token="</s>",
        add_bos_token=True,
        add_eos_token=False,
    )
    tok = hf.load_tokenizer(str(tmp_path))
    assert (tok.bos_id, tok.eos_id, tok.add_bos_default) == (1, 2, True)
    again = from_description(tok.describe())
    assert (again.bos_id, again.eos_id, again.add_bos_default) == (1, 2, True)
    _write_config(tmp_path, bos_token="<never>")
    with pytest.raises(
        CheckpointError, match="names bos_token '<never>', which the tokenizer lacks"
    ):
        hf.load_tokenizer(str(tmp_path))


@needs_shared_data
def test_gpt2_tokenizer_json_policy(tmp_path):
    shutil.copy(helpers.GPT2_TOKENIZER, tmp_path / "tokenizer.json")
    tok = hf.load_tokenizer(str(tmp_path))
    assert isinstance(tok, HFTokenizer)
    # GPT-2 adds no BOS; <|endoftext|> is its EOS (and its BOS, as in transformers' GPT2Tokenizer).
    assert (tok.add_bos_default, tok.eos_id, tok.bos_id) == (False, 50256, 50256)
    assert tok.encode(["Hello world"])[0].tolist() == [15496, 995]
    _write_config(
        tmp_path, bos_token="<|endoftext|>", eos_token="<|endoftext|>", add_prefix_space=False
    )
    tok = hf.load_tokenizer(str(tmp_path))
    assert (tok.add_bos_default, tok.eos_id, tok.bos_id) == (False, 50256, 50256)
    again = from_description(json.loads(json.dumps(tok.describe())))
    assert (again.add_bos_default, again.eos_id, again.bos_id) == (False, 50256, 50256)
    # A description stored before the BOS/EOS fields existed gets the tokenizer's own.
    old = {k: v for k, v in tok.describe().items() if k in ("type", "name", "tokenizer_json")}
    assert from_description(old).eos_id == 50256


def _llama_style_tokenizer_json(post_processor: bool) -> str:
    """A word-level tokenizer.json with <s> and </s>; with the post-processor, encoding with
    special tokens prepends <s> (as Llama's tokenizer.json does)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, "hello": 3, "world": 4}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.add_special_tokens(["<unk>", "<s>", "</s>"])
    if post_processor:
        tok.post_processor = processors.TemplateProcessing(
            single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", 1)]
        )
    return tok.to_str()


@pytest.mark.parametrize(
    "post_processor,config,expected",
    [
        (True, None, (1, 2, True)),  # from the tokenizer itself: it prepends <s>
        (False, None, (1, 2, False)),  # it prepends nothing; <s> and </s> found by name
        (False, {"bos_token": "<s>", "eos_token": "</s>", "add_bos_token": True}, (1, 2, True)),
        (True, {"add_bos_token": False}, (1, 2, False)),  # the config wins
        (True, {"bos_token": None, "eos_token": "<s>"}, (None, 1, False)),
    ],
)
def test_tokenizer_json_bos_policy(tmp_path, post_processor, config, expected):
    (tmp_path / "tokenizer.json").write_text(_llama_style_tokenizer_json(post_processor))
    if config is not None:
        _write_config(tmp_path, **config)
    if expected[0] is None:  # the tokenizer prepends <s>, the config says there is no BOS
        with pytest.raises(CheckpointError, match="asks for a BOS token but names none"):
            hf.load_tokenizer(str(tmp_path))
        return
    tok = hf.load_tokenizer(str(tmp_path))
    assert (tok.bos_id, tok.eos_id, tok.add_bos_default) == expected
    assert tok.encode(["hello world"])[0].tolist() == [3, 4]  # encode never adds specials
    assert load(str(tmp_path), None).add_bos_default == expected[2]  # data.tokenizer=<dir>


def test_transformers_agrees_on_the_bos_policy(tmp_path):
    """transformers' own tokenizer, loading the same directory, prepends BOS exactly when ppl_jax
    says the tokenizer does."""
    tf = pytest.importorskip("transformers", reason="the reference tokenizer needs transformers")
    (tmp_path / "tokenizer.json").write_text(_llama_style_tokenizer_json(True))
    _write_config(tmp_path, bos_token="<s>", eos_token="</s>", unk_token="<unk>")
    ours = hf.load_tokenizer(str(tmp_path))
    theirs = tf.AutoTokenizer.from_pretrained(str(tmp_path))
    ids = theirs("hello world")["input_ids"]
    assert ours.add_bos_default and ids == [ours.bos_id] + ours.encode(["hello world"])[0].tolist()
    assert theirs.eos_token_id == ours.eos_id


def test_no_tokenizer(tmp_path):
    assert not hf.has_tokenizer(str(tmp_path))
    with pytest.raises(CheckpointError, match="has no tokenizer.json or tokenizer.model"):
        hf.load_tokenizer(str(tmp_path))


def test_span_lengths_counts_each_fallback_byte_once():
    from ppl_jax.tokenizer import _span_lengths

    # "€" (3 bytes) as three <0xNN> pieces sharing its span, then "ab", then a trailing space.
    assert _span_lengths([3, 3, 3, 5], [True, True, True, False], 6).tolist() == [1, 1, 1, 3]
    # Whitespace a normalizer dropped counts with the next piece.
    assert _span_lengths([4, 7], [False, False], 7).tolist() == [4, 3]
    assert _span_lengths([], [], 0).tolist() == []
