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

A part holds flat arrays, appended while tokenizing and memory-mapped when read:
`ids.bin` (int32 token ids), `bytes.bin` (int32: the UTF-8 bytes each token covers, for bits per
byte), and per document: tokens, UTF-8 bytes, whitespace-separated words (`str.split`), the
lm-evaluation-harness's words (`protocols.count_harness_words`), whether it begins and ends with
a non-space character (to count the words of documents joined by a separator exactly), and its
source (`path:line`). Memory while building is bounded by one batch of documents, whatever the
corpus size.

**Plans from lengths.** `plan` builds a protocol's `Plan` from an entry: its windows from the
documents' token counts alone, its token stream (with separators and BOS, as `protocols.plan`
lays it out) written chunk by chunk into a plan-cache entry (`ppl_jax.plan_cache`) and
memory-mapped, and its counts from the per-document counts. The result is identical, array for
array, to `protocols.plan` on the same documents (tested). Process 0 writes the plan entry; the
others wait and memory-map it.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from typing import Any

import numpy as np

from ppl_jax import data, distributed, fingerprint, protocols
from ppl_jax import windows as windows_lib
from ppl_jax.errors import DataError, PplJaxError
from ppl_jax.protocols import Plan
from ppl_jax.tokenizer import Tokenizer

VERSION = 1
PROTOCOLS = ("sliding", "lm_eval_rolling")  # protocols whose documents are tokenized one by one
BATCH_CHARS = 1 << 20  # characters of documents per call of the tokenizer's batch encoding
COPY_TOKENS = 1 << 22  # tokens per chunk when a plan's stream is written
_DOC_ARRAYS = ("tokens", "bytes", "words", "harness_words", "edges")
_STARTS, _ENDS = 1, 2  # `edges` bits: the text begins / ends with a non-space character


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

    def chunks(self, name: str) -> Iterator[np.ndarray]:
        """The part's `ids` or `bytes`, `COPY_TOKENS` at a time."""
        for at in range(0, self.num_tokens, COPY_TOKENS):
            yield self.read(name, at, min(self.num_tokens, at + COPY_TOKENS))


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

    def token_chunks(self) -> Iterator[np.ndarray]:
        """The token ids of every part in order, `COPY_TOKENS` at a time."""
        for p in self.parts:
            yield from p.chunks("ids")


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
                edges = _edges(text)
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
    return words + (0 if edges & _STARTS else 1) + (0 if edges & _ENDS else 1)


