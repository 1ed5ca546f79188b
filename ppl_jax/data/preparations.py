"""Standard preparations of a corpus's text: what a reference scores, and what it counts.

A preparation turns the documents `data.read_documents` read into the documents to score, plus
the per-document bytes and words to report where the reference counts them on another text than
the one it scores. Each preparation reads whole raw files (`data.format=text`), as the reference
reads them.

- `lm_eval_wikitext`: lm-evaluation-harness's `wikitext` task (lm_eval/tasks/wikitext, task
  version 2.0; dataset `EleutherAI/wikitext_document_level`, `wikitext-2-raw-v1`). Each raw
  WikiText file is cut into pages as the dataset's builder script cuts it (`wikitext_pages`);
  each page is scored as `wikitext_detokenize(page)` with `loglikelihood_rolling`, and its words
  `len(re.split(r"\\s+", page))` and UTF-8 bytes are counted on the page *before*
  detokenization (the task's `process_results`). With `eval.protocol=lm_eval_rolling` this gives
  the task's word perplexity, byte perplexity and bits per byte.
- `hf_guide_wikitext`: the stream of the Hugging Face guide "Perplexity of fixed-length models"
  (and of GPTQ's WikiText-2 evaluation): the rows of the `wikitext` dataset's split, as its
  builder makes them from the raw file (`wikitext_rows`), joined with "\\n\\n" into one document.
  The protocol counts its bytes and words as it counts any document's.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable

import numpy as np

from ppl_jax.data.documents import Document
from ppl_jax.data.words import count_harness_words
from ppl_jax.errors import ConfigError, DataError

PREPARATIONS = ("lm_eval_wikitext", "hf_guide_wikitext")
_UNK = " <unk> "  # the tokenized WikiText's rare-word token (the raw text never holds it)
FORMAT = "text"  # every preparation reads each file whole, as its reference does
# The protocols a preparation's counts are meant for (None: any).
_PROTOCOLS: dict[str, tuple[str, ...] | None] = {
    "lm_eval_wikitext": ("lm_eval_rolling",),
    "hf_guide_wikitext": None,
}


@dataclasses.dataclass(frozen=True)
class Prepared:
    """The documents to score, and the counts to report where they are not the documents' own.

    Attributes:
      name: the preparation.
      documents: the texts to score; `source` names the file and the line a document starts at.
      num_bytes: `[len(documents)] int64`, UTF-8 bytes to report per document, or None: the
        protocol counts the scored text's bytes itself.
      num_words: `[len(documents)] int64`, words to report per document, or None (likewise).
    """

    name: str
    documents: list[Document]
    num_bytes: np.ndarray | None = None
    num_words: np.ndarray | None = None

    @property
    def doc_counts(self) -> tuple[np.ndarray, np.ndarray] | None:
        """`(num_bytes, num_words)` for `Protocol.plan(..., doc_counts=...)`, or None."""
        if self.num_bytes is None or self.num_words is None:
            return None
        return self.num_bytes, self.num_words


def _unknown(name: str) -> ConfigError:
    return ConfigError(
        f"preparation={name!r} is not a standard preparation; use one of "
        f"{', '.join(PREPARATIONS)}, or '' to score the documents as they are read."
    )


def check(name: str, fmt: str, protocol: str) -> None:
    """Checks that a dataset's `preparation` fits its `format` and `protocol` (before reading).

    Raises:
      ConfigError: an unknown preparation (the message lists the known ones), a format other
        than `text`, or `lm_eval_wikitext` with a protocol other than `lm_eval_rolling` (the
        harness's counts belong to its per-document scoring).
    """
    if name not in PREPARATIONS:
        raise _unknown(name)
    if fmt != FORMAT:
        raise ConfigError(
            f"preparation={name!r} reads each raw WikiText file whole, as its reference does, "
            f"but data.format={fmt!r}; set data.format=text."
        )
    allowed = _PROTOCOLS[name]
    if allowed is not None and protocol not in allowed:
        raise ConfigError(
            f"preparation={name!r} reports the counts of lm-evaluation-harness's per-document "
            f"scoring, but eval.protocol={protocol!r}; set eval.protocol={allowed[0]}."
        )


def apply_preparation(
    name: str, documents: list[Document], allow_tokenized: bool = False
) -> Prepared:
    """The documents to score and the counts to report for a standard preparation.

    Args:
      name: one of `PREPARATIONS`.
      documents: whole raw WikiText files, as `data.read_documents(..., "text")` reads them.
      allow_tokenized: apply the preparation to the tokenized form too (the tests' shared data
        has only that form); a run never sets it.

    Returns:
      `lm_eval_wikitext`: one detokenized document per page, in file order, with the harness's
      per-page bytes and words. `hf_guide_wikitext`: one document, the rows of all files joined
      with "\\n\\n", without counts.

    Raises:
      ConfigError: an unknown preparation (the message lists the known ones).
      DataError: a file of the tokenized WikiText (`wiki.test.tokens`, `wikitext-2-v1`: rare
        words replaced by `<unk>`), where both references read the raw text (`wiki.test.raw`,
        `wikitext-2-raw-v1`), which holds no `<unk>`.
    """
    for doc in documents:
        if _UNK in doc.text and not allow_tokenized:
            raise DataError(
                f"{doc.source}: holds '<unk>' ({doc.text.count(_UNK)} times): it is the tokenized "
                f"WikiText (wiki.*.tokens, wikitext-2-v1), but preparation={name!r} is defined "
                f"on the raw text; point data.path at the raw file (wiki.test.raw, from "
                f"wikitext-2-raw-v1)."
            )
    if name == "lm_eval_wikitext":
        pages = [
            (f"{doc.source}:{line}", page)
            for doc in documents
            for line, page in wikitext_pages(doc.text)
        ]
        return Prepared(
            name=name,
            documents=[Document(wikitext_detokenize(page), src) for src, page in pages],
            num_bytes=np.asarray([len(page.encode("utf-8")) for _, page in pages], np.int64),
            num_words=np.asarray([count_harness_words(page) for _, page in pages], np.int64),
        )
    if name == "hf_guide_wikitext":
        rows = [row for doc in documents for row in wikitext_rows(doc.text)]
        source = ",".join(doc.source for doc in documents)
        return Prepared(name=name, documents=[Document("\n\n".join(rows), source)])
    raise _unknown(name)


def _universal_newlines(text: str) -> str:
    """The text as Python's `open(path, encoding="utf-8")` reads it: "\\r\\n" and "\\r" become
    "\\n" (the builders of both references read the raw file in text mode)."""
    return text.replace("\r\n", "\n").replace("\r", "\n")


def wikitext_rows(text: str) -> list[str]:
    """The rows of the Hugging Face `wikitext` dataset built from a raw WikiText file.

    The builder (huggingface/datasets `datasets/wikitext/wikitext.py`, `_generate_examples`)
    iterates the file opened in text mode: each row is a line with its "\\n" (the last one
    without, if the file does not end in "\\n"); a line of only whitespace becomes "".

    Args:
      text: the raw file's text.

    Returns:
      The rows, one per line of the file.
    """
    lines = _universal_newlines(text).split("\n")
    rows = [line + "\n" for line in lines[:-1]]
    if lines[-1]:
        rows.append(lines[-1])
    return [row if row.strip() else "" for row in rows]


def _is_page_heading(line: str) -> bool:
    """The document-level builder's test for a page's first line (a level-1 heading
    " = Title = "): runs of "= = =" and then "= =" are closed up (so that " = = Section = = "
    reads "== Section =="), and the stripped line must then start with "= " and end with " =".
    """
    closed = line.replace("= = =", "===").replace("= =", "==").strip()
    return closed.startswith("= ") and closed.endswith(" =")


def wikitext_pages(text: str) -> list[tuple[int, str]]:
    """The pages of `EleutherAI/wikitext_document_level` built from a raw WikiText file.

    The builder (lm-evaluation-harness 0.3 `lm_eval/datasets/wikitext/wikitext.py`, published on
    the Hub as that dataset) reads the file in text mode, splits it at "\\n", and starts a page at
    each level-1 heading line (`_is_page_heading`). A page is its lines joined with "\\n": it does
    not end with the newline of its last line, except the file's last page, which ends where the
    file does. Lines before a heading that hold only whitespace (the file's first line) belong to
    no page; the last page is kept even if it holds only whitespace.

    Args:
      text: the raw file's text.

    Returns:
      `(line, page)` pairs in file order; `line` is the 1-based line of the page's first line.
    """
    lines = _universal_newlines(text).split("\n")
    pages: list[tuple[int, str]] = []
    start = 0
    for i, line in enumerate(lines):
        if _is_page_heading(line):
            page = "\n".join(lines[start:i])
            if page.strip():
                pages.append((start + 1, page))
            start = i  # the lines before, if only whitespace, are dropped
    pages.append((start + 1, "\n".join(lines[start:])))
    return pages


def _literal(old: str, new: str) -> Callable[[str], str]:
    return lambda s: s.replace(old, new)


def _closed_up(opening: str, closing: str) -> Callable[[str], str]:
    """Removes the whitespace just inside each pair: from an `opening` to the next `closing`
    (across lines), the text between them stripped of leading and trailing whitespace."""
    pair = re.compile(f"{re.escape(opening)}([^{re.escape(closing)}]*){re.escape(closing)}")
    return lambda s: pair.sub(lambda m: opening + m.group(1).strip() + closing, s)


def _quirk(s: str) -> str:
    # The harness means to close up "/' 3" but writes its pattern and replacement as plain
    # text: "/' " + one ASCII digit + "/" becomes the literal "/'[0-9]/". Kept for equality.
    return re.sub(r"/' [0-9]/", lambda m: "/'[0-9]/", s)


# lm-evaluation-harness's `wikitext_detokenizer` (lm_eval/tasks/wikitext/preprocess_wikitext.py),
# in its order; each literal rule is one left-to-right pass of `str.replace`.
_DETOKENIZE: tuple[Callable[[str], str], ...] = (
    _literal("s '", "s'"),  # plural possessive
    _quirk,
    _literal(" @-@ ", "-"),  # WikiText's number and hyphen separators
    _literal(" @,@ ", ","),
    _literal(" @.@ ", "."),
    *(_literal(f" {p} ", f"{p} ") for p in ":;.!?,"),  # no space before punctuation
    *(_closed_up(o, c) for o, c in ("()", "[]", "{}", '""', "''")),
    _literal("= = = =", "===="),  # headings
    _literal("= = =", "==="),
    _literal("= =", "=="),
    _literal(" \N{DEGREE SIGN} ", "\N{DEGREE SIGN}"),
    _literal(" \n", "\n"),  # one space at each line's end and start
    _literal("\n ", "\n"),
    _literal(" N ", " 1 "),  # WikiText's number placeholder
    _literal(" 's", "'s"),
)


def wikitext_detokenize(page: str) -> str:
    """A WikiText page as lm-evaluation-harness's `wikitext` task scores it.

    The rules of the task's `wikitext_detokenizer`, in its order: "s '" -> "s'"; the
    " @-@ ", " @,@ ", " @.@ " separators closed up; no space before `: ; . ! ? ,`; whitespace
    inside (), [], {}, "" and '' pairs removed; "= = = =", "= = =", "= =" closed up; " ° " ->
    "°"; " \\n" and "\\n " -> "\\n"; " N " -> " 1 "; " 's" -> "'s". Equality with the harness's
    own function is tested (tests/unit/data/test_preparations.py, tests/reference/).

    Args:
      page: a page of the raw document-level WikiText.

    Returns:
      The text to score.
    """
    for rule in _DETOKENIZE:
        page = rule(page)
    return page
