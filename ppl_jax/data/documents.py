"""Reading a corpus into documents: `text`, `lines` and `jsonl` files, by path, glob or list.

A document is a string plus where it came from, so that every later error can name it. Files are
read as bytes and decoded as UTF-8 (a leading byte-order mark is dropped); line ends are kept as
they are in the file, so the bytes counted for bits per byte are the file's own.

Paths may be local or remote (`gs://bucket/corpus/*.jsonl`, and the other schemes of
`ppl_jax.runtime.paths`, read through `etils.epath`). A file whose name ends in `.gz` (gzip, RFC 1952)
or `.zst`/`.zstd` (Zstandard, RFC 8878; needs the `zstandard` package) is decompressed while it
is read: its documents, and the bytes counted for bits per byte, are those of the decompressed
text.

`read_documents` reads the whole corpus into a list; `iter_documents` yields any contiguous block
of the same documents as a stream, in memory bounded by about 1 MiB and the longest line (for
`lines` and `jsonl`), and `count_documents` counts them in the same way.
"""

from __future__ import annotations

import dataclasses
import glob
import gzip
import json
import os
import re
import zlib
from collections.abc import Iterator
from typing import BinaryIO

from ppl_jax.errors import ConfigError, DataError
from ppl_jax.runtime import paths

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

    An entry may be remote (`gs://bucket/dir/*.jsonl.gz`, see `ppl_jax.runtime.paths`): it is listed
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
            raise _unreadable(path, e) from None
    if path.endswith(".gz"):
        try:
            return gzip.decompress(raw)
        except (OSError, EOFError, zlib.error) as e:  # BadGzipFile is an OSError
            raise _gzip_error(path, e) from None
    if path.endswith((".zst", ".zstd")):
        return _zstd_decompress(raw, path)
    return raw


def _unreadable(path: str, e: OSError) -> DataError:
    return DataError(f"{path}: cannot be read ({e}). Check the path and access.")


def _gzip_error(path: str, e: BaseException) -> DataError:
    return DataError(
        f"{path}: not a readable gzip file ({e or type(e).__name__}); check the file, "
        f"or drop its '.gz' suffix if it is not compressed."
    )


def _zstandard(path: str):
    """The `zstandard` module, or a ConfigError naming `path` that asks for it."""
    try:
        import zstandard
    except ImportError:
        raise ConfigError(
            f"{path}: reading Zstandard-compressed files needs the zstandard package; "
            f"pip install zstandard."
        ) from None
    return zstandard


def _zstd_error(path: str, e: BaseException) -> DataError:
    return DataError(
        f"{path}: not a readable Zstandard file ({e}); check the file, or drop its "
        f"{path[len(uncompressed_name(path)) :]!r} suffix if it is not compressed."
    )


_ZSTD_TRUNCATED = "the file ends inside a frame (truncated)"


def _zstd_decompress(raw: bytes, path: str) -> bytes:
    zstandard = _zstandard(path)
    out, rest = [], raw
    try:
        while rest:  # one frame at a time: a file may hold several (e.g. concatenated ones)
            frame = zstandard.ZstdDecompressor().decompressobj()
            out.append(frame.decompress(rest))
            if not frame.eof:
                raise zstandard.ZstdError(_ZSTD_TRUNCATED)
            rest = frame.unused_data
    except zstandard.ZstdError as e:
        raise _zstd_error(path, e) from None
    return b"".join(out)


