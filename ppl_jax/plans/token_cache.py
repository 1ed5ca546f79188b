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
source (the index of its file and its line: `ppl_jax.data.sources.Sources`). Memory while building
is bounded by one batch of documents, whatever the corpus size, plus 49 bytes per document (typed
arrays, no Python object per document).

Plans are made from an entry by `ppl_jax.plans.stream_plans`.
"""

from __future__ import annotations

import array
import hashlib
import json
import os
import shutil
from typing import Any

import numpy as np

from ppl_jax.data import documents as data
from ppl_jax.errors import ConfigError, DataError, PplJaxError
from ppl_jax.plans.token_entry import (  # noqa: F401  (re-exported: the entry's readers)
    DOC_ARRAYS,
    VERSION,
    Entry,
    Part,
    Verifier,
    damaged,
    open_entry,
    part_names,
)
from ppl_jax.runtime import distributed, fingerprint, preemption, temporaries
from ppl_jax.tokenizer.base import Tokenizer

PROTOCOLS = ("sliding", "lm_eval_rolling")  # protocols whose documents are tokenized one by one
BATCH_CHARS = 1 << 20  # characters of documents per call of the tokenizer's batch encoding
COPY_TOKENS = 1 << 20  # tokens per chunk read from a part (its temporaries: ~50 MB)
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
    # Per document a few typed integers (`array.array`: 8 bytes each, 1 for the edges, 4 for
    # the file index and the line), no Python object per document.
    per_doc = {n: array.array("B" if n == "edges" else "q") for n in DOC_ARRAYS}
    file_index, lines = array.array("I"), array.array("I")
    head, any_text, num_tokens = None, False, 0
    hashes = {"ids": hashlib.sha256(), "bytes": hashlib.sha256()}
    found = data.resolve_paths(ds.path)
    with (
        open(os.path.join(tmp, "ids.bin"), "wb") as ids_file,
        open(os.path.join(tmp, "bytes.bin"), "wb") as bytes_file,
    ):
        texts: list[str] = []

        def flush() -> None:
            nonlocal head, any_text, num_tokens
            encoded = tok.encode_with_bytes(texts)
            for name, f, k in (("ids", ids_file, 0), ("bytes", bytes_file, 1)):
                raw = np.concatenate([np.asarray(e[k], np.int32) for e in encoded]).tobytes()
                f.write(raw)
                hashes[name].update(raw)
            sizes = [e[0].size for e in encoded]
            if head is None:
                for j, (ids, nbytes) in enumerate(encoded):
                    if ids.size:
                        text = texts[j]
                        rest = text.encode("utf-8")[int(nbytes[0]) :].decode("utf-8", "ignore")
                        head = {
                            "doc": len(per_doc["tokens"]) + j,
                            "first_token_bytes": int(nbytes[0]),
                            "words_after": len(rest.split()),
                            "starts_after": bool(rest) and not rest[0].isspace(),
                        }
                        break
            per_doc["tokens"].extend(sizes)
            per_doc["bytes"].extend([len(t.encode("utf-8")) for t in texts])
            words = [len(t.split()) for t in texts]
            edges = [edges_of(t) for t in texts]
            per_doc["words"].extend(words)
            per_doc["harness_words"].extend(map(_harness_words, texts, words, edges))
            per_doc["edges"].extend(edges)
            any_text = any_text or any(not t.isspace() and t for t in texts)
            num_tokens += sum(sizes)
            texts.clear()

        chars = 0
        for text, file, line in data.iter_sourced(
            found, ds.format, ds.errors, ds.jsonl_field, lo, hi
        ):
            texts.append(text)
            file_index.append(file)
            lines.append(line)
            chars += len(text)
            if chars >= BATCH_CHARS:
                flush()
                chars = 0
        if texts:
            flush()
    np.savez(
        os.path.join(tmp, "docs.npz"),
        **{n: np.frombuffer(v, np.uint8 if n == "edges" else np.int64) for n, v in per_doc.items()},
        source_file=np.frombuffer(file_index, np.uint32),
        source_line=np.frombuffer(lines, np.uint32),
    )
    meta = {
        "num_tokens": num_tokens,
        "files": found,
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
