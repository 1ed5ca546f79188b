"""The token cache: a corpus tokenized once, in shares across processes, in bounded memory.

`data.cache_dir` names a folder shared by every process of a run. For a dataset with no
preparation and no budget, scored by a per-document protocol (`sliding`, `lm_eval_rolling`), the
corpus is tokenized into an entry `<cache_dir>/tokens-<key>/`, whose key is the SHA-256 of the
files (`fingerprint.file_identity`: path, size, modification time or a remote object version),
how they are read (format, JSONL field, UTF-8 errors) and the tokenizer's whole description.
The entry does not depend on the protocol, the separator, BOS or the model: every protocol,
sequence length and checkpoint that reads the same files with the same tokenizer plans from it.

**Shares.** Documents are numbered in file order (`data.count_documents`). With P processes,
process p tokenizes the contiguous block `[p*D/P, (p+1)*D/P)`, read by `data.iter_documents`
and encoded `BATCH_CHARS` characters at a time (the tokenizer's batch encoding,
`Tokenizer.encode_with_bytes`, which cuts a long document into pieces that provably give the
same tokens). It writes its part into a temporary folder renamed into place (complete or absent),
and all processes meet (`multihost_utils.process_allgather` of a status, so that one process's
error stops the others with a message instead of a hang). An entry is the folder holding one
part per process of the run that built it, and `parts.json`, written last.

A part holds flat arrays, appended while tokenizing and read back in chunks (`Part.read`):
`ids.bin` (int32 token ids), `bytes.bin` (int32: the UTF-8 bytes each token covers, for bits per
byte), and per document: tokens, UTF-8 bytes, whitespace-separated words (`str.split`), the
lm-evaluation-harness's words (`protocols.count_harness_words`), whether it begins and ends with
a non-space character (to count the words of documents joined by a separator exactly), and its
source (`path:line`). Memory while building is bounded by one batch of documents, whatever the
corpus size (plus a few integers per document).

Plans are made from an entry by `ppl_jax.plans.stream_plans`.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from typing import Any

import numpy as np

from ppl_jax.data import documents as data
from ppl_jax.errors import ConfigError, DataError, PplJaxError
from ppl_jax.runtime import distributed, fingerprint, preemption, temporaries
from ppl_jax.tokenizer.base import Tokenizer

VERSION = 2  # 2: parts.json counts the documents, part.json holds its files' digests
PROTOCOLS = ("sliding", "lm_eval_rolling")  # protocols whose documents are tokenized one by one
BATCH_CHARS = 1 << 20  # characters of documents per call of the tokenizer's batch encoding
COPY_TOKENS = 1 << 22  # tokens per chunk read from a part
_DOC_ARRAYS = ("tokens", "bytes", "words", "harness_words", "edges")
STARTS, ENDS = 1, 2  # `edges` bits: the text begins / ends with a non-space character


def applies(ds, protocol: str) -> bool:
    """Whether a dataset is planned through the token cache (see the module docstring)."""
    return bool(ds.cache_dir) and not ds.preparation and not ds.has_budget and protocol in PROTOCOLS


def key(ds, tok: Tokenizer) -> str:
    """The entry's key (SHA-256 hex; see the module docstring)."""
    return fingerprint.digest(
        {
            "version": VERSION,
            "files": [
                fingerprint.file_identity(p, ds.fingerprint == "content")
                for p in data.resolve_paths(ds.path)
            ],
            "data": {"format": ds.format, "jsonl_field": ds.jsonl_field, "errors": ds.errors},
            "tokenizer": fingerprint.text_digest(tok.describe()),
        }
    )


