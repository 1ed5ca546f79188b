"""Tokenizers of Hugging Face directories: SentencePiece against the sentencepiece library, BOS/EOS
policy as transformers' AutoTokenizer has it (golden ids written by
tests/golden/make_tokenizer_golden.py; no transformers needed here), description round trips,
and the vocabulary check. Fixtures: the small tokenizers committed in tests/golden/tokenizers."""

import json
import os
import shutil

import numpy as np
import pytest

from ppl_jax.checkpoints.formats import safetensors
from ppl_jax.errors import CheckpointError, ConfigError
from ppl_jax.tokenizer import (
    ByteTokenizer,
    HFTokenizer,
    SentencePieceTokenizer,
    check_vocabulary,
    from_description,
    load_tokenizer,
)

import helpers

FIXTURES = os.path.join(helpers.REPO, "tests", "golden", "tokenizers")
SP_MODEL = os.path.join(FIXTURES, "sp_unigram.model")  # nmt_nfkc, extra whitespace removed
BYTELEVEL = os.path.join(FIXTURES, "bytelevel_bpe.json")
with open(os.path.join(FIXTURES, "golden_ids.json"), encoding="utf-8") as _f:
    GOLDEN = json.load(_f)
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


def test_sentencepiece_matches_the_library():
    import sentencepiece

    sp = sentencepiece.SentencePieceProcessor(model_file=SP_MODEL)
    tok = SentencePieceTokenizer.from_file(SP_MODEL)
    assert tok.vocab_size == 400 == sp.get_piece_size()
    ours = tok.encode(SENTENCES)
    for text, ids in zip(SENTENCES, ours, strict=True):
        assert ids.dtype == np.int32
        assert ids.tolist() == sp.encode(text)  # the library's default: no BOS, no EOS
    assert (tok.bos_id, tok.eos_id, tok.add_bos_default) == (sp.bos_id(), sp.eos_id(), False)
    # "▁ H(unk) e l l o": a lone dummy "▁" covers no byte; the two leading spaces that
    # normalization drops count with the first piece of the second sentence.
    assert sp.encode("  leading", out_type=str)[0] == "▁"
    assert [tok.first_token_bytes(t) for t in SENTENCES] == [0, 2, 0, 0, 0]
    # Byte lengths per token cover the whole text; dropped whitespace counts with the next piece.
    for text, ids, (ids2, lengths) in zip(
        SENTENCES, ours, tok.encode_with_bytes(SENTENCES), strict=True
    ):
        assert ids2.tolist() == ids.tolist() and lengths.dtype == np.int32
        assert lengths.sum() == len(text.encode("utf-8"))
    # "  " + "▁", "a", "b", "  " + "▁", "c" + the trailing space.
    assert sp.encode("  ab  c ", out_type=str) == ["▁", "a", "b", "▁", "c"]
    assert tok.encode_with_bytes(["  ab  c "])[0][1].tolist() == [2, 1, 1, 2, 2]


def test_sentencepiece_description_round_trip():
    tok = SentencePieceTokenizer.from_file(SP_MODEL)
    tok.add_bos_default = True
    desc = json.loads(json.dumps(tok.describe()))  # JSON-able, as stored beside a checkpoint
    again = from_description(desc)
    assert isinstance(again, SentencePieceTokenizer) and again.name == "sp_unigram.model"
    assert (again.bos_id, again.eos_id, again.add_bos_default, again.vocab_size) == (
        1,
        2,
        True,
        400,
    )
    for a, b in zip(tok.encode(SENTENCES), again.encode(SENTENCES), strict=True):
        assert a.tolist() == b.tolist()
    assert (
        load_tokenizer(SP_MODEL, None).encode(["Hello"])[0].tolist()
        == tok.encode(["Hello"])[0].tolist()
    )


