"""A token cache entry as it is read back: its parts, memory-mapped, each checked against what
its `part.json` and the entry's `parts.json` say (`ppl_jax.plans.token_cache` writes them).

A part holds flat arrays: `ids.bin` (int32 token ids), `bytes.bin` (int32: the UTF-8 bytes each
token covers) and, in `docs.npz`, per document its tokens, bytes, words, harness words, edges and
source (`ppl_jax.data.sources.Sources`). `open_entry` accepts only the entry's own part names,
whose document ranges must tile the corpus once; `Verifier` checks a part's token files against
their SHA-256 digests as they are read.
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

VERSION = 3  # 2: parts.json counts documents, part.json its digests; 3: sources as arrays
DOC_ARRAYS = ("tokens", "bytes", "words", "harness_words", "edges")


class Part:
    """One process's share of an entry, memory-mapped.

    Attributes:
      ids, byte_lengths: `[n] int32` token ids and the UTF-8 bytes each covers.
      doc_tokens, doc_bytes, doc_words, doc_harness_words: `[d] int64` per document.
      doc_edges: `[d] uint8`, bit 1: begins with a non-space character, bit 2: ends with one.
      sources: the documents' sources (`ppl_jax.data.sources.Sources`: a file index and a line
        per document, read as `path:line`).
      head: for the part's first non-empty document, `{"doc", "first_token_bytes",
        "words_after", "starts_after"}`: the words of its text after its first token and
        whether that rest begins with a non-space character; None if every document is empty.
    """

    def __init__(self, folder: str):
        with open(os.path.join(folder, "part.json"), encoding="utf-8") as f:
            meta = json.load(f)
        self.num_tokens = int(meta["num_tokens"])
        self.head: dict[str, Any] | None = meta["head"]
        self.any_text = bool(meta["any_text"])
        self.documents = (int(meta["documents"][0]), int(meta["documents"][1]))
        self.digests: dict[str, str] = dict(meta["digests"])
        self.folder = folder
        docs = np.load(os.path.join(folder, "docs.npz"))
        self.doc_tokens, self.doc_bytes, self.doc_words, self.doc_harness_words = (
            docs[n].astype(np.int64) for n in DOC_ARRAYS[:4]
        )
        self.doc_edges = docs["edges"].astype(np.uint8)
        self.sources = Sources(meta["files"], docs["source_file"], docs["source_line"])
        self._check()

    def _check(self) -> None:
        """Raises DataError where the part's files disagree with its `part.json` (a truncated
        or edited part): document counts, token total, and the sizes of `ids.bin`/`bytes.bin`.
        Their contents are checked against `digests` as they are read (`Verifier`)."""
        lo, hi = self.documents
        n_docs = hi - lo
        sizes = {a.size for a in (self.doc_tokens, self.doc_bytes, self.doc_words, self.doc_edges)}
        if sizes != {n_docs} or len(self.sources) != n_docs:
            raise damaged(self.folder, f"it lists {n_docs} documents but holds {sorted(sizes)}")
        if int(self.doc_tokens.sum()) != self.num_tokens:
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
        return sum(p.doc_tokens.size for p in self.parts)

    def doc_array(self, name: str) -> np.ndarray:
        return np.concatenate([getattr(p, name) for p in self.parts])

    @functools.cached_property
    def sources(self) -> Sources:
        return Sources.concat([p.sources for p in self.parts])

    def head(self) -> tuple[int, dict[str, Any]] | None:
        """(global index of the first non-empty document, its part's `head`), or None."""
        before = 0
        for p in self.parts:
            if p.head is not None:
                return before + p.head["doc"], p.head
            before += p.doc_tokens.size
        return None


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
        self.hashes["ids"].update(np.ascontiguousarray(ids, np.int32).tobytes())
        self.hashes["bytes"].update(np.ascontiguousarray(lens, np.int32).tobytes())

    def check(self) -> None:
        """Raises DataError (`damaged`) where a digest differs."""
        for name, h in self.hashes.items():
            if h.hexdigest() != self.part.digests.get(name):
                raise damaged(
                    os.path.dirname(self.part.folder),
                    f"{os.path.basename(self.part.folder)}/{name}.bin differs from the digest "
                    f"its part.json holds",
                )
