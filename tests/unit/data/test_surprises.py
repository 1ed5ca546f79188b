"""No silent surprises in reading a corpus (issue 19): a `.jsonl` path is read as JSON Lines by
default (`data.format=auto`), a `.json` or `.parquet` one is refused with the fix; a lone
surrogate in JSONL is one sentence (strict) or U+FFFD (replace); the tokenized WikiText
(`<unk>`) is refused by the preparations defined on the raw text."""

from __future__ import annotations

import json

import pytest

from ppl_jax.data import documents as data
from ppl_jax.data import preparations
from ppl_jax.data.spec import DatasetSpec, infer_format
from ppl_jax.errors import ConfigError, DataError


@pytest.mark.parametrize(
    ("path", "fmt"),
    [
        ("/d/val.jsonl", "jsonl"),
        ("/d/val.jsonl.gz", "jsonl"),
        ("/d/*.ndjson.zst", "jsonl"),
        ("/d/a.jsonl,/d/b.JSONL", "jsonl"),
        ("/d/wiki.test.raw", "text"),
        ("/d/*.txt", "text"),
        ("/d/*", "text"),
    ],
)
def test_auto_format_follows_the_extension(path, fmt):
    assert infer_format(path) == fmt
    assert DatasetSpec(path=path).format == fmt
    assert DatasetSpec(path=path, format="text").format == "text"  # said, not inferred


@pytest.mark.parametrize(
    ("path", "why"),
    [
        ("/d/val.json", "looks like a JSON document"),
        ("/d/val.parquet", "does not read Parquet"),
        ("/d/a.jsonl,/d/b.txt", "mixes JSON Lines with other files"),
    ],
)
def test_auto_format_refuses_what_it_cannot_tell(path, why):
    with pytest.raises(ConfigError, match=why):
        DatasetSpec(path=path, where="data")


def test_a_jsonl_file_is_scored_as_its_records_by_default(tmp_path):
    path = tmp_path / "val.jsonl"
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in ("one", "two")))
    ds = DatasetSpec(path=str(path))
    docs = data.read_documents(ds.path, ds.format)
    assert [d.text for d in docs] == ["one", "two"]  # not '{"text": "one"}'


def test_a_lone_surrogate_is_one_sentence_or_replaced(tmp_path):
    path = tmp_path / "val.jsonl"
    path.write_text('{"text": "ok"}\n{"text": "a\\ud800b\\ud83d\\ude00"}\n')
    with pytest.raises(
        DataError, match=r"val.jsonl:2: .*lone surrogate \(\\ud800 at character 1\)"
    ):
        data.read_documents(str(path), "jsonl")
    for docs in (
        data.read_documents(str(path), "jsonl", "replace"),
        list(data.iter_documents(str(path), "jsonl", "replace")),
    ):
        assert docs[1].text == "a\ufffdb\U0001f600"  # a pair stays one character
        docs[1].text.encode("utf-8")  # and the text is UTF-8 now


def test_the_tokenized_wikitext_is_refused_by_the_raw_preparations():
    tokens = data.Document(" = Title = \n \n Some <unk> words @-@ here . \n", "wiki.test.tokens")
    raw = data.Document(" = Title = \n \n Some rare words @-@ here . \n", "wiki.test.raw")
    for name in preparations.PREPARATIONS:
        with pytest.raises(DataError, match=r"wiki.test.tokens: holds '<unk>' \(1 times\)"):
            preparations.apply_preparation(name, [tokens])
        assert preparations.apply_preparation(name, [raw]).documents