def test_sentencepiece_directory_with_llama_tokenizer_config(tmp_path):
    shutil.copy(SP_MODEL, tmp_path / "tokenizer.model")
    plain = safetensors.read_tokenizer(str(tmp_path))
    assert isinstance(plain, SentencePieceTokenizer)
    assert (plain.bos_id, plain.eos_id, plain.add_bos_default) == (1, 2, False)
    _write_config(
        tmp_path,
        bos_token={"content": "<s>", "lstrip": False},
        eos_token="</s>",
        add_bos_token=True,
        add_eos_token=False,
    )
    tok = safetensors.read_tokenizer(str(tmp_path))
    assert (tok.bos_id, tok.eos_id, tok.add_bos_default) == (1, 2, True)
    again = from_description(tok.describe())
    assert (again.bos_id, again.eos_id, again.add_bos_default) == (1, 2, True)
    _write_config(tmp_path, bos_token="<never>")
    with pytest.raises(
        CheckpointError, match="names bos_token '<never>', which the tokenizer lacks"
    ):
        safetensors.read_tokenizer(str(tmp_path))


def test_bytelevel_tokenizer_json_policy(tmp_path):
    from tokenizers import Tokenizer

    shutil.copy(BYTELEVEL, tmp_path / "tokenizer.json")
    tok = safetensors.read_tokenizer(str(tmp_path))
    assert isinstance(tok, HFTokenizer)
    # GPT-2 style: no BOS added; <|endoftext|> is its EOS and, by name, its BOS.
    eot = Tokenizer.from_file(BYTELEVEL).token_to_id("<|endoftext|>")
    assert (tok.add_bos_default, tok.eos_id, tok.bos_id) == (False, eot, eot)
    lib = Tokenizer.from_file(BYTELEVEL).encode("Hello world", add_special_tokens=False)
    assert tok.encode(["Hello world"])[0].tolist() == lib.ids
    # add_bos_token: true beside a tokenizer.json changes nothing (transformers 5 drops it).
    _write_config(
        tmp_path, bos_token="<|endoftext|>", eos_token="<|endoftext|>", add_bos_token=True
    )
    tok = safetensors.read_tokenizer(str(tmp_path))
    assert (tok.add_bos_default, tok.eos_id, tok.bos_id) == (False, eot, eot)
    again = from_description(json.loads(json.dumps(tok.describe())))
    assert (again.add_bos_default, again.eos_id, again.bos_id) == (False, eot, eot)
    # A description stored before the BOS/EOS fields existed gets the tokenizer's own.
    old = {k: v for k, v in tok.describe().items() if k in ("type", "name", "tokenizer_json")}
    assert from_description(old).eos_id == eot


@pytest.mark.parametrize("case", GOLDEN["cases"], ids=lambda c: c["name"])
def test_ids_and_specials_match_transformers_golden(tmp_path, case):
    """ppl_jax's ids (BOS placed by `add_bos_default`) equal what transformers' AutoTokenizer
    gave for the same directory (recorded by tests/golden/make_tokenizer_golden.py), and so do
    the BOS and EOS ids and the lm_eval_rolling prefix (BOS, else EOS: lm-eval's
    `prefix_token_id`)."""
    for dst, src in case["files"].items():
        shutil.copy(os.path.join(FIXTURES, src), tmp_path / dst)
    _write_config(tmp_path, **case["tokenizer_config"])
    (tmp_path / "config.json").write_text(json.dumps(case["config"]))
    tok = safetensors.read_tokenizer(str(tmp_path))
    theirs = case["transformers"]
    bos = [tok.bos_id] if tok.add_bos_default else []
    for text, ids in zip(case["texts"], theirs["input_ids"], strict=True):
        assert bos + tok.encode([text])[0].tolist() == ids, text
    assert (tok.bos_id, tok.eos_id) == (theirs["bos_token_id"], theirs["eos_token_id"])
    prefix = tok.bos_id if tok.bos_id is not None else tok.eos_id
    theirs_bos = theirs["bos_token_id"]
    assert prefix == (theirs_bos if theirs_bos is not None else theirs["eos_token_id"])


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
        # add_bos_token is dropped beside a tokenizer.json (transformers 5): the
        # post-processor alone decides.
        (False, {"bos_token": "<s>", "eos_token": "</s>", "add_bos_token": True}, (1, 2, False)),
        (True, {"add_bos_token": False}, (1, 2, True)),
        (True, {"bos_token": None, "eos_token": "<s>"}, (None, 1, False)),
    ],
)
def test_tokenizer_json_bos_policy(tmp_path, post_processor, config, expected):
    (tmp_path / "tokenizer.json").write_text(_llama_style_tokenizer_json(post_processor))
    if config is not None:
        _write_config(tmp_path, **config)
    if expected[0] is None:  # the tokenizer prepends <s>, the config says there is no BOS
        with pytest.raises(CheckpointError, match="asks for a BOS token but names none"):
            safetensors.read_tokenizer(str(tmp_path))
        return
    tok = safetensors.read_tokenizer(str(tmp_path))
    assert (tok.bos_id, tok.eos_id, tok.add_bos_default) == expected
    assert tok.encode(["hello world"])[0].tolist() == [3, 4]  # encode never adds specials
    assert (
        load_tokenizer(str(tmp_path), None).add_bos_default == expected[2]
    )  # data.tokenizer=<dir>


