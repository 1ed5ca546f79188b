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

import json
import os
import shutil
import tempfile
from typing import Any

import numpy as np

from ppl_jax.data import documents as data
from ppl_jax.errors import DataError, PplJaxError
from ppl_jax.plans import protocols
from ppl_jax.plans.protocols import Plan
from ppl_jax.runtime import distributed, fingerprint
from ppl_jax.tokenizer.base import Tokenizer

VERSION = 1
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
            "files": [fingerprint.file_identity(p) for p in data.resolve_paths(ds.path)],
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
        self.folder = folder
        docs = np.load(os.path.join(folder, "docs.npz"))
        self.doc_tokens, self.doc_bytes, self.doc_words, self.doc_harness_words = (
            docs[n].astype(np.int64) for n in _DOC_ARRAYS[:4]
        )
        self.doc_edges = docs["edges"].astype(np.uint8)

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


def open_entry(folder: str) -> Entry | None:
    """The entry at `folder`, or None if it is absent or incomplete."""
    try:
        with open(os.path.join(folder, "parts.json"), encoding="utf-8") as f:
            meta = json.load(f)
        if meta.get("version") != VERSION:
            return None
        return Entry(folder, [Part(os.path.join(folder, name)) for name in meta["parts"]])
    except (OSError, ValueError, KeyError):
        return None


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
    tmp = tempfile.mkdtemp(prefix=f".{name}.", dir=folder)
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
                ids_file.write(np.ascontiguousarray(ids, np.int32).tobytes())
                bytes_file.write(np.ascontiguousarray(nbytes, np.int32).tobytes())
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
    try:
        os.makedirs(folder, exist_ok=True)
        num_documents = data.count_documents(ds.path, ds.format, ds.errors, ds.jsonl_field)
        build_part(ds, tok, folder, index, count, num_documents)
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
    names = [f"part-{i:05d}-of-{count:05d}" for i in range(count)]
    missing = [n for n in names if not os.path.isdir(os.path.join(folder, n))]
    if missing:
        raise DataError(
            f"data.cache_dir={ds.cache_dir!r}: process {index} does not see the token cache "
            f"parts {', '.join(missing)} that other processes wrote; on several hosts data.cache_dir "
            f"must be a folder every process sees (a shared filesystem or a bucket)."
        )
    if index == 0:
        _write_json(os.path.join(folder, "parts.json"), {"version": VERSION, "parts": names})
    _gather_failures(False)  # parts.json is in place before any process reads it
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


def _write_json(path: str, value: Any) -> None:
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(value, f)
    os.replace(tmp, path)


def planned(ds, ev, tok: Tokenizer, vocab_size: int, plan_key: str) -> Plan:
    """The dataset's plan through the token cache: the corpus tokenized (in shares, unless its
    entry is complete), then the plan written by process 0 into the plan cache
    (`ppl_jax.plans.plan_cache`, entry `plan_key`) and memory-mapped by every process.

    Raises:
      DataError, ConfigError: as `build` and `plan`; on the other processes, a DataError that
        points to process 0's log when its planning failed.
    """

    from ppl_jax.plans import plan_cache, stream_plans

    entry = build(ds, tok)
    add_bos = protocols.resolve_add_bos(ev.add_bos, tok)

    def write() -> None:
        plan_cache.save_built(
            ds.cache_dir,
            plan_key,
            lambda path: stream_plans.plan(
                entry,
                ev.protocol,
                tok,
                vocab_size,
                ev.seq_len,
                ev.stride,
                add_bos,
                ds.separator,
                path,
            ),
        )

    return plan_cache.made_once(ds.cache_dir, plan_key, write, f"data {ds.name!r}")[0]