def _edges(text: str) -> int:
    if not text:
        return 0
    return (_STARTS if not text[0].isspace() else 0) | (_ENDS if not text[-1].isspace() else 0)


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
    (`ppl_jax.plan_cache`, entry `plan_key`) and memory-mapped by every process.

    Raises:
      DataError, ConfigError: as `build` and `plan`; on the other processes, a DataError that
        points to process 0's log when its planning failed.
    """

    from ppl_jax import plan_cache

    entry = build(ds, tok)
    add_bos = protocols.resolve_add_bos(ev.add_bos, tok)

    def write() -> None:
        plan_cache.save_built(
            ds.cache_dir,
            plan_key,
            lambda path: plan(
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


# ---------------------------------------------------------------------------------------------
# Plans from an entry.


def plan(
    entry: Entry,
    protocol: str,
    tok: Tokenizer,
    vocab_size: int,
    seq_len: int,
    stride: int | None,
    add_bos: bool,
    separator: str,
    stream_path: str,
) -> Plan:
    """The `Plan` of `protocol` over the entry's documents, identical to `protocols.plan` on the
    same documents; its token stream is written to `stream_path` (`.npy`) and memory-mapped.

    Raises:
      DataError: an id outside the vocabulary (naming the document), or nothing to score.
      ConfigError: as `protocols.plan`.
    """
    _check_vocabulary(entry, vocab_size, tok)
    if protocol == "sliding":
        return _sliding(entry, tok, vocab_size, seq_len, stride, add_bos, separator, stream_path)
    if protocol == "lm_eval_rolling":
        return _rolling(entry, tok, vocab_size, seq_len, add_bos, stream_path)
    raise ValueError(f"the token cache does not plan {protocol}")


def _check_vocabulary(entry: Entry, vocab_size: int, tok: Tokenizer) -> None:
    starts = np.cumsum(np.concatenate([[0], entry.doc_array("doc_tokens")]))
    at = 0
    for chunk in entry.token_chunks():
        bad = np.flatnonzero((chunk < 0) | (chunk >= vocab_size))
        if bad.size:
            d = int(np.searchsorted(starts, at + bad[0], side="right")) - 1
            protocols.check_ids(
                chunk[bad[:1]], vocab_size, f"document {d} ({entry.sources[d]})", tok
            )
        at += chunk.size


def _segments(
    entry: Entry, sep: tuple[np.ndarray, np.ndarray] | None, before_first: bool = False
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """The stream's text tokens and byte lengths: the documents' tokens with `sep`'s tokens
    between documents (also before the first with `before_first`), in chunks of whole documents
    of about `COPY_TOKENS` tokens."""
    first = not before_first
    for part in entry.parts:
        offsets = np.concatenate([[0], np.cumsum(part.doc_tokens)])
        d = 0
        while d < part.doc_tokens.size:
            e = int(np.searchsorted(offsets, offsets[d] + COPY_TOKENS, side="right")) - 1
            e = max(e, d + 1)
            lo, hi = int(offsets[d]), int(offsets[e])
            ids, lens = part.read("ids", lo, hi), part.read("bytes", lo, hi)
            if sep is not None:
                ids, lens = _with_separators(ids, lens, part.doc_tokens[d:e], sep, first)
            first = False
            yield ids, lens
            d = e


def _with_separators(ids, lens, doc_tokens, sep, first: bool):
    """`ids`/`lens` of consecutive documents with the separator's tokens before each document
    (but the corpus's first)."""
    n_docs, sep_n = doc_tokens.size, sep[0].size
    seps = n_docs - (1 if first else 0)
    out_ids = np.empty(ids.size + seps * sep_n, np.int32)
    out_lens = np.empty_like(out_ids)
    # Each document's tokens move right by the separators before it in this chunk.
    shift = (np.arange(n_docs) + (0 if first else 1)) * sep_n
    doc_of = np.repeat(np.arange(n_docs), doc_tokens)
    dest = np.arange(ids.size) + shift[doc_of]
    out_ids[dest] = ids
    out_lens[dest] = lens
    starts = np.concatenate([[0], np.cumsum(doc_tokens)[:-1]]) + shift  # each doc's first token
    for j in range(1 if first else 0, n_docs):
        out_ids[starts[j] - sep_n : starts[j]] = sep[0]
        out_lens[starts[j] - sep_n : starts[j]] = sep[1]
    return out_ids, out_lens


class _Stream:
    """A `.npy` file of `[n] int32` written chunk by chunk (`numpy.lib.format` header, then the
    data), with the SHA-256 of its data (`protocols.tokens_digest`)."""

    def __init__(self, path: str, n: int):
        self.file = open(path, "wb")  # closed by `close`
        header = {"descr": np.dtype(np.int32).str, "fortran_order": False, "shape": (n,)}
        np.lib.format.write_array_header_1_0(self.file, header)
        self.n, self.written = n, 0
        self.digest = hashlib.sha256()

    def write(self, ids: np.ndarray) -> None:
        data_ = np.ascontiguousarray(ids, np.int32).tobytes()
        self.file.write(data_)
        self.digest.update(data_)
        self.written += ids.size

    def close(self) -> str:
        self.file.close()
        if self.written != self.n:
            raise AssertionError(f"wrote {self.written} tokens of a stream of {self.n}")
        return self.digest.hexdigest()


def _sliding(entry, tok, vocab_size, seq_len, stride, add_bos, separator, stream_path) -> Plan:
    num_docs = entry.num_documents
    doc_tokens = entry.doc_array("doc_tokens")
    sep = None
    if separator and num_docs > 1:
        sep = tok.encode_with_bytes([separator])[0]
        protocols.check_ids(sep[0], vocab_size, f"data.separator {separator!r}", tok)
    sep_n = 0 if sep is None else sep[0].size
    bos = 1 if add_bos else 0
    text_tokens = int(doc_tokens.sum()) + sep_n * max(0, num_docs - 1)
    n = bos + text_tokens
    if n < 2:
        raise DataError(
            f"the corpus ({num_docs} documents) tokenizes to {n} token(s); at least two are "
            f"needed to score one. Check data.path and data.format."
        )
    # The windows need only the stream's length: a stand-in of that length holds no memory.
    windows = windows_lib.sliding(np.broadcast_to(np.int32(0), (n,)), seq_len, stride)
    lo = windows.starts + windows.first_scored  # scored targets [lo, hi) (no prefix tokens)
    hi = windows.starts + windows.lengths
    # Prefix sums of the stream's byte lengths at every window bound, while writing the stream.
    bounds = np.concatenate([lo, hi])
    order = np.argsort(bounds, kind="stable")
    ordered = bounds[order]
    cum = np.zeros(bounds.size, np.int64)
    at, total, k = 0, 0, 0
    stream = _Stream(stream_path, n)
    if bos:
        stream.write(np.asarray([tok.bos_id], np.int32))
        at = 1
    for ids, lens in _segments(entry, sep):
        stream.write(ids)
        prefix = np.concatenate([[0], np.cumsum(lens, dtype=np.int64)])
        j = int(np.searchsorted(ordered, at + ids.size, side="right"))
        sel = order[k:j]
        cum[sel] = total + prefix[np.maximum(bounds[sel] - at, 0)]
        k = j
        at += ids.size
        total += int(prefix[-1])
    cum[order[k:]] = total
    digest = stream.close()
    window_bytes = cum[lo.size :] - cum[: lo.size]
    scored = int(windows.num_scored().sum())
    tokens = np.load(stream_path, mmap_mode="r")
    windows = windows_lib.Windows(
        tokens=tokens,
        **{
            f: getattr(windows, f)
            for f in ("starts", "lengths", "prefix", "first_scored", "document")
        },
        seq_len=seq_len,
    )
    doc_starts = (
        np.concatenate([[0], np.cumsum(doc_tokens)[:-1]]) + np.arange(num_docs) * sep_n + bos
    ).astype(np.int64)
    return Plan(
        protocol="sliding",
        windows=windows,
        num_bytes=int(window_bytes.sum()),
        num_words=_sliding_words(entry, tok, separator if sep is not None else "", add_bos),
        num_documents=num_docs,
        text_tokens=text_tokens,
        unscored_tokens=text_tokens - scored,
        add_bos=bool(add_bos),
        prefix_id=None,
        doc_bytes=None,
        doc_words=None,
        sources=entry.sources,
        doc_starts=doc_starts,
        window_bytes=window_bytes,
        tokens_digest=digest,
    )


def _sliding_words(entry: Entry, tok: Tokenizer, separator: str, add_bos: bool) -> int:
    """Words of the joined text from the first scored token to the end (`protocols._span_words`),
    from the documents' word counts: words(A + B) = words(A) + words(B) - 1 when A ends and B
    begins with a non-space character (`str.split` semantics), over the segments document,
    separator, document, ..."""
    n = entry.num_documents
    doc = {
        "words": entry.doc_array("doc_words"),
        "edges": entry.doc_array("doc_edges").astype(np.int64),
        "bytes": entry.doc_array("doc_bytes"),
        "tokens": entry.doc_array("doc_tokens"),
    }
    if separator and n > 1:
        sep = {
            "words": len(separator.split()),
            "edges": _edges(separator),
            "bytes": len(separator.encode("utf-8")),
            "tokens": 1,  # not 0: the separator's tokens are in the stream
        }
        seg = {}
        for name, values in doc.items():
            seg[name] = np.empty(2 * n - 1, np.int64)
            seg[name][0::2], seg[name][1::2] = values, sep[name]
    else:
        seg = doc
    words, edges, nbytes = seg["words"].copy(), seg["edges"].copy(), seg["bytes"].copy()
    if not add_bos:  # the stream's first token is context only: count from after it
        f = int(np.flatnonzero(seg["tokens"] > 0)[0])
        if f % 2 and seg is not doc:  # a separator (the documents before it have no tokens)
            lens = tok.encode_with_bytes([separator])[0][1]
            raw = separator.encode("utf-8")
            cut = int(lens[0])
        else:
            d, head = entry.head()
            cut, raw = head["first_token_bytes"], None
        if raw is not None:
            rest = raw[cut:].decode("utf-8", "ignore")
            after = {
                "words_after": len(rest.split()),
                "starts_after": bool(rest) and not rest[0].isspace(),
            }
        else:
            after = head
        words[:f], nbytes[:f] = 0, 0
        words[f] = after["words_after"]
        edges[f] = (edges[f] & _ENDS) | (_STARTS if after["starts_after"] else 0)
        nbytes[f] = max(0, nbytes[f] - cut)
    kept = nbytes > 0
    kept_edges = edges[kept]
    joins = ((kept_edges[:-1] & _ENDS) > 0) & ((kept_edges[1:] & _STARTS) > 0)
    return int(words[kept].sum() - joins.sum())


def _rolling(entry, tok, vocab_size, seq_len, add_bos, stream_path) -> Plan:
    prefix = protocols.rolling_prefix(tok, vocab_size)
    doc_tokens = entry.doc_array("doc_tokens") + (1 if add_bos else 0)
    num_docs = doc_tokens.size
    offsets = np.concatenate([[0], np.cumsum(doc_tokens)]).astype(np.int64)
    n = int(offsets[-1])
    stream = _Stream(stream_path, n)
    if add_bos:  # BOS before every document, as a separator before the first too
        bos = np.asarray([tok.bos_id], np.int32)
        for ids, _ in _segments(entry, (bos, np.zeros(1, np.int32)), before_first=True):
            stream.write(ids)
    else:  # the parts' ids are the stream
        for ids in entry.token_chunks():
            stream.write(ids)
    digest = stream.close()
    tokens = np.load(stream_path, mmap_mode="r")
    windows = protocols.rolling_windows(tokens, offsets, seq_len, prefix)
    if not windows.num_windows:
        raise DataError(f"the corpus ({num_docs} documents) tokenizes to no tokens.")
    doc_bytes = entry.doc_array("doc_bytes")
    doc_words = entry.doc_array("doc_harness_words")
    return Plan(
        protocol="lm_eval_rolling",
        windows=windows,
        num_bytes=int(doc_bytes.sum()),
        num_words=int(doc_words.sum()),
        num_documents=num_docs,
        text_tokens=n,
        unscored_tokens=0,
        add_bos=add_bos,
        prefix_id=int(prefix),
        doc_bytes=doc_bytes,
        doc_words=doc_words,
        sources=entry.sources,
        doc_starts=offsets[:-1],
        tokens_digest=digest,
    )
