"""Reading a corpus into documents: `text`, `lines` and `jsonl` files, by path, glob or list.

A document is a string plus where it came from, so that every later error can name it. Files are
read as bytes and decoded as UTF-8 (a leading byte-order mark is dropped); line ends are kept as
they are in the file, so the bytes counted for bits per byte are the file's own.

Paths may be local or remote (`gs://bucket/corpus/*.jsonl`, and the other schemes of
`ppl_jax.paths`, read through `etils.epath`). A file whose name ends in `.gz` (gzip, RFC 1952)
or `.zst`/`.zstd` (Zstandard, RFC 8878; needs the `zstandard` package) is decompressed while it
is read: its documents, and the bytes counted for bits per byte, are those of the decompressed
text.
"""

from __future__ import annotations

import dataclasses
import glob
import gzip
import json
import os
import re
import zlib

from ppl_jax import paths
from ppl_jax.errors import ConfigError, DataError

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

    An entry may be remote (`gs://bucket/dir/*.jsonl.gz`, see `ppl_jax.paths`): it is listed
    through `etils.epath`, whose globs have no `**`.

    Returns:
      The matching files, in the order given, each glob's matches sorted, without repeats.

    Raises:
      DataError: for an entry that matches no file, or names a directory, or a remote glob
        with `**`.
      ConfigError: a scheme that `etils.epath` does not read, or one whose fsspec
        implementation (`gcsfs` for `gs://`) is not installed.
    """
    found: list[str] = []
    seen: set[str] = set()  # real paths: 'a.txt' and './a.txt' are one file
    entries = [e.strip() for e in path_spec.split(",") if e.strip()]
    if not entries:
        raise DataError("data.path is empty: give a file, a glob or a comma-separated list.")
    for entry in entries:
        if not paths.is_local(entry):
            for m in _resolve_remote(entry):
                if m not in seen:
                    seen.add(m)
                    found.append(m)
            continue
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
                found.append(m)
    return found


def _resolve_remote(entry: str) -> list[str]:
    """`resolve_paths` for one remote entry (`gs://b/x.txt` or a glob `gs://b/*/x*.txt`)."""
    try:
        if glob.has_magic(entry):
            if "**" in entry:
                raise DataError(
                    f"data.path: the glob {entry!r} uses '**', which remote paths do not support "
                    f"(each level would be listed with its own requests); use '*' per level."
                )
            head, _, tail = entry.partition("://")
            parts = tail.split("/")
            first = next(i for i, part in enumerate(parts) if glob.has_magic(part))
            base = f"{head}://" + "/".join(parts[:first])
            pattern = "/".join(parts[first:])
            matches = sorted(
                str(p) for p in paths.epath(base).glob(pattern) if paths.isfile(str(p))
            )
            if not matches:
                raise DataError(
                    f"data.path: the glob {entry!r} matches no file. Check the folder and the "
                    f"pattern (quote it, so that the shell leaves it alone)."
                )
            return matches
        if paths.isdir(entry):
            raise DataError(
                f"data.path: {entry!r} is a directory; give its files, e.g. "
                f"'{entry.rstrip('/')}/*.txt'."
            )
        if not paths.isfile(entry):
            raise DataError(f"data.path: no such file {entry!r}. Check the path.")
        return [entry]
    except ImportError as e:
        raise paths.missing_backend(entry, e) from None


COMPRESSION_SUFFIXES = (".gz", ".zst", ".zstd")


def uncompressed_name(path: str) -> str:
    """`path` without a compression suffix (`a.jsonl.gz` -> `a.jsonl`): the name that tells the
    format of the text inside."""
    for suffix in COMPRESSION_SUFFIXES:
        if path.endswith(suffix):
            return path[: -len(suffix)]
    return path


def _read_file(path: str) -> bytes:
    """The bytes of `path`, decompressed when its name ends in `.gz`, `.zst` or `.zstd`.

    Raises:
      DataError: a remote file that cannot be read, or a corrupt or truncated compressed file.
      ConfigError: `.zst` without the `zstandard` package, or a remote scheme without its
        fsspec implementation.
    """
    if paths.is_local(path):
        raw = paths.read_bytes(path)  # OSErrors as before: a local file was just listed
    else:
        try:
            raw = paths.read_bytes(path)
        except OSError as e:
            raise DataError(f"{path}: cannot be read ({e}). Check the path and access.") from None
    if path.endswith(".gz"):
        try:
            return gzip.decompress(raw)
        except (OSError, EOFError, zlib.error) as e:  # BadGzipFile is an OSError
            raise DataError(
                f"{path}: not a readable gzip file ({e or type(e).__name__}); check the file, "
                f"or drop its '.gz' suffix if it is not compressed."
            ) from None
    if path.endswith((".zst", ".zstd")):
        return _zstd_decompress(raw, path)
    return raw


def _zstd_decompress(raw: bytes, path: str) -> bytes:
    try:
        import zstandard
    except ImportError:
        raise ConfigError(
            f"{path}: reading Zstandard-compressed files needs the zstandard package; "
            f"pip install zstandard."
        ) from None
    out, rest = [], raw
    try:
        while rest:  # one frame at a time: a file may hold several (e.g. concatenated ones)
            frame = zstandard.ZstdDecompressor().decompressobj()
            out.append(frame.decompress(rest))
            if not frame.eof:
                raise zstandard.ZstdError("the file ends inside a frame (truncated)")
            rest = frame.unused_data
    except zstandard.ZstdError as e:
        raise DataError(
            f"{path}: not a readable Zstandard file ({e}); check the file, or drop its "
            f"{path[len(uncompressed_name(path)) :]!r} suffix if it is not compressed."
        ) from None
    return b"".join(out)


def _decode(raw: bytes, path: str, errors: str) -> str:
    bom = len(_BOM) if raw.startswith(_BOM) else 0
    try:
        return raw[bom:].decode("utf-8", errors="strict" if errors == "strict" else "replace")
    except UnicodeDecodeError as e:
        where = " of its decompressed text" if uncompressed_name(path) != path else ""
        raise DataError(
            f"{path}: not UTF-8 text at byte offset {bom + e.start}{where} "
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
      DataError: missing path, bad UTF-8 (file and byte offset), bad JSON (file and line), a
        corrupt or truncated `.gz`/`.zst` file, an unreadable remote file, or a corpus with no
        text but whitespace.
      ConfigError: a `.zst` file without the `zstandard` package; see `resolve_paths`.
    """
    docs: list[Document] = []
    for path in resolve_paths(path_spec):
        text = _decode(_read_file(path), path, errors)
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
