"""Reading a corpus's files: `data.path` expanded to files, and each file's bytes, decompressed.

Paths may be local or remote (`gs://bucket/corpus/*.jsonl`, and the other schemes of
`ppl_jax.runtime.paths`, read through `etils.epath`). A file whose name ends in `.gz` (gzip, RFC
1952) or `.zst`/`.zstd` (Zstandard, RFC 8878; needs the `zstandard` package) is decompressed while
it is read: its documents, and the bytes counted for bits per byte, are those of the decompressed
text. Bytes are decoded as UTF-8 (a leading byte-order mark is dropped). `read_file` reads a whole
file; `chunks` streams it in pieces of about `CHUNK` bytes (the documents' streaming reads,
`ppl_jax.data.documents.iter_documents`).
"""

from __future__ import annotations

import glob
import gzip
import os
import zlib
from collections.abc import Iterator
from typing import BinaryIO

from ppl_jax.errors import ConfigError, DataError
from ppl_jax.runtime import paths

_BOM = b"\xef\xbb\xbf"
CHUNK = 1 << 20  # bytes of (decompressed) text read at a time
ZSTD_PIECE = 1 << 7  # compressed bytes fed to Zstandard at a time: at most ~4 MiB of text


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


def read_file(path: str) -> bytes:
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
            raise unreadable(path, e) from None
    if path.endswith(".gz"):
        try:
            return gzip.decompress(raw)
        except (OSError, EOFError, zlib.error) as e:  # BadGzipFile is an OSError
            raise _gzip_error(path, e) from None
    if path.endswith((".zst", ".zstd")):
        return _zstd_decompress(raw, path)
    return raw


def unreadable(path: str, e: OSError) -> DataError:
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


def decode(raw: bytes, path: str, errors: str, offset: int = 0) -> str:
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


def chunks(path: str) -> Iterator[bytes]:
    """The bytes of `path` (decompressed as by `read_file`, with the same errors), in pieces of
    about `CHUNK` bytes."""
    try:
        f = paths.open_binary(path)
    except OSError as e:
        if paths.is_local(path):
            raise  # as `read_file`: a local file was just listed
        raise unreadable(path, e) from None
    with f:
        source = f if paths.is_local(path) else _RemoteReader(f, path)
        if path.endswith(".gz"):
            yield from _gunzip(source, path)
        elif path.endswith((".zst", ".zstd")):
            yield from _unzstd(source, path)
        else:
            while chunk := source.read(CHUNK):
                yield chunk


class _RemoteReader:
    """A remote file whose read errors are the DataError of `read_file`."""

    def __init__(self, f: BinaryIO, path: str):
        self._f, self._path = f, path

    def read(self, size: int = -1) -> bytes:
        try:
            return self._f.read(size)
        except OSError as e:
            raise unreadable(self._path, e) from None


def _gunzip(source, path: str) -> Iterator[bytes]:
    try:
        with gzip.GzipFile(fileobj=source, mode="rb") as f:
            while chunk := f.read(CHUNK):
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
        while data := source.read(CHUNK):
            view = memoryview(data)
            # A decompressobj cannot be told to stop early, and 4 compressed bytes may stand for
            # 128 KiB (an RLE block): it is fed small pieces, to bound what each gives back.
            for at in range(0, len(data), ZSTD_PIECE):
                piece = view[at : at + ZSTD_PIECE]
                while piece:
                    if frame is None:
                        frame = zstandard.ZstdDecompressor().decompressobj()
                    text = frame.decompress(piece)
                    if text:
                        out.append(text)
                        size += len(text)
                    piece, frame = (frame.unused_data, None) if frame.eof else (b"", frame)
                if size >= CHUNK:
                    yield b"".join(out)
                    out, size = [], 0
        if frame is not None:
            raise zstandard.ZstdError(_ZSTD_TRUNCATED)
    except zstandard.ZstdError as e:
        raise _zstd_error(path, e) from None
    if out:
        yield b"".join(out)
