"""Standard preparations: the harness's wikitext pages, detokenizer and counts (against the golden
outputs of lm-evaluation-harness's own functions), and the Hugging Face guide's joined rows."""

import io
import json
import os
import re

import numpy as np
import pytest

from ppl_jax.data import preparations
from ppl_jax.data.documents import Document, read_documents
from ppl_jax.data.preparations import (
    apply_preparation,
    wikitext_detokenize,
    wikitext_pages,
    wikitext_rows,
)
from ppl_jax.errors import ConfigError
from ppl_jax.plans.protocols import PlanInputs, count_harness_words, get
from ppl_jax.tokenizer import ByteTokenizer

import helpers


@pytest.fixture(scope="module")
def golden():
    with open(os.path.join(helpers.GOLDEN, "preparations.json"), encoding="utf-8") as f:
        return json.load(f)


def cases(golden):
    """(page, harness's detokenized page, words, bytes) for every golden input."""
    for kind in ("pages", "fuzz"):
        h = golden[f"{kind}_harness"]
        yield from zip(golden[kind], h["detokenized"], h["words"], h["bytes"], strict=True)


def test_golden_inputs_exercise_every_rule(golden):
    """Each rule of the detokenizer changes at least one golden page when applied alone, so a
    missing or wrong rule cannot go unseen."""
    pages = [c[0] for c in cases(golden)]
    assert len(pages) > 400
    for k, rule in enumerate(preparations._DETOKENIZE):
        assert any(rule(p) != p for p in pages), f"rule {k} changes no golden page"


def test_detokenize_matches_the_harness(golden):
    for page, expected, _, _ in cases(golden):
        assert wikitext_detokenize(page) == expected, repr(page)


def test_rule_order_matters(golden):
    """The rules do not commute on the golden pages: applying them in another order (reversed)
    gives other texts, so the equality above also checks the order."""
    pages = [c[0] for c in cases(golden)]
    expected = [c[1] for c in cases(golden)]

    def reversed_rules(s):
        for rule in reversed(preparations._DETOKENIZE):
            s = rule(s)
        return s

    assert sum(reversed_rules(p) != e for p, e in zip(pages, expected, strict=True)) > 10


def test_counts_and_texts_match_the_harness(golden):
    """`prepare` on a file that is one page: the harness's text to score, its words and bytes
    (counted on the page before detokenization)."""
    checked = 0
    for page, expected, words, nbytes in cases(golden):
        if wikitext_pages(page) != [(1, page)]:
            continue  # holds a level-1 heading line: more than one page
        p = apply_preparation("lm_eval_wikitext", [Document(page, "f.txt")])
        assert [d.text for d in p.documents] == [expected]
        assert p.num_words.tolist() == [words] and p.num_bytes.tolist() == [nbytes], repr(page)
        assert p.num_words.dtype == np.int64 and p.num_bytes.dtype == np.int64
        checked += 1
    assert checked > 400


# A small raw WikiText-like file: the first line is a blank line of one space, as in the real
# files; section headings; consecutive level-1 headings; a heading with a tab and no space
# before it; lines that look like headings but are not; CRLF and a lone CR; no final newline.
RAW = (
    " \n"
    " = Alpha = \n"
    " \n"
    " Text of alpha , ( see below ) . \n"
    " = = Section = = \n"
    " = = = Sub = = = \n"
    " = x = = \n"
    " \n"
    " = Beta = \r\n"
    " = Gamma = \n"
    "\t= Delta =\t\r"
    " tail \n"
    " = 1 = 2 = \n"
    " last line"
)
# The document-level builder's pages of RAW (reasoned from its `_generate_examples`), by hand.
RAW_PAGES = [
    (2, " = Alpha = \n \n Text of alpha , ( see below ) . \n = = Section = = \n"
        " = = = Sub = = = \n = x = = \n "),
    (9, " = Beta = "),
    (10, " = Gamma = "),
    (11, "\t= Delta =\t\n tail "),
    (13, " = 1 = 2 = \n last line"),
]  # fmt: skip


