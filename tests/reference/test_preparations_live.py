"""The preparations against lm-evaluation-harness's own `wikitext` functions, live (collected only
when the reference packages import), and tests/golden/preparations.json against them."""

import importlib.util
import json
import os

import pytest
from lm_eval.tasks.wikitext import preprocess_wikitext as harness
from test_preparations import RAW, wikitext_like

from ppl_jax.data.documents import Document
from ppl_jax.data.preparations import apply_preparation, wikitext_detokenize, wikitext_pages

import helpers


@pytest.fixture(scope="module")
def make_golden():
    spec = importlib.util.spec_from_file_location(
        "make_preparations_golden", os.path.join(helpers.GOLDEN, "make_preparations_golden.py")
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def assert_as_the_harness(pages: list[str]) -> None:
    for page in pages:
        doc = {"page": page}
        assert wikitext_detokenize(page) == harness.wikitext_detokenizer(doc), repr(page)
        counts = harness.process_results(doc, [0.0])
        p = apply_preparation("lm_eval_wikitext", [Document(page, "f")])
        if len(p.documents) == 1:  # the page holds no second level-1 heading
            assert p.num_words.tolist() == [counts["word_perplexity"][1]], repr(page)
            assert p.num_bytes.tolist() == [counts["bits_per_byte"][1]], repr(page)
            assert counts["byte_perplexity"][1] == counts["bits_per_byte"][1]


def test_fresh_random_pages(make_golden):
    for seed in (1, 2, 3):
        assert_as_the_harness(make_golden.fuzz(seed, count=1000, max_pieces=60))


def test_wikitext_like_files():
    for text in (RAW, RAW + "\n", wikitext_like(8, seed=3)):
        pages = [p for _, p in wikitext_pages(text)]
        assert_as_the_harness(pages)
        p = apply_preparation("lm_eval_wikitext", [Document(text, "f")])
        assert [d.text for d in p.documents] == [
            harness.wikitext_detokenizer({"page": page}) for page in pages
        ]


def test_golden_file_is_current(make_golden):
    with open(make_golden.GOLDEN, encoding="utf-8") as f:
        stored = json.load(f)
    fresh = make_golden.numbers(None, stored)
    for key in ("pages", "pages_harness", "fuzz", "fuzz_harness"):
        assert stored[key] == fresh[key], key
