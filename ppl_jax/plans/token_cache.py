"""The token cache: a corpus tokenized once, in shares across processes, in bounded memory.

`data.cache_dir` names a folder shared by every process of a run. For a dataset with no
preparation and no budget, scored by a per-document protocol (`sliding`, `lm_eval_rolling`), the
corpus is tokenized into an entry `<cache_dir>/tokens-<key>/`, whose key is the SHA-256 of the
files (`fingerprint.file_identity`: path, size, modification time or a remote object version),
how they are read (format, JSONL field, UTF-8 errors) and the tokenizer's whole description.
The entry does not depend on the protocol, the separator, BOS or the model: every protocol,
sequence length and checkpoint that reads the same files with the same tokenizer plans from it.

**Shares.** Documents are numbered in file order (`data.count_documents`; one process does not
count them first). With P processes,
process p tokenizes the contiguous block `[p*D/P, (p+1)*D/P)`, read by `data.iter_documents`
and encoded `BATCH_CHARS` characters at a time (the tokenizer's batch encoding,
`Tokenizer.encode_flat_with_bytes`, which cuts a long document into pieces that provably give the
same tokens). It writes its part into a temporary folder renamed into place (complete or absent),
and all processes meet (`multihost_utils.process_allgather` of a status, so that one process's
error stops the others with a message instead of a hang). An entry is the folder holding one
part per process of the run that built it, and `parts.json`, written last.

A part holds flat arrays, appended while tokenizing and read back in chunks (`Part.read`):
`ids.bin` (int32 token ids), `bytes.bin` (int32: the UTF-8 bytes each token covers, for bits per
byte), and per document (a file each, `token_entry.COLUMNS`): tokens, UTF-8 bytes,
whitespace-separated words (`str.split`) of the whole text and of the text after its first token
(scored alone without BOS), the lm-evaluation-harness's words
(`protocols.count_harness_words`), whether it begins and ends with a non-space character (to count
the words of documents joined by a separator exactly), and its source (the index of its file and
its line: `ppl_jax.data.sources.Sources`). The five counts are uint32 (a document of 2^32 tokens,
bytes or words or more turns its part's column into int64). Every array is written batch by
batch as it is tokenized: memory while building is bounded by one batch of documents, whatever
the corpus size, with nothing kept per document.

Plans are made from an entry by the protocols' `stream_plan` (`ppl_jax.plans.stream_plans`).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from typing import Any

import numpy as np

from ppl_jax.data import documents as data
from ppl_jax.data.sources import index_dtype
from ppl_jax.data.words import words_after
from ppl_jax.errors import ConfigError, DataError, PplJaxError
from ppl_jax.plans.token_entry import (  # noqa: F401  (re-exported: the entry's readers)
    COLUMNS,
    COUNTS,
    VERSION,
    Entry,
    Part,
    Verifier,
    damaged,
    file_digest,
    open_entry,
    part_names,
)
from ppl_jax.runtime import distributed, fingerprint, preemption, temporaries
from ppl_jax.tokenizer import Tokenizer

BATCH_CHARS = 1 << 20  # characters of documents per call of the tokenizer's batch encoding
COPY_TOKENS = 1 << 20  # tokens per chunk read from a part (its temporaries: ~50 MB)
STARTS, ENDS = 1, 2  # `edges` bits: the text begins / ends with a non-space character


def applies(ds, protocol) -> bool:
    """Whether a dataset is planned through the token cache (see the module docstring): a cache
    folder, no preparation, no budget, and a protocol (`ppl_jax.plans.protocols.Protocol`) with
    a `stream_plan` (whose documents are tokenized one by one)."""
    return (
        bool(ds.cache_dir)
        and not ds.preparation
        and not ds.has_budget
        and protocol.stream_plan is not None
    )


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


def build_part(
    ds, tok: Tokenizer, folder: str, index: int, count: int, num_documents: int | None
) -> str:
    """Tokenizes share `index` of `count` of the corpus's `num_documents` documents into
    `folder/part-<index>-of-<count>` (complete or absent); returns that folder's name. With one
    share, `num_documents` may be None: the corpus is not counted first.

    Raises:
      DataError: as `data.iter_documents`.
    """
    name = f"part-{index:05d}-of-{count:05d}"
    final = os.path.join(folder, name)
    if os.path.isdir(final):
        return name
    if num_documents is None:
        if count != 1:
            raise ValueError("shares of an uncounted corpus")
        lo, hi = 0, None
    else:
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


class _Column:
    """A document array written to `<name>.bin` batch by batch (`token_entry.COLUMNS`). A count
    column (`widens`) is uint32 until a value does not fit; then what it holds is rewritten as
    int64, once, a chunk at a time, and it goes on in int64."""

    def __init__(self, folder: str, name: str, dtype: str, widens: bool):
        self.path = os.path.join(folder, f"{name}.bin")
        self.dtype, self.widens = np.dtype(dtype), widens
        self.file = open(self.path, "wb")  # closed by `_write_part`

    def append(self, values: Any) -> None:
        """Appends a batch's values (a list or an integer array)."""
        if not len(values):
            return
        if self.widens:
            array = np.asarray(values, np.int64)
            if self.dtype == np.uint32 and int(array.max()) > np.iinfo(np.uint32).max:
                self._widen()
            self.file.write(array.astype(self.dtype, copy=False).tobytes())
        else:
            self.file.write(np.asarray(values, self.dtype).tobytes())

    def _widen(self) -> None:
        self.file.close()
        wide = self.path + ".int64"
        with open(self.path, "rb") as src, open(wide, "wb") as dst:
            while (chunk := np.fromfile(src, np.uint32, count=1 << 20)).size:
                dst.write(chunk.astype(np.int64).tobytes())
        os.replace(wide, self.path)
        self.dtype = np.dtype(np.int64)
        self.file = open(self.path, "ab")

    def summary(self) -> tuple[str, str]:
        """(its dtype's name, the SHA-256 of its file), once its file is closed."""
        return self.dtype.name, file_digest(self.path)