def _decode(raw: bytes, path: str, errors: str, offset: int = 0) -> str:
    """`raw` as text: the bytes of `path` from byte `offset` of its (decompressed) content on; a
    byte-order mark is dropped at the start of the file (`offset` 0) only."""
    bom = len(_BOM) if offset == 0 and raw.startswith(_BOM) else 0
    try:
        return raw[bom:].decode("utf-8", errors="strict" if errors == "strict" else "replace")
    except UnicodeDecodeError as e:
        where = " of its decompressed text" if uncompressed_name(path) != path else ""
        raise DataError(
            f"{path}: not UTF-8 text at byte offset {offset + bom + e.start}{where} "
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
                if line.strip():
                    docs.append(_jsonl_document(line, f"{path}:{i}", jsonl_field))
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


def _jsonl_document(line: str, source: str, jsonl_field: str) -> Document:
    """The document of one non-blank `jsonl` line; `source` is `path:line`."""
    try:
        record = json.loads(line)
    except json.JSONDecodeError as e:
        raise DataError(f"{source}: not valid JSON ({e.msg}).") from None
    if not isinstance(record, dict) or not isinstance(record.get(jsonl_field), str):
        raise DataError(
            f"{source}: no string field {jsonl_field!r}; set "
            f"--config.data.jsonl_field to the field that holds the text."
        )
    return Document(record[jsonl_field], source)


# ------------------------------------------------------------------------------------ streaming

_CHUNK = 1 << 20  # bytes of (decompressed) text read at a time
_ZSTD_PIECE = 1 << 7  # compressed bytes fed to Zstandard at a time: at most ~4 MiB of text


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
    files = resolve_paths(path_spec)
    if fmt not in FORMATS:
        raise _format_error(fmt)
    return _iter_documents(files, fmt, errors, jsonl_field, start, stop)


def _iter_documents(
    files: list[str], fmt: str, errors: str, jsonl_field: str, start: int, stop: int | None
) -> Iterator[Document]:
    skip = start  # documents still to skip
    left = None if stop is None else stop - start  # documents still to yield; None: all
    if left is not None and left <= 0:
        return
    for path in files:
        if fmt == "text" and skip:
            skip -= 1
            continue
        if fmt in ("text", "wikitext"):
            text = _decode(_read_file(path), path, errors)
            docs = [Document(text, path)] if fmt == "text" else _wikitext_articles(text, path)
            if skip >= len(docs):
                skip -= len(docs)
                continue
            for doc in docs[skip:]:
                yield doc
                if left is not None:
                    left -= 1
                    if not left:
                        return
            skip = 0
            continue
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
                source = f"{path}:{i}"
                yield (
                    _jsonl_document(line, source, jsonl_field)
                    if fmt == "jsonl"
                    else Document(line, source)
                )
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
    files = resolve_paths(path_spec)
    if fmt not in FORMATS:
        raise _format_error(fmt)
    if fmt == "text":
        return len(files)
    if fmt == "wikitext":
        return sum(
            len(_wikitext_articles(_decode(_read_file(path), path, errors), path)) for path in files
        )
    return sum(_count_nonblank(lines) for path in files for _, lines in _line_blocks(path, errors))


def _count_nonblank(lines: list[str]) -> int:
    return sum(map(bool, map(str.strip, lines)))


def _line_blocks(path: str, errors: str) -> Iterator[tuple[int, list[str]]]:
    """The lines of `path`, as `_LINE_END.split` of its decoded text gives them, in blocks of
    about `_CHUNK` bytes: (number of the block's first line, counted from 1; its lines)."""
    pending: list[bytes] = []  # bytes read since the last cut: no complete line end among them
    offset = 0  # where `pending` starts in the file
    first = 1
    for chunk in _chunks(path):
        # Cut after the last line end of the chunk, but not after a final '\r': it may be the
        # first half of a '\r\n'. Line ends are ASCII, so the cut is between characters.
        end = len(chunk) - 1 if chunk.endswith(b"\r") else len(chunk)
        cut = max(chunk.rfind(b"\n", 0, end), chunk.rfind(b"\r", 0, end)) + 1
        if not cut:
            pending.append(chunk)
            continue
        raw = b"".join([*pending, chunk[:cut]])
        lines = _LINE_END.split(_decode(raw, path, errors, offset))
        lines.pop()  # the empty string after the last line end
        yield first, lines
        first += len(lines)
        offset += len(raw)
        pending = [chunk[cut:]]
    raw = b"".join(pending)  # the last line, without a line end (or empty)
    yield first, _LINE_END.split(_decode(raw, path, errors, offset))


def _chunks(path: str) -> Iterator[bytes]:
    """The bytes of `path` (decompressed as by `_read_file`, with the same errors), in pieces of
    about `_CHUNK` bytes."""
    try:
        f = paths.open_binary(path)
    except OSError as e:
        if paths.is_local(path):
            raise  # as `_read_file`: a local file was just listed
        raise _unreadable(path, e) from None
    with f:
        source = f if paths.is_local(path) else _RemoteReader(f, path)
        if path.endswith(".gz"):
            yield from _gunzip(source, path)
        elif path.endswith((".zst", ".zstd")):
            yield from _unzstd(source, path)
        else:
            while chunk := source.read(_CHUNK):
                yield chunk


class _RemoteReader:
    """A remote file whose read errors are the DataError of `_read_file`."""

    def __init__(self, f: BinaryIO, path: str):
        self._f, self._path = f, path

    def read(self, size: int = -1) -> bytes:
        try:
            return self._f.read(size)
        except OSError as e:
            raise _unreadable(self._path, e) from None


def _gunzip(source, path: str) -> Iterator[bytes]:
    try:
        with gzip.GzipFile(fileobj=source, mode="rb") as f:
            while chunk := f.read(_CHUNK):
                yield chunk
    except (OSError, EOFError, zlib.error) as e:
        if isinstance(e, gzip.BadGzipFile) and str(e).startswith("CRC check failed"):
            e = gzip.BadGzipFile("CRC check failed")  # as `gzip.decompress` says it
        raise _gzip_error(path, e) from None


def _unzstd(source, path: str) -> Iterator[bytes]:
    """`_zstd_decompress` as a stream. `zstandard`'s own `stream_reader` is not used: it ends
    without an error at a truncated frame (zstandard 0.25)."""
    zstandard = _zstandard(path)
    frame = None  # the frame being decompressed
    out: list[bytes] = []
    size = 0  # bytes in `out`
    try:
        while data := source.read(_CHUNK):
            view = memoryview(data)
            # A decompressobj cannot be told to stop early, and 4 compressed bytes may stand for
            # 128 KiB (an RLE block): it is fed small pieces, to bound what each gives back.
            for at in range(0, len(data), _ZSTD_PIECE):
                piece = view[at : at + _ZSTD_PIECE]
                while piece:
                    if frame is None:
                        frame = zstandard.ZstdDecompressor().decompressobj()
                    text = frame.decompress(piece)
                    if text:
                        out.append(text)
                        size += len(text)
                    piece, frame = (frame.unused_data, None) if frame.eof else (b"", frame)
                if size >= _CHUNK:
                    yield b"".join(out)
                    out, size = [], 0
        if frame is not None:
            raise zstandard.ZstdError(_ZSTD_TRUNCATED)
    except zstandard.ZstdError as e:
        raise _zstd_error(path, e) from None
    if out:
        yield b"".join(out)