def test_pages_as_the_document_level_builder_cuts_them():
    assert wikitext_pages(RAW) == RAW_PAGES
    # The file's last page ends where the file does: with its newline when it has one.
    assert wikitext_pages(RAW + "\n")[-1] == (13, " = 1 = 2 = \n last line\n")
    assert wikitext_pages(RAW + "\n \n")[-1] == (13, " = 1 = 2 = \n last line\n \n")
    # No heading: the whole file is one page; an empty file is one empty page.
    assert wikitext_pages(" a \n b \n") == [(1, " a \n b \n")]
    assert wikitext_pages("") == [(1, "")]
    # Whitespace-only lines before a heading belong to no page; other text before it does.
    assert wikitext_pages(" \n\t\n = T = \n x") == [(3, " = T = \n x")]
    assert wikitext_pages(" a \n = T = \n x") == [(1, " a "), (2, " = T = \n x")]


def test_prepare_lm_eval_wikitext_names_pages_and_files():
    docs = [Document(RAW, "a.txt"), Document(" = Z = \n z . \n", "b.txt")]
    p = apply_preparation("lm_eval_wikitext", docs)
    pages = [*RAW_PAGES, (1, " = Z = \n z . \n")]
    assert [d.source for d in p.documents] == [f"a.txt:{n}" for n, _ in RAW_PAGES] + ["b.txt:1"]
    assert [d.text for d in p.documents] == [wikitext_detokenize(t) for _, t in pages]
    assert p.num_bytes.tolist() == [len(t.encode()) for _, t in pages]
    assert p.num_words.tolist() == [len(re.split(r"\s+", t)) for _, t in pages]
    assert p.doc_counts[0] is p.num_bytes and p.doc_counts[1] is p.num_words


def wikitext_like(num_articles=5, seed=0) -> str:
    """A raw file laid out as WikiText: a blank first line, articles of headings and paragraphs,
    each line between blank lines, and a final newline."""
    rng = np.random.default_rng(seed)
    words = ["the", "a", "@-@", ",", ".", "(", ")", '"', "'s", "N", "°", "game", "1", "@,@"]
    lines = [" "]
    for a in range(num_articles):
        lines += [f" = Article {a} = ", " "]
        for s in range(rng.integers(1, 4)):
            if s:
                lines += [f" = = Section {s} = = ", " "]
            for _ in range(rng.integers(1, 4)):
                lines += [" " + " ".join(rng.choice(words, rng.integers(1, 30))) + " ", " "]
    return "\n".join(lines) + "\n"


def check_pages_against_articles(path: str) -> int:
    """The builder's pages of the file at `path` are ppl_jax's `data.format=wikitext` articles
    less (a) the blank lines before the first heading and (b) the newline that ends every page
    but the file's last. Returns the number of pages."""
    (whole,) = read_documents(path, "text")
    pages = wikitext_pages(whole.text)
    articles = read_documents(path, "wikitext")
    assert [f"{path}:{n}" for n, _ in pages[1:]] == [d.source for d in articles[1:]]
    texts = [d.text for d in articles]
    first = texts[0].split("\n")
    head = next(i for i, line in enumerate(first) if line.strip())
    texts[0] = "\n".join(first[head:])
    assert texts[-1] == pages[-1][1]
    for a, (_, p) in zip(texts[:-1], pages[:-1], strict=True):
        assert a == p + "\n"
    return len(pages)


def test_pages_differ_from_wikitext_format_articles_only_at_their_ends(tmp_path):
    path = tmp_path / "wiki.raw"
    path.write_bytes(wikitext_like().encode("utf-8"))
    assert check_pages_against_articles(str(path)) == 5


def test_rows_as_the_wikitext_builder_makes_them(tmp_path):
    raw = " \n = T = \n\n a b \r\n\t\n c\rd\u2028\n\u2028\n\x0c e \n last"
    expected = [
        "", " = T = \n", "", " a b \n", "", " c\n", "d\u2028\n", "", "\x0c e \n", " last"
    ]  # fmt: skip
    assert wikitext_rows(raw) == expected
    # Independently: Python's text-mode file iteration, which the builder uses.
    path = tmp_path / "raw.txt"
    for text in (raw, raw + "\n", "", "\n", " \n\n", "a", "\r\r\n"):
        path.write_bytes(text.encode("utf-8"))
        with open(path, encoding="utf-8") as f:
            reference = [row if row.strip() else "" for row in f]
        assert wikitext_rows(text) == reference, repr(text)


