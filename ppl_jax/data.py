"""Reading a corpus into documents: `text`, `lines` and `jsonl` files, by path, glob or list.

A document is a string plus where it came from, so that every later error can name it. Files are
read as bytes and decoded as UTF-8 (a leading byte-order mark is dropped); line ends are kept as
they are in the file, so the bytes counted for bits per byte are the file's own.
"""

from __future__ import annotations

import dataclasses
import glob
import json
import os
import re

from ppl_jax.errors import DataError

_BOM = b"\xef\xbb\xbf"
# Line ends of a file: only these. `str.splitlines` also splits at form feeds, U+2028 and others,
# which would cut a line of Python source, or a valid JSON line, in two.
_LINE_END = re.compile(r"\r\n|\r|\n")


@dataclasses.dataclass(frozen=True)
class Document:
    """One document of the corpus.

    Attributes:
      text: the document's text.
      source: where it came from, for messages: `path`, or `path:line` for `lines` and `jsonl`.
    """

    text: str
    source: str


def resolve_paths(path_spec: str) -> list[str]:
    """Expands `data.path`: a file, a glob, or a comma-separated list of either.

    Returns:
      The matching files, in the order given, each glob's matches sorted, without repeats.

    Raises:
      DataError: for an entry that matches no file, or names a directory.
    """
    paths: list[str] = []
    seen: set[str] = set()  # real paths: 'a.txt' and './a.txt' are one file
    entries = [e.strip() for e in path_spec.split(",") if e.strip()]
    if not entries:
        raise DataError("data.path is empty: give a file, a glob or a comma-separated list.")
    for entry in entries:
        entry = os.path.expanduser(entry)
        if glob.has_magic(entry):
            matches = sorted(p for p in glob.glob(entry, recursive=True) if os.path.isfile(p))
            if not matches:
                raise DataError(
                    f"data.path: the glob {entry!r} matches no file. Check the folder and the "
                    f"pattern (quote it, so that the shell leaves it alone)."
                )
        elif os.path.isdir(entry):
            raise DataError(
                f"data.path: {entry!r} is a directory; give its files, e.g. '{entry}/*.txt'."
            )
        elif not os.path.isfile(entry):
            raise DataError(f"data.path: no such file {entry!r}. Check the path.")
        else:
            matches = [entry]
        for m in matches:
            if os.path.realpath(m) not in seen:
                seen.add(os.path.realpath(m))
                paths.append(m)
    return paths


def _decode(raw: bytes, path: str, errors: str) -> str:
    bom = len(_BOM) if raw.startswith(_BOM) else 0
    try:
        return raw[bom:].decode("utf-8", errors="strict" if errors == "strict" else "replace")
    except UnicodeDecodeError as e:
        raise DataError(
            f"{path}: not UTF-8 text at byte offset {bom + e.start} "
            f"(byte 0x{raw[bom + e.start]:02x}). Convert the file to UTF-8, or set "
            f"--config.data.errors=replace to score it with U+FFFD in place of bad bytes."
        ) from None


# A WikiText level-1 heading: " = Title = ", with a single "=" on each side (" = = Section = = "
# is a heading inside an article).
_WIKITEXT_TITLE = re.compile(r"^ = [^=](?:.*[^=])? = $")


def _wikitext_articles(text: str, path: str) -> list[Document]:
    """Splits a WikiText file into articles, each from its level-1 heading line to the next.

    The text keeps its line ends, so the articles' bytes add up to the file's; text before the
    first heading (a blank line in the WikiText files) belongs to the first article.
    """
    docs: list[Document] = []
    current: list[str] = []
    has_text = False
    start_line = 1
    for i, line in enumerate(text.splitlines(keepends=True), start=1):
        if has_text and _WIKITEXT_TITLE.match(line.rstrip("\r\n")):
            docs.append(Document("".join(current), f"{path}:{start_line}"))
            current, has_text = [], False
        if not has_text:
            start_line = i
        current.append(line)
        has_text = has_text or bool(line.strip())
    if has_text:
        docs.append(Document("".join(current), f"{path}:{start_line}"))
    return docs


def read_documents(
    path_spec: str, fmt: str, errors: str = "strict", jsonl_field: str = "text"
) -> list[Document]:
    """Reads every document of the corpus.

    Args:
      path_spec: `data.path` (see `resolve_paths`).
      fmt: `text` (each file is one document), `lines` (each non-empty line is a document; its
        line end is not part of it), `jsonl` (each line a JSON object; the document is its
        `jsonl_field` string) or `wikitext` (a WikiText file split into articles, see
        `_wikitext_articles`).
      errors: `strict` raises on bytes that are not UTF-8; `replace` substitutes U+FFFD.
      jsonl_field: the field holding the text in `jsonl`.

    Returns:
      The documents, in file order. Empty documents are kept for `text` and `jsonl` (they
      contribute no tokens) and skipped for `lines`.

    Raises:
      DataError: missing path, bad UTF-8 (file and byte offset), bad JSON (file and line), or
        a corpus with no text but whitespace.
    """
    docs: list[Document] = []
    for path in resolve_paths(path_spec):
        with open(path, "rb") as f:
            text = _decode(f.read(), path, errors)
        if fmt == "text":
            docs.append(Document(text, path))
        elif fmt == "lines":
            for i, line in enumerate(_LINE_END.split(text), start=1):
                if line.strip():
                    docs.append(Document(line, f"{path}:{i}"))
        elif fmt == "jsonl":
            for i, line in enumerate(_LINE_END.split(text), start=1):
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as e:
                    raise DataError(f"{path}:{i}: not valid JSON ({e.msg}).") from None
                if not isinstance(record, dict) or not isinstance(record.get(jsonl_field), str):
                    raise DataError(
                        f"{path}:{i}: no string field {jsonl_field!r}; set "
                        f"--config.data.jsonl_field to the field that holds the text."
                    )
                docs.append(Document(record[jsonl_field], f"{path}:{i}"))
        elif fmt == "wikitext":
            docs.extend(_wikitext_articles(text, path))
        else:
            raise DataError(f"data.format={fmt!r} is not one of text, lines, jsonl, wikitext.")
    if not any(d.text.strip() for d in docs):
        what = "is empty" if not any(d.text for d in docs) else "holds only whitespace"
        raise DataError(
            f"data.path={path_spec!r} holds no text to score (format {fmt!r}): the corpus "
            f"{what}. Check data.path and data.format."
        )
    return docs
