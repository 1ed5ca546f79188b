"""Reading a corpus into documents: `text`, `lines` and `jsonl` files, by path, glob or list.

A document is a string plus where it came from, so that every later error can name it. Files are
read as bytes and decoded as UTF-8 (a leading byte-order mark is dropped); line ends are kept as
they are in the file, so the bytes counted for bits per byte are the file's own.

Files are found and read by `ppl_jax.data.files` (local or remote paths, `.gz` and `.zst`
decompressed while read); `resolve_paths` and `uncompressed_name` are re-exported here.

`read_documents` reads the whole corpus into a list; `iter_documents` yields any contiguous block
of the same documents as a stream, in memory bounded by about 1 MiB and the longest line (for
`lines` and `jsonl`), and `count_documents` counts them in the same way.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Iterator

from ppl_jax.data import files
from ppl_jax.data.files import COMPRESSION_SUFFIXES, resolve_paths, uncompressed_name
from ppl_jax.errors import DataError

__all__ = [
    "COMPRESSION_SUFFIXES",
    "FORMATS",
    "Document",
    "count_documents",
    "iter_documents",
    "iter_sourced",
    "no_text_error",
    "read_documents",
    "resolve_paths",
    "uncompressed_name",
]
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
      DataError: missing path, bad UTF-8 (file and byte offset), bad JSON (file and line), a
        corrupt or truncated `.gz`/`.zst` file, an unreadable remote file, or a corpus with no
        text but whitespace.
      ConfigError: a `.zst` file without the `zstandard` package; see `resolve_paths`.
    """
    docs: list[Document] = []
    for path in resolve_paths(path_spec):
        text = files.decode(files.read_file(path), path, errors)
        if fmt == "text":
            docs.append(Document(text, path))
        elif fmt == "lines":
            for i, line in enumerate(_LINE_END.split(text), start=1):
                if line.strip():
                    docs.append(Document(line, f"{path}:{i}"))
        elif fmt == "jsonl":
            for i, line in enumerate(_LINE_END.split(text), start=1):
                if line.strip():
                    docs.append(_jsonl_document(line, f"{path}:{i}", jsonl_field, errors))
        elif fmt == "wikitext":
            docs.extend(_wikitext_articles(text, path))
        else:
            raise _format_error(fmt)
    if not any(d.text.strip() for d in docs):
        raise no_text_error(path_spec, fmt, any_nonempty=any(d.text for d in docs))
    return docs


FORMATS = ("text", "lines", "jsonl", "wikitext")


def _format_error(fmt: str) -> DataError:
    return DataError(f"data.format={fmt!r} is not one of {', '.join(FORMATS)}.")


def no_text_error(path_spec: str, fmt: str, any_nonempty: bool) -> DataError:
    """The error for a corpus whose documents hold no text but whitespace, as `read_documents`
    raises it; for a caller that streams the documents (`iter_documents`) to raise after its pass.

    Args:
      path_spec: `data.path`.
      fmt: `data.format`.
      any_nonempty: whether any document is non-empty (then they hold only whitespace).
    """
    what = "holds only whitespace" if any_nonempty else "is empty"
    return DataError(
        f"data.path={path_spec!r} holds no text to score (format {fmt!r}): the corpus "
        f"{what}. Check data.path and data.format."
    )


def _jsonl_document(line: str, source: str, jsonl_field: str, errors: str) -> Document:
    """The document of one non-blank `jsonl` line; `source` is `path:line`. A lone surrogate
    escape (`"\\ud800"`: valid JSON, not a Unicode character, so not UTF-8) is refused with
    `errors=strict` and becomes U+FFFD with `replace`, as a bad byte of the file would."""
    try:
        record = json.loads(line)
    except json.JSONDecodeError as e:
        raise DataError(f"{source}: not valid JSON ({e.msg}).") from None
    if not isinstance(record, dict) or not isinstance(record.get(jsonl_field), str):
        raise DataError(
            f"{source}: no string field {jsonl_field!r}; set "
            f"--config.data.jsonl_field to the field that holds the text."
        )
    text = record[jsonl_field]
    bad = _SURROGATE.search(text)
    if bad is not None:
        if errors == "strict":
            raise DataError(
                f"{source}: the field {jsonl_field!r} holds a lone surrogate "
                f"(\\u{ord(bad.group()):04x} at character {bad.start()}), which is not a Unicode "
                f"character; set --config.data.errors=replace to score U+FFFD in its place."
            )
        text = _SURROGATE.sub("\ufffd", text)
    return Document(text, source)


_SURROGATE = re.compile("[\ud800-\udfff]")  # left by json.loads only where unpaired


# ------------------------------------------------------------------------------------ streaming


