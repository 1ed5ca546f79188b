"""A reference model with another tokenizer of the same vocabulary size is refused before any
weight is read (issue 19 item 5): KL compares two models on the same token ids."""

from __future__ import annotations

import json

import pytest
from test_diagnostics import corpus, run, settings  # noqa: F401  (a fixture)

from ppl_jax import tokenizer
from ppl_jax.checkpoints.formats import orbax as checkpoint
from ppl_jax.errors import ConfigError
from ppl_jax.evaluation.run import setup

import helpers


def test_a_reference_with_another_tokenizer_of_the_same_size_is_refused(
    tiny_checkpoint,
    corpus,  # noqa: F811  (the fixture imported above)
    tmp_path,
    monkeypatch,
):
    bpe = helpers.train_bpe([helpers.stdlib_text(3000)], vocab_size=256, specials=())
    desc = {"type": "hf", "name": "tokenizer.json", "tokenizer_json": bpe.to_str()}
    assert tokenizer.from_description(desc).vocab_size == 256  # the model's size (byte ids)
    other = str(tmp_path / "other")
    helpers.save_random_checkpoint(other, tokenizer=desc)
    monkeypatch.setattr(
        checkpoint, "restore_params", lambda *a: pytest.fail("weights read before the check")
    )
    s = settings(tiny_checkpoint, corpus, tmp_path / "out", reference__checkpoint__dir=other)
    with pytest.raises(
        ConfigError, match=r"another tokenizer \(hf tokenizer.json\) than .*\(byte\)"
    ):
        run(s)


def test_the_same_tokenizer_in_another_file_is_the_same_vocabulary():
    bpe = helpers.train_bpe([helpers.stdlib_text(2000)], vocab_size=300)
    a = tokenizer.from_description({"type": "hf", "name": "a", "tokenizer_json": bpe.to_str()})
    pretty = json.dumps(json.loads(bpe.to_str()), indent=2)
    b = tokenizer.from_description({"type": "hf", "name": "b", "tokenizer_json": pretty})
    b.bos_id = 0  # a BOS policy does not change which string an id names
    assert setup.vocabulary(a) == setup.vocabulary(b)
    assert setup.vocabulary(a) != setup.vocabulary(tokenizer.load_tokenizer("byte", None))