def test_prepare_hf_guide_wikitext_joins_the_rows():
    a, b = " = T = \n \n x y \n", "z\n"
    p = apply_preparation("hf_guide_wikitext", [Document(a, "a.txt"), Document(b, "b.txt")])
    assert [d.text for d in p.documents] == [" = T = \n\n\n\n\n x y \n\n\nz\n"]
    assert p.documents[0].source == "a.txt,b.txt"
    assert p.num_bytes is None and p.num_words is None and p.doc_counts is None


def test_prepare_reads_whole_files(tmp_path):
    """Through `read_documents(..., "text")`, as the configuration does it."""
    path = tmp_path / "wiki.test.raw"
    text = wikitext_like(3, seed=1)
    path.write_bytes(text.encode("utf-8"))
    p = apply_preparation("lm_eval_wikitext", read_documents(str(path), "text"))
    assert len(p.documents) == 3
    assert p.documents[0].source == f"{path}:2"
    assert int(p.num_bytes.sum()) == len(text.encode()) - len(" \n") - 2  # 2 page-end newlines


def test_unknown_preparation_lists_the_known_ones():
    for call in (
        lambda: apply_preparation("wikitext", []),
        lambda: preparations.check("wikitext", "text", "lm_eval_rolling"),
    ):
        with pytest.raises(ConfigError, match="lm_eval_wikitext, hf_guide_wikitext"):
            call()


def test_check_format_and_protocol():
    preparations.check("lm_eval_wikitext", "text", "lm_eval_rolling")
    for protocol in ("sliding", "hf_strided", "gptq_chunks", "lm_eval_rolling"):
        preparations.check("hf_guide_wikitext", "text", protocol)
    with pytest.raises(ConfigError, match="data.format=text"):
        preparations.check("lm_eval_wikitext", "wikitext", "lm_eval_rolling")
    with pytest.raises(ConfigError, match="eval.protocol=lm_eval_rolling"):
        preparations.check("lm_eval_wikitext", "text", "sliding")


class RollingTokenizer(ByteTokenizer):
    """Bytes, plus EOS 256 (the harness's prefix token for GPT-2-like tokenizers)."""

    vocab_size = 257
    eos_id = 256


def test_plan_reports_the_preparations_counts():
    """`plan(..., doc_counts=...)`: the windows of the detokenized pages, the counts of the raw
    pages; and the same windows as without the counts."""
    p = apply_preparation("lm_eval_wikitext", [Document(RAW, "a.txt")])
    tok = RollingTokenizer()
    with_counts = get("lm_eval_rolling").plan(
        p.documents, PlanInputs(tok, 257, 8, None, False), doc_counts=p.doc_counts
    )
    plain = get("lm_eval_rolling").plan(p.documents, PlanInputs(tok, 257, 8, None, False))
    assert with_counts.doc_bytes.tolist() == [len(t.encode()) for _, t in RAW_PAGES]
    assert with_counts.doc_words.tolist() == [count_harness_words(t) for _, t in RAW_PAGES]
    assert with_counts.num_bytes == sum(len(t.encode()) for _, t in RAW_PAGES)
    assert with_counts.num_words == sum(count_harness_words(t) for _, t in RAW_PAGES)
    assert plain.num_bytes == sum(len(d.text.encode()) for d in p.documents) < with_counts.num_bytes
    np.testing.assert_array_equal(with_counts.windows.starts, plain.windows.starts)
    with pytest.raises(ValueError, match="only lm_eval_rolling"):
        get("sliding").plan(p.documents, PlanInputs(tok, 257, 8, 4, False), doc_counts=p.doc_counts)
    with pytest.raises(ValueError, match="one count per document"):
        get("lm_eval_rolling").plan(
            p.documents, PlanInputs(tok, 257, 8, None, False), doc_counts=(p.num_bytes[:1],) * 2
        )


def test_stream_is_the_text_mode_reading(tmp_path):
    """CRLF files: the rows and pages are those of the file read in text mode."""
    text = wikitext_like(2, seed=2)
    crlf = text.replace("\n", "\r\n")
    assert wikitext_rows(crlf) == wikitext_rows(text)
    assert wikitext_pages(crlf) == wikitext_pages(text)
    assert io.StringIO(crlf, newline=None).read() == text  # what text mode does