def test_no_tokenizer(tmp_path):
    assert not safetensors.has_tokenizer(str(tmp_path))
    with pytest.raises(CheckpointError, match="has no tokenizer.json or tokenizer.model"):
        safetensors.read_tokenizer(str(tmp_path))


def test_span_lengths_counts_each_fallback_byte_once():
    from ppl_jax.tokenizer.core import span_lengths as _span_lengths

    # "€" (3 bytes) as three <0xNN> pieces sharing its span, then "ab", then a trailing space.
    assert _span_lengths([3, 3, 3, 5], [True, True, True, False], 6).tolist() == [1, 1, 1, 3]
    # Whitespace a normalizer dropped counts with the next piece.
    assert _span_lengths([4, 7], [False, False], 7).tolist() == [4, 3]
    assert _span_lengths([], [], 0).tolist() == []


@pytest.mark.parametrize(
    "tokenizer_ids,model_ids,fits",
    [
        (50257, 50257, True),  # the same
        (50257, 50304, True),  # GPT-2 padded to a multiple of 64 (nanoGPT)
        (50257, 50432, True),  # to a multiple of 128
        (50257, 50368, True),  # 0.2% larger (neither next multiple of 64 nor of 128)
        (32000, 32000 + 320, True),  # 1% larger
        (32000, 32000 + 321, False),
        (50257, 50256, False),  # the model smaller than the tokenizer
        (1000, 50257, False),  # the reported case: a 1,000-id SentencePiece model on GPT-2
        (256, 256, True),
    ],
)
def test_check_vocabulary(tokenizer_ids, model_ids, fits):
    tok = ByteTokenizer()
    tok.vocab_size = tokenizer_ids
    if fits:
        assert check_vocabulary(tok, model_ids, allow_mismatch=False) is None
        return
    with pytest.raises(ConfigError) as e:
        check_vocabulary(tok, model_ids, allow_mismatch=False)
    for part in (f"{tokenizer_ids} ids", str(model_ids), "'byte'"):
        assert part in str(e.value)
    assert "data.allow_tokenizer_mismatch=true" in str(e.value)
    note = check_vocabulary(tok, model_ids, allow_mismatch=True)
    assert f"{tokenizer_ids} ids" in note and str(model_ids) in note


@pytest.mark.parametrize("method", ["encode", "encode_with_bytes", "encode_flat_with_bytes"])
def test_a_str_in_place_of_the_list_is_refused(method):
    """`encode("a string")` encoded each character as a text of its own, silently (issue 39,
    item 9); the list of one text still works."""
    for tok in (
        ByteTokenizer(),
        HFTokenizer.from_file(BYTELEVEL),
        SentencePieceTokenizer.from_file(SP_MODEL),
    ):
        with pytest.raises(
            TypeError, match=rf"Tokenizer.{method} takes a list of texts, not a str"
        ):
            getattr(tok, method)("Hello world.")
        assert getattr(tok, method)(["Hello world."]) is not None