class Part:
    """One process's share of an entry, memory-mapped.

    Attributes:
      ids, byte_lengths: `[n] int32` token ids and the UTF-8 bytes each covers.
      doc_tokens, doc_bytes, doc_words, doc_harness_words: `[d] int64` per document.
      doc_edges: `[d] uint8`, bit 1: begins with a non-space character, bit 2: ends with one.
      sources: `[d]` document sources (`path:line`).
      head: for the part's first non-empty document, `{"doc", "first_token_bytes",
        "words_after", "starts_after"}`: the words of its text after its first token and
        whether that rest begins with a non-space character; None if every document is empty.
    """

    def __init__(self, folder: str):
        with open(os.path.join(folder, "part.json"), encoding="utf-8") as f:
            meta = json.load(f)
        self.num_tokens = int(meta["num_tokens"])
        self.sources: list[str] = meta["sources"]
        self.head: dict[str, Any] | None = meta["head"]
        self.any_text = bool(meta["any_text"])
        self.documents = (int(meta["documents"][0]), int(meta["documents"][1]))
        self.digests: dict[str, str] = dict(meta["digests"])
        self.folder = folder
        docs = np.load(os.path.join(folder, "docs.npz"))
        self.doc_tokens, self.doc_bytes, self.doc_words, self.doc_harness_words = (
            docs[n].astype(np.int64) for n in _DOC_ARRAYS[:4]
        )
        self.doc_edges = docs["edges"].astype(np.uint8)
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

    @property
    def sources(self) -> tuple[str, ...]:
        return tuple(s for p in self.parts for s in p.sources)

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


def build_part(ds, tok: Tokenizer, folder: str, index: int, count: int, num_documents: int) -> str:
    """Tokenizes share `index` of `count` of the corpus into `folder/part-<index>-of-<count>`
    (complete or absent); returns that folder's name.

    Raises:
      DataError: as `data.iter_documents`.
    """
    name = f"part-{index:05d}-of-{count:05d}"
    final = os.path.join(folder, name)
    if os.path.isdir(final):
        return name
    lo, hi = index * num_documents // count, (index + 1) * num_documents // count
    tmp = os.path.join(folder, temporaries.name(name))
    os.mkdir(tmp)
    try:
        _write_part(ds, tok, tmp, lo, hi)
        try:
            os.rename(tmp, final)
        except OSError:
            if not os.path.isdir(final):  # not another writer's complete part
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return name


def _write_part(ds, tok: Tokenizer, tmp: str, lo: int, hi: int) -> None:
    per_doc: dict[str, list[int]] = {n: [] for n in _DOC_ARRAYS}
    sources: list[str] = []
    head, any_text, num_tokens = None, False, 0
    hashes = {"ids": hashlib.sha256(), "bytes": hashlib.sha256()}
    with (
        open(os.path.join(tmp, "ids.bin"), "wb") as ids_file,
        open(os.path.join(tmp, "bytes.bin"), "wb") as bytes_file,
    ):
        batch: list[data.Document] = []

        def flush() -> None:
            nonlocal head, any_text, num_tokens
            encoded = tok.encode_with_bytes([d.text for d in batch])
            for doc, (ids, nbytes) in zip(batch, encoded, strict=True):
                text = doc.text
                for f, h, values in (
                    (ids_file, hashes["ids"], ids),
                    (bytes_file, hashes["bytes"], nbytes),
                ):
                    raw = np.ascontiguousarray(values, np.int32).tobytes()
                    f.write(raw)
                    h.update(raw)
                if head is None and ids.size:
                    rest = text.encode("utf-8")[int(nbytes[0]) :].decode("utf-8", "ignore")
                    head = {
                        "doc": len(sources),
                        "first_token_bytes": int(nbytes[0]),
                        "words_after": len(rest.split()),
                        "starts_after": bool(rest) and not rest[0].isspace(),
                    }
                per_doc["tokens"].append(ids.size)
                per_doc["bytes"].append(len(text.encode("utf-8")))
                words = len(text.split())
                per_doc["words"].append(words)
                edges = edges_of(text)
                per_doc["harness_words"].append(_harness_words(text, words, edges))
                per_doc["edges"].append(edges)
                sources.append(doc.source)
                any_text = any_text or bool(text.strip())
                num_tokens += ids.size
            batch.clear()

        chars = 0
        for doc in data.iter_documents(ds.path, ds.format, ds.errors, ds.jsonl_field, lo, hi):
            batch.append(doc)
            chars += len(doc.text)
            if chars >= BATCH_CHARS:
                flush()
                chars = 0
        if batch:
            flush()
    np.savez(
        os.path.join(tmp, "docs.npz"),
        **{n: np.asarray(v, np.uint8 if n == "edges" else np.int64) for n, v in per_doc.items()},
    )
    meta = {
        "num_tokens": num_tokens,
        "sources": sources,
        "head": head,
        "any_text": any_text,
        "documents": [lo, hi],
        "digests": {n: h.hexdigest() for n, h in hashes.items()},
    }
    with open(os.path.join(tmp, "part.json"), "w", encoding="utf-8") as f:
        json.dump(meta, f)