def iter_documents(
    path_spec: str,
    fmt: str,
    errors: str = "strict",
    jsonl_field: str = "text",
    start: int = 0,
    stop: int | None = None,
) -> Iterator[Document]:
    """The documents `read_documents(path_spec, fmt, errors, jsonl_field)[start:stop]`, read as a
    stream: the same texts and sources, in the same order.

    `lines` and `jsonl` files are read about 1 MiB at a time (decompressed on the fly), so that
    memory stays bounded by that and the longest line, whatever the corpus's size. `text` and
    `wikitext` files are read whole, one at a time. Documents before `start` are counted, not
    parsed (a `jsonl` document is a non-blank line; a `text` file before `start` is not read), and
    reading stops after document `stop - 1`; so errors in the JSON of skipped documents, or in
    anything after `stop`, are not raised here. Nor is the corpus-wide "holds no text" error: a
    caller that streams the whole corpus raises `no_text_error` after its pass.

    Args:
      path_spec, fmt, errors, jsonl_field: as for `read_documents`.
      start: the index of the first document yielded, counted from 0 over the whole corpus.
      stop: the index after the last one; None for the end of the corpus.

    Returns:
      An iterator of `Document`s; the paths are resolved, and the format checked, before it is
      returned.

    Raises:
      DataError, ConfigError: as `read_documents`, with the same messages (a bad UTF-8 byte is
        named by its offset in the decompressed file): those of `resolve_paths` and an unknown
        format at the call, the others while iterating, after the documents before them.
      ValueError: a negative `start` or `stop`.
    """
    if start < 0 or (stop is not None and stop < 0):
        raise ValueError(f"start={start} and stop={stop} must not be negative.")
    found = resolve_paths(path_spec)
    if fmt not in FORMATS:
        raise _format_error(fmt)
    return _iter_documents(found, fmt, errors, jsonl_field, start, stop)


def _iter_documents(
    found: list[str], fmt: str, errors: str, jsonl_field: str, start: int, stop: int | None
) -> Iterator[Document]:
    for text, file, line in iter_sourced(found, fmt, errors, jsonl_field, start, stop):
        yield Document(text, f"{found[file]}:{line}" if line else found[file])


def iter_sourced(
    found: list[str],
    fmt: str,
    errors: str = "strict",
    jsonl_field: str = "text",
    start: int = 0,
    stop: int | None = None,
) -> Iterator[tuple[str, int, int]]:
    """`iter_documents` of the files `found` (`resolve_paths`) as `(text, file, line)`: the
    index of the document's file in `found` and its line (1-based; 0 for a document that is a
    whole file), with no source string made per document (`ppl_jax.data.sources.Sources`)."""
    skip = start  # documents still to skip
    left = None if stop is None else stop - start  # documents still to yield; None: all
    if left is not None and left <= 0:
        return
    for file, path in enumerate(found):
        if fmt == "text" and skip:
            skip -= 1
            continue
        if fmt in ("text", "wikitext"):
            text = files.decode(files.read_file(path), path, errors)
            docs = [Document(text, path)] if fmt == "text" else _wikitext_articles(text, path)
            if skip >= len(docs):
                skip -= len(docs)
                continue
            for doc in docs[skip:]:
                line = int(doc.source.rpartition(":")[2]) if fmt == "wikitext" else 0
                yield doc.text, file, line
                if left is not None:
                    left -= 1
                    if not left:
                        return
            skip = 0
            continue
        jsonl = fmt == "jsonl"
        for first, lines in _line_blocks(path, errors):
            if skip:
                n = _count_nonblank(lines)
                if n <= skip:
                    skip -= n
                    continue
            for i, line in enumerate(lines, start=first):
                if not line.strip():
                    continue
                if skip:
                    skip -= 1
                    continue
                if jsonl:
                    line = _jsonl_document(line, f"{path}:{i}", jsonl_field, errors).text
                yield line, file, i
                if left is not None:
                    left -= 1
                    if not left:
                        return


def count_documents(
    path_spec: str, fmt: str, errors: str = "strict", jsonl_field: str = "text"
) -> int:
    """`len(read_documents(path_spec, fmt, errors, jsonl_field))`, in the bounded memory of
    `iter_documents`: a `lines` or `jsonl` document is a non-blank line (its JSON is not parsed,
    so `jsonl_field` is not looked at), a `text` document a file (not read), and `wikitext` files
    are read whole, one at a time, and split into articles.

    Raises:
      DataError, ConfigError: as `read_documents` does, except for bad JSON and for the files
        of `text`, which are not read.
    """
    found = resolve_paths(path_spec)
    if fmt not in FORMATS:
        raise _format_error(fmt)
    if fmt == "text":
        return len(found)
    if fmt == "wikitext":
        return sum(
            len(_wikitext_articles(files.decode(files.read_file(path), path, errors), path))
            for path in found
        )
    return sum(_count_nonblank(lines) for path in found for _, lines in _line_blocks(path, errors))


def _count_nonblank(lines: list[str]) -> int:
    return sum(map(bool, map(str.strip, lines)))


def _line_blocks(path: str, errors: str) -> Iterator[tuple[int, list[str]]]:
    """The lines of `path`, as `_LINE_END.split` of its decoded text gives them, in blocks of
    about `files.CHUNK` bytes: (number of the block's first line, counted from 1; its lines)."""
    pending: list[bytes] = []  # bytes read since the last cut: no complete line end among them
    offset = 0  # where `pending` starts in the file
    first = 1
    for chunk in files.chunks(path):
        # Cut after the last line end of the chunk, but not after a final '\r': it may be the
        # first half of a '\r\n'. Line ends are ASCII, so the cut is between characters.
        end = len(chunk) - 1 if chunk.endswith(b"\r") else len(chunk)
        cut = max(chunk.rfind(b"\n", 0, end), chunk.rfind(b"\r", 0, end)) + 1
        if not cut:
            pending.append(chunk)
            continue
        raw = b"".join([*pending, chunk[:cut]])
        lines = _LINE_END.split(files.decode(raw, path, errors, offset))
        lines.pop()  # the empty string after the last line end
        yield first, lines
        first += len(lines)
        offset += len(raw)
        pending = [chunk[cut:]]
    raw = b"".join(pending)  # the last line, without a line end (or empty)
    yield first, _LINE_END.split(files.decode(raw, path, errors, offset))
