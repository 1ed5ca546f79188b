"""`documents.jsonl` is written exactly when `output.per_document` asks for it (issue 19: it was
written without; the one job path writes it only then)."""

from __future__ import annotations

import dataclasses
import json

import pytest
from test_diagnostics import run, settings

from ppl_jax import tokenizer

import helpers


@pytest.fixture(scope="module")
def checkpoint_with_eot(tmp_path_factory) -> str:
    """A tiny Llama whose stored tokenizer is a byte-level BPE with <|endoftext|>
    (lm_eval_rolling's prefix token)."""
    bpe = helpers.train_bpe([helpers.stdlib_text(3000)], vocab_size=256)
    desc = {"type": "hf", "name": "tokenizer.json", "tokenizer_json": bpe.to_str()}
    size = tokenizer.from_description(desc).vocab_size  # 256 bytes and <|endoftext|>
    path = str(tmp_path_factory.mktemp("eot") / "tiny")
    helpers.save_random_checkpoint(
        path, dataclasses.replace(helpers.TINY, vocab_size=size), tokenizer=desc
    )
    return path


@pytest.mark.parametrize("per_document", [False, True])
def test_documents_jsonl_only_when_asked(checkpoint_with_eot, tmp_path, per_document):
    texts = [helpers.stdlib_text(300), helpers.stdlib_text(200)[50:]]
    corpus = helpers.corpus_files(tmp_path, texts)
    out = tmp_path / "out"
    s = settings(
        checkpoint_with_eot,
        corpus,
        out,
        eval__protocol="lm_eval_rolling",
        eval__stride=None,
        output__per_document=per_document,
    )
    ev = run(s)
    written = out / "documents.jsonl"
    assert written.exists() == per_document
    if per_document:
        docs = [json.loads(line) for line in written.read_text().splitlines()]
        assert len(docs) == 2
        assert sum(d["num_tokens"] for d in docs) == ev.sums.num_tokens
        assert sum(-d["loglikelihood"] for d in docs) == pytest.approx(ev.sums.nll_sum, rel=1e-9)