def _write_part(ds, tok: Tokenizer, tmp: str, lo: int, hi: int | None) -> None:
    found = data.resolve_paths(ds.path)
    # Every array goes to its file batch by batch: nothing is kept per document.
    dtypes = {"doc_edges": "uint8", "source_file": index_dtype(len(found)).name}
    columns = {n: _Column(tmp, n, dtypes.get(n, "uint32"), n in COUNTS) for n in COLUMNS}
    head, any_text, num_tokens, done = None, False, 0, 0
    hashes = {"ids": hashlib.sha256(), "bytes": hashlib.sha256()}
    try:
        with (
            open(os.path.join(tmp, "ids.bin"), "wb") as ids_file,
            open(os.path.join(tmp, "bytes.bin"), "wb") as bytes_file,
        ):
            texts: list[str] = []
            sources: tuple[list[int], list[int]] = ([], [])

            def flush() -> None:
                nonlocal head, any_text, num_tokens, done
                ids, nbytes, sizes = tok.encode_flat_with_bytes(texts)
                for name, f, raw in (("ids", ids_file, ids), ("bytes", bytes_file, nbytes)):
                    f.write(raw)
                    hashes[name].update(raw)
                if head is None and ids.size:
                    # The batch's first text with tokens: those before it have none.
                    j = int(np.flatnonzero(sizes)[0])
                    text = texts[j]
                    rest = text.encode("utf-8")[int(nbytes[0]) :].decode("utf-8", "ignore")
                    head = {
                        "doc": done + j,
                        "first_token_bytes": int(nbytes[0]),
                        "words_after": len(rest.split()),
                        "starts_after": bool(rest) and not rest[0].isspace(),
                    }
                words = [len(t.split()) for t in texts]
                edges = [edges_of(t) for t in texts]
                columns["doc_tokens"].append(sizes)
                columns["doc_bytes"].append([len(t.encode("utf-8")) for t in texts])
                columns["doc_words"].append(words)
                columns["doc_harness_words"].append(list(map(_harness_words, texts, words, edges)))
                columns["doc_words_after"].append(_words_after(texts, nbytes, sizes))
                columns["doc_edges"].append(edges)
                columns["source_file"].append(sources[0])
                columns["source_line"].append(sources[1])
                any_text = any_text or any(not t.isspace() and t for t in texts)
                num_tokens += ids.size
                done += len(texts)
                texts.clear()
                sources[0].clear()
                sources[1].clear()

            chars = 0
            for text, file, line in data.iter_sourced(
                found, ds.format, ds.errors, ds.jsonl_field, lo, hi
            ):
                texts.append(text)
                sources[0].append(file)
                sources[1].append(line)
                chars += len(text)
                if chars >= BATCH_CHARS:
                    flush()
                    chars = 0
            if texts:
                flush()
    finally:
        for c in columns.values():
            c.file.close()
    closed = {n: c.summary() for n, c in columns.items()}
    meta = {
        "num_tokens": num_tokens,
        "files": found,
        "head": head,
        "any_text": any_text,
        "documents": [lo, lo + done],
        "dtypes": {n: dtype for n, (dtype, _) in closed.items()},
        "digests": {n: h.hexdigest() for n, h in hashes.items()}
        | {n: digest for n, (_, digest) in closed.items()},
    }
    with open(os.path.join(tmp, "part.json"), "w", encoding="utf-8") as f:
        json.dump(meta, f)


def _words_after(texts: list[str], nbytes: np.ndarray, sizes: np.ndarray) -> list[int]:
    """Per text, the `str.split` words of its text after its first token (its first token's
    bytes, `nbytes` laid end to end with `sizes` tokens per text, cut off; 0 without tokens):
    the words a protocol scores when that token is context only (no BOS)."""
    firsts = np.cumsum(sizes) - sizes
    return [
        words_after(t, int(nbytes[f])) if n else 0
        for t, f, n in zip(texts, firsts.tolist(), sizes.tolist(), strict=True)
    ]


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
    num_documents = _tokenize_share(ds, tok, folder, index, count)
    error: PplJaxError | None = None
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
            if num_documents is None:
                num_documents = _part_documents(os.path.join(folder, names[0]))[1]
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


def _tokenize_share(ds, tok: Tokenizer, folder: str, index: int, count: int) -> int | None:
    """This process's share of the corpus tokenized into its part of `folder` (`build_part`);
    every process learns whether one failed. Returns the corpus's documents when they were
    counted first (several processes), else None (one process: its part counts them).

    Raises:
      PplJaxError: this process's own error (a write error named by `write_error`); DataError
        naming the first other process that failed.
    """
    error: PplJaxError | None = None
    num_documents: int | None = None
    try:
        with preemption.signals_raise(f"tokenizing data {ds.name!r} into {folder}"):
            os.makedirs(folder, exist_ok=True)
            temporaries.remove_stale(folder)
            if count > 1:
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
    return num_documents


def _part_documents(part: str) -> tuple[int, int]:
    """The documents `[lo, hi)` a part's `part.json` says it holds."""
    try:
        with open(os.path.join(part, "part.json"), encoding="utf-8") as f:
            lo, hi = json.load(f)["documents"]
        return int(lo), int(hi)
    except (ValueError, KeyError, TypeError) as e:
        what = f"its {os.path.basename(part)} cannot be read: {e}"
        raise damaged(os.path.dirname(part), what) from None


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