def _harness_words(text: str, words: int, edges: int) -> int:
    """`protocols.count_harness_words(text)`, `len(re.split(r"\\s+", text))`, from the
    `str.split` words and the edges: a whitespace run between each two words, and one more at
    each end that is whitespace (`\\s` and `str.split` both take Python's `str.isspace`)."""
    if not text:
        return 1
    return words + (0 if edges & STARTS else 1) + (0 if edges & ENDS else 1)


def edges_of(text: str) -> int:
    """The `edges` bits of a text (`STARTS`, `ENDS`)."""
    if not text:
        return 0
    return (STARTS if not text[0].isspace() else 0) | (ENDS if not text[-1].isspace() else 0)


def build(ds, tok: Tokenizer) -> Entry:
    """The dataset's entry, tokenized now (each process its share) unless it is complete.

    Raises:
      DataError: as `data.iter_documents`, a corpus with no text, or a cache folder that not
        every process sees.
    """
    import jax

    folder = os.path.join(ds.cache_dir, f"tokens-{key(ds, tok)}")
    found = open_entry(folder)
    if found is not None:
        _check_text(found, ds)
        return found
    index, count = jax.process_index(), jax.process_count()
    error: PplJaxError | None = None
    num_documents = 0
    try:
        with preemption.signals_raise(f"tokenizing data {ds.name!r} into {folder}"):
            os.makedirs(folder, exist_ok=True)
            temporaries.remove_stale(folder)
            num_documents = data.count_documents(ds.path, ds.format, ds.errors, ds.jsonl_field)
            build_part(ds, tok, folder, index, count, num_documents)
    except OSError as e:
        error = write_error(ds.cache_dir, "the token cache", e)
    except PplJaxError as e:
        error = e
    failed = _gather_failures(error is not None)
    if error is not None:
        raise error
    if failed:
        raise DataError(
            f"data {ds.name!r}: process {failed[0]} could not tokenize its share of the corpus "
            f"(its log says why); fix that and run again."
        )
    names = part_names(count)
    missing = [n for n in names if not os.path.isdir(os.path.join(folder, n))]
    if missing:
        raise DataError(
            f"data.cache_dir={ds.cache_dir!r}: process {index} does not see the token cache "
            f"parts {', '.join(missing)} that other processes wrote; on several hosts data.cache_dir "
            f"must be a folder every process sees (a shared filesystem or a bucket)."
        )
    if index == 0:
        try:
            write_parts(folder, count, num_documents)
        except OSError as e:
            error = write_error(ds.cache_dir, "the token cache", e)
    # parts.json is in place before any process reads it
    if _gather_failures(error is not None):
        raise error or DataError(
            f"data {ds.name!r}: process 0 could not finish the token cache (its log says why)."
        )
    entry = open_entry(folder)
    if entry is None:
        raise DataError(f"data.cache_dir={ds.cache_dir!r}: the token cache {folder} is incomplete.")
    _check_text(entry, ds)
    return entry


def _gather_failures(failed: bool) -> list[int]:
    """The processes that report a failure (every process calls this: it is a barrier)."""
    return [i for i, f in enumerate(distributed.flags_of_all(failed)) if f]


def _check_text(entry: Entry, ds) -> None:
    if not any(p.any_text for p in entry.parts):
        raise data.no_text_error(ds.path, ds.format, any(p.num_tokens for p in entry.parts))


def write_parts(folder: str, count: int, num_documents: int) -> None:
    """Writes the entry's `parts.json` (atomically): its `count` parts and the corpus's
    `num_documents`, which the parts' document ranges must tile (`open_entry`)."""
    value = {"version": VERSION, "parts": part_names(count), "documents": num_documents}
    _write_json(os.path.join(folder, "parts.json"), value)


def _write_json(path: str, value: Any) -> None:
    tmp = os.path.join(os.path.dirname(path), temporaries.name(os.path.basename(path)))
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(value, f)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def write_error(cache_dir: str, what: str, e: OSError) -> ConfigError:
    """The error of a cache that cannot be written (no space, no permission, not a folder);
    nothing half-written is left (every entry is renamed into place when complete)."""
    return ConfigError(
        f"data.cache_dir={cache_dir!r}: {what} could not be written there "
        f"({e.strerror or e}); free space there, or set data.cache_dir to a folder you can "
        f"write to (or '' for none)."
    )
