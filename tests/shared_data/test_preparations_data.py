"""The standard preparations on WikiText-2 from the PPL_JAX_TEST_DATA folder (collected only when
that variable names a folder): the Hugging Face guide's stream has the guide's 297,300 GPT-2
tokens, and the harness's pages, counts and detokenized texts are those of
tests/golden/preparations.json (made by lm-evaluation-harness's own functions)."""

import hashlib
import json
import os

import pytest
from test_preparations import check_pages_against_articles

from ppl_jax.data.documents import read_documents
from ppl_jax.data.preparations import apply_preparation
from ppl_jax.plans.protocols import PlanInputs, get
from ppl_jax.tokenizer import HFTokenizer

import helpers


@pytest.fixture(scope="module")
def golden():
    with open(os.path.join(helpers.GOLDEN, "preparations.json"), encoding="utf-8") as f:
        return json.load(f)["wikitext"]


def test_hf_guide_stream_has_the_guides_token_count(test_data):
    """The guide's join `"\\n\\n".join(test["text"])` of the shared WikiText-2 test file (the
    `wikitext-2-v1` form, with `<unk>`) is 297,300 GPT-2 tokens; its non-empty lines joined the
    same way (data.format=lines) are 292,942."""
    path = os.path.join(test_data, "wikitext-2", "test.txt")
    gpt2 = HFTokenizer.from_file(os.path.join(test_data, "tokenizers", "gpt2.json"))
    prepared = apply_preparation(
        "hf_guide_wikitext", read_documents(path, "text"), allow_tokenized=True
    )
    assert len(prepared.documents) == 1
    guide = get("hf_strided").plan(prepared.documents, PlanInputs(gpt2, 50257, 1024, 512, False))
    lines = get("hf_strided").plan(
        read_documents(path, "lines"), PlanInputs(gpt2, 50257, 1024, 512, False)
    )
    assert (guide.text_tokens, lines.text_tokens) == (297_300, 292_942)
    # Independently: the rows as the builder's text-mode iteration of the file gives them.
    with open(path, encoding="utf-8") as f:
        rows = [row if row.strip() else "" for row in f]
    assert prepared.documents[0].text == "\n\n".join(rows)


@pytest.mark.parametrize("name", ["wikitext-2/test.txt", "wikitext-2/valid.txt"])
def test_lm_eval_wikitext_pages_as_the_harness(test_data, golden, name):
    path = os.path.join(test_data, name)
    raw = open(path, "rb").read()
    expected = golden[name]
    assert hashlib.sha256(raw).hexdigest() == expected["sha256"], f"{path} is another file"
    p = apply_preparation("lm_eval_wikitext", read_documents(path, "text"), allow_tokenized=True)
    assert p.num_words.tolist() == expected["words"]
    assert p.num_bytes.tolist() == expected["bytes"]
    h = hashlib.sha256()
    for d in p.documents:
        h.update(d.text.encode("utf-8") + b"\0")
    assert h.hexdigest() == expected["detokenized_sha256"]
    # 62 test and 60 validation pages, as in EleutherAI/wikitext_document_level; every page
    # but the last lacks its final newline, and the file's first line (" ") is in none.
    assert len(p.documents) == {"wikitext-2/test.txt": 62, "wikitext-2/valid.txt": 60}[name]
    assert int(p.num_bytes.sum()) == len(raw) - len(b" \n") - (len(p.documents) - 1)
    assert check_pages_against_articles(path) == len(p.documents)
