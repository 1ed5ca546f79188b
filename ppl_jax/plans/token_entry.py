"""A token cache entry as it is read back: its parts, memory-mapped, each checked against what
its `part.json` and the entry's `parts.json` say (`ppl_jax.plans.token_cache` writes them).

A part holds flat arrays: `ids.bin` (int32 token ids), `bytes.bin` (int32: the UTF-8 bytes each
token covers) and one file per document array (`COLUMNS`): its tokens, bytes, words, harness
words, words after its first token, edges and source (`ppl_jax.data.sources.Sources`). `open_entry` accepts only the entry's
own part names, whose document ranges must tile the corpus once; a part's document arrays are
checked against their SHA-256 digests when it is opened, and `Verifier` checks its token files as
they are read.

A part keeps nothing per document in memory: its document arrays are read from their files when
asked for (`Part.column`), whole or a chunk of documents at a time.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
from typing import Any

import numpy as np

from ppl_jax.data.sources import Sources
from ppl_jax.errors import DataError

VERSION = 5  # 2: parts.json counts documents, part.json its digests; 3: sources as arrays;
# 4: a file per document array (`COLUMNS`), counts in uint32 where they fit; 5: words after the
# first token (`doc_words_after`)
COUNTS = ("doc_tokens", "doc_bytes", "doc_words", "doc_harness_words", "doc_words_after")
COLUMNS = (*COUNTS, "doc_edges", "source_file", "source_line")  # `<name>.bin`, one per document
DTYPES = {  # the dtypes other than the counts' (`source_file`: `Sources.file`'s)
    "doc_edges": ("uint8",),
    "source_file": ("uint8", "uint16", "uint32"),
    "source_line": ("uint32",),
}
COUNT_DTYPES = ("uint32", "int64")  # a part's counts are uint32 unless one does not fit
_READ_CHUNK = 1 << 20  # bytes per read while hashing a file
_CHECK_DOCS = 1 << 16  # documents per chunk of the token counts summed on opening a part


class Part:
    """One process's share of an entry.

    Attributes:
      documents: the part's documents `[lo, hi)` in the corpus; num_documents: `hi - lo`.
      num_tokens: its tokens; files: the paths its sources index.
      dtypes: each document array's dtype (`COLUMNS`: `Part.column`).
      head: for the part's first non-empty document, `{"doc", "first_token_bytes",
        "words_after", "starts_after"}`: the words of its text after its first token and
        whether that rest begins with a non-space character; None if every document is empty.

    Raises (on opening):
      DataError: files that disagree with `part.json` (`damaged`).
    """

    def __init__(self, folder: str):
        with open(os.path.join(folder, "part.json"), encoding="utf-8") as f:
            meta = json.load(f)
        self.num_tokens = int(meta["num_tokens"])
        self.head: dict[str, Any] | None = meta["head"]
        self.any_text = bool(meta["any_text"])
        self.documents = (int(meta["documents"][0]), int(meta["documents"][1]))
        self.digests: dict[str, str] = dict(meta["digests"])
        self.dtypes: dict[str, str] = {n: str(meta["dtypes"][n]) for n in COLUMNS}
        self.files: list[str] = list(meta["files"])
        self.folder = folder
        self._check_columns()
        self._check()

    @property
    def num_documents(self) -> int:
        return self.documents[1] - self.documents[0]

    def column(self, name: str, lo: int = 0, hi: int | None = None) -> np.ndarray:
        """`[hi - lo]` of the document array `name` (one of `COLUMNS`; `hi` is at most, and
        defaults to, the part's document count), in its stored dtype (`dtypes[name]`: uint32 or int64 for the
        counts, uint8 for the edges, `Sources`' for the sources), read from its file."""
        hi = self.num_documents if hi is None else min(hi, self.num_documents)
        dtype = np.dtype(self.dtypes[name])
        if hi <= lo:
            return np.zeros(0, dtype)
        path = os.path.join(self.folder, f"{name}.bin")
        return np.fromfile(path, dtype, count=hi - lo, offset=lo * dtype.itemsize)

    @property
    def sources(self) -> Sources:
        """The documents' sources (`ppl_jax.data.sources.Sources`), read from their files."""
        return Sources(self.files, self.column("source_file"), self.column("source_line"))

    def _check_columns(self) -> None:
        """Raises DataError where a document array's dtype is not one it may have, its file's
        size is not its document count's, or its bytes differ from their digest."""
        for name in COLUMNS:
            dtype = self.dtypes[name]
            if dtype not in DTYPES.get(name, COUNT_DTYPES):
                raise damaged(self.folder, f"its {name} are of dtype {dtype!r}")
            path = os.path.join(self.folder, f"{name}.bin")
            want = self.num_documents * np.dtype(dtype).itemsize
            if os.path.getsize(path) != want:
                raise damaged(
                    self.folder, f"{name}.bin holds {os.path.getsize(path)} bytes of {want}"
                )
            if file_digest(path) != self.digests.get(name):
                raise damaged(
                    self.folder, f"{name}.bin differs from the digest its part.json holds"
                )

    def _check(self) -> None:
        """Raises DataError where the part's token files disagree with its `part.json` (a
        truncated or edited part): the token total and the sizes of `ids.bin`/`bytes.bin`.
        Their contents are checked against `digests` as they are read (`Verifier`)."""
        total = sum(
            int(self.column("doc_tokens", lo, lo + _CHECK_DOCS).sum(dtype=np.int64))
            for lo in range(0, self.num_documents, _CHECK_DOCS)
        )
        if total != self.num_tokens:
            raise damaged(self.folder, "its documents' token counts do not add up to its total")
        for name in ("ids", "bytes"):
            size = os.path.getsize(os.path.join(self.folder, f"{name}.bin"))
            if size != 4 * self.num_tokens:
                raise damaged(
                    self.folder, f"{name}.bin holds {size // 4} tokens of {self.num_tokens}"
                )

    def read(self, name: str, lo: int, hi: int) -> np.ndarray:
        """`[hi - lo] int32` of `ids` (token ids) or `bytes` (UTF-8 bytes per token), read from
        the file (not memory-mapped: pages read stay out of this process's resident memory)."""
        if hi <= lo:
            return np.zeros(0, np.int32)
        path = os.path.join(self.folder, f"{name}.bin")
        return np.fromfile(path, np.int32, count=hi - lo, offset=4 * lo)


class Entry:
    """A complete entry: its parts in document order."""

    def __init__(self, folder: str, parts: list[Part]):
        self.folder = folder
        self.parts = parts

    @property
    def num_documents(self) -> int:
        return sum(p.num_documents for p in self.parts)

    @property
    def num_tokens(self) -> int:
        return sum(p.num_tokens for p in self.parts)

    def doc_array(self, name: str) -> np.ndarray:
        """`[D] int64`: the document array `name` (`COLUMNS`) of every part, in order."""
        out = np.empty(self.num_documents, np.int64)
        at = 0
        for p in self.parts:
            out[at : at + p.num_documents] = p.column(name)
            at += p.num_documents
        return out

    @functools.cached_property
    def sources(self) -> Sources:
        """The documents' sources, the parts' in order with their file lists merged (each path
        once), read part by part into one pair of arrays."""
        if len(self.parts) == 1:
            return self.parts[0].sources
        files: dict[str, int] = {}
        file = np.empty(self.num_documents, np.uint32)
        line = np.empty_like(file)
        at = 0
        for p in self.parts:
            index = np.asarray([files.setdefault(f, len(files)) for f in p.files], np.uint32)
            n = p.num_documents
            if n:
                file[at : at + n] = index[p.column("source_file")]
                line[at : at + n] = p.column("source_line")
            at += n
        return Sources(tuple(files), file, line)

    def head(self) -> tuple[int, dict[str, Any]] | None:
        """(global index of the first non-empty document, its part's `head`), or None."""
        before = 0
        for p in self.parts:
            if p.head is not None:
                return before + p.head["doc"], p.head
            before += p.num_documents
        return None


def file_digest(path: str) -> str:
    """SHA-256 (hex) of a file's bytes, read `_READ_CHUNK` bytes at a time."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_READ_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def damaged(folder: str, what: str) -> DataError:
    """The error of a token cache entry whose files do not hold what it says."""
    return DataError(
        f"the token cache entry {folder} is damaged ({what}); delete that folder and run again "
        f"(the corpus is tokenized anew)."
    )


def part_names(count: int) -> list[str]:
    """The names of an entry's parts when `count` processes built it, in document order."""
    return [f"part-{i:05d}-of-{count:05d}" for i in range(count)]


def open_entry(folder: str) -> Entry | None:
    """The entry at `folder`, or None if it is absent, incomplete or of another version.

    Raises:
      DataError: `parts.json` names anything but the entry's own parts (`part_names`: no path
        leads out of the folder, no part is listed twice), a part is a link, or the parts'
        document ranges do not tile the corpus exactly once; a part whose files disagree with
        its `part.json` (`Part`).
    """
    try:
        with open(os.path.join(folder, "parts.json"), encoding="utf-8") as f:
            meta = json.load(f)
        if meta.get("version") != VERSION:
            return None
        names, total = meta["parts"], int(meta["documents"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if not isinstance(names, list) or not names or names != part_names(len(names)):
        raise damaged(folder, f"parts.json lists {str(names)[:120]}, not its own parts")
    parts = []
    for name in names:
        path = os.path.join(folder, name)
        if os.path.islink(path):
            raise damaged(folder, f"its part {name} is a link")
        try:
            parts.append(Part(path))
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise damaged(folder, f"its part {name} cannot be read: {e}") from None
    at = 0
    for name, part in zip(names, parts, strict=True):
        if part.documents[0] != at or part.documents[1] < at:
            raise damaged(
                folder, f"its part {name} holds documents {list(part.documents)}, not from {at}"
            )
        at = part.documents[1]
    if at != total:
        raise damaged(folder, f"its parts hold {at} documents of {total}")
    return Entry(folder, parts)


class Verifier:
    """Checks a part's `ids.bin` and `bytes.bin` against the SHA-256 digests its `part.json`
    holds, as they are read once, in order, from first token to last (`stream_plans`): an
    edited or damaged part is refused at no cost beyond the hashing (about 1 GB/s)."""

    def __init__(self, part: Part):
        self.part = part
        self.hashes = {"ids": hashlib.sha256(), "bytes": hashlib.sha256()}

    def update(self, ids: np.ndarray, lens: np.ndarray) -> None:
        self.hashes["ids"].update(np.ascontiguousarray(ids, np.int32))
        self.hashes["bytes"].update(np.ascontiguousarray(lens, np.int32))

    def check(self) -> None:
        """Raises DataError (`damaged`) where a digest differs."""
        for name, h in self.hashes.items():
            if h.hexdigest() != self.part.digests.get(name):
                raise damaged(
                    os.path.dirname(self.part.folder),
                    f"{os.path.basename(self.part.folder)}/{name}.bin differs from the digest "
                    f"its part.json holds",
                )
