"""`data.max_tokens` means tokens (issue 39, item 12): documents in order until their tokens
reach it, the one that crosses it cut at a token boundary; the cut text's bytes and words are
those of the prefix scored. `data.max_documents` and a sample seed pick the documents first."""

from __future__ import annotations

import numpy as np
import pytest
from test_plan_cache import settings

from ppl_jax import tokenizer
from ppl_jax.data.documents import Document
from ppl_jax.plans import planner, protocols

import helpers

TEXTS = ["Hello world, once.\n", "Ünïcode text is here; " * 30, "never reached " * 10]


def budgeted(tmp_path, max_tokens: int, texts=TEXTS, **overrides):
    path = helpers.corpus_files(tmp_path, texts)
    return settings(path, "", "sliding", max_tokens=max_tokens, **overrides).data


@pytest.mark.parametrize(
    "max_tokens, kept",
    # 20: the second document's first byte is half of "Ü": left out, and the document with it
    [(2, 2), (7, 7), (19, 19), (20, 19), (21, 21), (333, 333), (10_000, 879)],
)
def test_the_byte_budget_keeps_exactly_that_many_tokens(tmp_path, max_tokens, kept):
    tok = tokenizer.load_tokenizer("byte", None)
    ds = budgeted(tmp_path, max_tokens)
    docs = planner.read(ds, tok)[0]
    assert sum(len(d.text.encode()) for d in docs) == kept and all(d.text for d in docs)
    # The documents in order, each whole but the last, which is a prefix of its text.
    for d, t in zip(docs, TEXTS, strict=False):
        assert t.startswith(d.text)
    assert all(d.text == t for d, t in zip(docs[:-1], TEXTS, strict=False))
    p = planner.plan(ds, settings(ds.path, "", "sliding").protocol, docs, None, tok, 256)
    assert p.text_tokens == kept + len(ds.separator) * (len(docs) - 1)


def test_a_bpe_budget_cuts_inside_the_last_document(tmp_path, bpe_tokenizer):
    """4,096 tokens scored 1,508 (whole documents while they fit); now the text holds the budget,
    give or take the tokenizer's merge at the cut, and its bytes are the prefix's."""
    tok = tokenizer.load_tokenizer(bpe_tokenizer, None)
    texts = [helpers.stdlib_text(300), helpers.stdlib_text(5000), "tail"]
    whole = [tok.encode([t])[0].size for t in texts]
    budget = whole[0] + whole[1] // 2
    ds = budgeted(tmp_path, budget, texts)
    docs = planner.read(ds, tok)[0]
    assert len(docs) == 2 and docs[0].text == texts[0] and texts[1].startswith(docs[1].text)
    held = sum(tok.encode([d.text])[0].size for d in docs)
    assert budget - 2 <= held <= budget
    inputs = protocols.PlanInputs(tok, 512, 64, 32, False, ds.separator)
    p = protocols.SLIDING.plan(docs, inputs)
    first = int(tok.encode_with_bytes([docs[0].text])[0][1][0])  # context only, without BOS
    assert p.num_bytes == len(ds.separator.join(d.text for d in docs).encode()) - first
    assert p.text_tokens == held + tok.encode([ds.separator])[0].size


def test_a_preparation_with_its_own_counts_keeps_whole_documents(tmp_path):
    tok = tokenizer.load_tokenizer("byte", None)
    docs = [Document(t, f"d{i}") for i, t in enumerate(TEXTS)]
    ds = budgeted(tmp_path, 25)
    keep, last = planner.budget(docs, ds, tok, whole=True)
    assert keep.tolist() == [0] and last is None
    keep, last = planner.budget(docs, ds, tok)
    assert keep.tolist() == [0, 1] and last == (1, 25 - len(TEXTS[0].encode()))
    counts = (np.asarray([1, 2, 3]), np.asarray([4, 5, 6]))
    kept, kept_counts = planner.cut(docs, counts, ds, tok)
    assert [d.text for d in kept] == [TEXTS[0]] and kept_counts[1].tolist() == [4]
