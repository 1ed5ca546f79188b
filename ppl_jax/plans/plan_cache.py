"""A cache of planned datasets: a dataset is read, tokenized and planned once, then memory-mapped.

`data.cache_dir` names a folder; each planned dataset is an entry `<cache_dir>/<key>/` whose key
is the SHA-256 of everything that decides its plan:

- the files (`ppl_jax.runtime.fingerprint.file_identity`: path, size, modification time, or a remote
  store's object version) and how they are read (format, JSONL field, UTF-8 errors, separator,
  preparation, budget);
- the tokenizer's whole description (its vocabulary, merges and rules: `Tokenizer.describe()`)
  and the model's vocabulary size;
- the protocol and its settings (seq_len, stride, BOS policy).

A changed file, tokenizer or setting is another key, so a stale entry is never read (it is left
in the folder). An entry holds the plan's arrays as `.npy` files and its counts and document
names as `plan.json`; the token stream is opened with `numpy.load(mmap_mode="r")`, so a run reads
from the page cache only the rows it fills. An entry is written into a temporary folder and
renamed into place (`os.rename` of a folder is atomic on one filesystem): it is complete or
absent, and two processes writing the same entry at once leave one of them.

The windows of a plan depend on the protocol, so another protocol or seq_len tokenizes again.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
from collections.abc import Callable
from typing import Any

import numpy as np

from ppl_jax.data import documents as data
from ppl_jax.data.sources import Sources
from ppl_jax.data.spec import DatasetSpec
from ppl_jax.errors import DataError, PplJaxError
from ppl_jax.plans import protocols, token_cache
from ppl_jax.plans.protocols import Plan
from ppl_jax.plans.spec import ProtocolSpec
from ppl_jax.plans.windows import Windows
from ppl_jax.runtime import distributed, fingerprint, temporaries
from ppl_jax.tokenizer import Tokenizer

VERSION = 5  # 3: plan.json holds its arrays' digests, checked on load; 4: compact sources; 5:
# whole_documents counts the words after a context-only first token, and max_tokens cuts inside
# the last document
_WINDOW_ARRAYS = ("tokens", "starts", "lengths", "prefix", "first_scored", "document")
_PLAN_ARRAYS = ("doc_bytes", "doc_words", "doc_starts", "window_bytes")
_SCALARS = (
    "protocol",
    "num_bytes",
    "num_words",
    "num_documents",
    "text_tokens",
    "unscored_tokens",
    "add_bos",
    "prefix_id",
    "tokens_digest",
)


def key(ds: DatasetSpec, protocol: ProtocolSpec, tok: Tokenizer, vocab_size: int) -> str:
    """The cache key of a dataset's plan (SHA-256 hex; see the module docstring)."""
    parts = {
        "version": VERSION,
        "files": [
            fingerprint.file_identity(p, ds.fingerprint == "content")
            for p in data.resolve_paths(ds.path)
        ],
        "data": {
            "format": ds.format,
            "jsonl_field": ds.jsonl_field,
            "errors": ds.errors,
            "separator": ds.separator,
            "preparation": ds.preparation,
            "max_documents": ds.max_documents,
            "max_tokens": ds.max_tokens,
            "sample_seed": ds.sample_seed,
        },
        "tokenizer": fingerprint.text_digest(tok.describe()),
        "vocab_size": vocab_size,
        "protocol": {
            "name": protocol.name,
            "seq_len": protocol.seq_len,
            "stride": protocol.stride,
            "add_bos": protocols.resolve_add_bos(protocol.add_bos, tok),
            **protocol.options,
        },
    }
    return fingerprint.digest(parts)


def load(cache_dir: str, entry: str) -> tuple[Plan, dict[str, Any]] | None:
    """The cached plan (its token stream memory-mapped) and the entry's extras, or None when the
    entry is absent or of another version.

    Every array is checked against the digest `plan.json` holds before it is used: the token
    stream (`tokens_digest`, read in chunks with `numpy.fromfile`, so its pages stay out of this
    process's resident memory) and the other arrays' files (SHA-256 of their bytes).

    Raises:
      DataError: an array whose file differs from its digest (edited, truncated or damaged),
        naming the entry's folder.
    """
    folder = os.path.join(cache_dir, entry)
    try:
        with open(os.path.join(folder, "plan.json"), encoding="utf-8") as f:
            meta = json.load(f)
        if meta.get("version") != VERSION:
            return None
        names, digests = list(meta["arrays"]), dict(meta["digests"])
    except (OSError, ValueError, KeyError, TypeError):
        return None  # absent, or not ours: planned again (and written again)
    arrays = {}
    for name in names:
        path = os.path.join(folder, f"{name}.npy")
        try:
            if name == "tokens":
                ok = stream_digest(path) == meta["tokens_digest"]
                arrays[name] = np.load(path, mmap_mode="r") if ok else None
            else:  # hashed from the file in chunks, then read once: no copy of its bytes held
                ok = token_cache.file_digest(path) == digests.get(name)
                arrays[name] = np.load(path) if ok else None
        except (OSError, ValueError) as e:
            raise damaged(folder, f"{name}.npy cannot be read: {e}") from None
        if not ok:
            raise damaged(folder, f"{name}.npy differs from the digest its plan.json holds")
    windows = Windows(**{n: arrays[n] for n in _WINDOW_ARRAYS}, seq_len=meta["seq_len"])
    if "source_files" in meta:  # compact sources (`Sources`): a file index and a line each
        sources: Any = Sources(meta["source_files"], arrays["source_file"], arrays["source_line"])
    else:
        sources = tuple(meta["sources"])
    plan = Plan(
        windows=windows,
        sources=sources,
        **{n: meta[n] for n in _SCALARS},
        **{n: arrays.get(n) for n in _PLAN_ARRAYS},
    )
    return plan, meta.get("extras", {})


def damaged(folder: str, what: str) -> DataError:
    """The error of a plan cache entry whose files do not hold what its `plan.json` says."""
    return DataError(
        f"the plan cache entry {folder} is damaged ({what}); delete that folder and run again "
        f"(the dataset is planned anew)."
    )


def stream_digest(path: str, chunk: int = 1 << 20) -> str:
    """`protocols.tokens_digest` of the `[n] int32` array in the `.npy` file `path`, read
    `chunk` tokens at a time with `numpy.fromfile` (not memory-mapped).

    Raises:
      ValueError: not a `.npy` file of int32, or fewer tokens than its header says.
    """
    h = hashlib.sha256()
    with open(path, "rb") as f:
        major, _ = np.lib.format.read_magic(f)
        read_header = {1: np.lib.format.read_array_header_1_0}.get(
            major, np.lib.format.read_array_header_2_0
        )
        shape, fortran, dtype = read_header(f)
        if dtype != np.dtype(np.int32) or fortran or len(shape) != 1:
            raise ValueError(f"not a token stream ({dtype}, shape {shape})")
        left = shape[0]
        while left:
            part = np.fromfile(f, np.int32, count=min(chunk, left))
            if not part.size:
                raise ValueError(f"{left} of its {shape[0]} tokens are missing")
            h.update(part)
            left -= part.size
    return h.hexdigest()


def save(cache_dir: str, entry: str, plan: Plan, extras: dict[str, Any] | None = None) -> str:
    """Writes the entry (complete or absent); returns its folder. An entry already there (written
    meanwhile by another process) is kept."""
    if plan.tokens_digest is None:
        plan = dataclasses.replace(plan, tokens_digest=protocols.tokens_digest(plan.windows.tokens))
    return _write(cache_dir, entry, lambda tmp: plan, extras)


def save_built(cache_dir: str, entry: str, build: Callable[[str], Plan]) -> str:
    """Writes the entry of the plan `build(tokens_path)` makes, which writes its token stream
    itself into `tokens_path` (a `.npy` inside the entry's temporary folder); see `save`."""
    return _write(cache_dir, entry, lambda tmp: build(os.path.join(tmp, "tokens.npy")), None)


def _write(
    cache_dir: str, entry: str, make: Callable[[str], Plan], extras: dict[str, Any] | None
) -> str:
    final = os.path.join(cache_dir, entry)
    tmp = os.path.join(cache_dir, temporaries.name(entry[:16]))
    try:
        os.makedirs(cache_dir, exist_ok=True)
        if os.path.isdir(final):
            return final
        temporaries.remove_stale(cache_dir)
        os.mkdir(tmp)
        plan = make(tmp)
        w = plan.windows
        arrays = {n: getattr(w, n) for n in _WINDOW_ARRAYS}
        arrays.update({n: getattr(plan, n) for n in _PLAN_ARRAYS if getattr(plan, n) is not None})
        compact = isinstance(plan.sources, Sources)
        if compact:
            arrays.update(source_file=plan.sources.file, source_line=plan.sources.line)
        digests = {}
        for name, array in arrays.items():
            path = os.path.join(tmp, f"{name}.npy")
            if not (name == "tokens" and os.path.exists(path)):  # a stream written by `make`
                np.save(path, np.asarray(array))  # straight to the file, then hashed from it
                if name != "tokens":  # checked by the plan's tokens_digest
                    digests[name] = token_cache.file_digest(path)
        meta = {
            "version": VERSION,
            "seq_len": w.seq_len,
            "arrays": sorted(arrays),
            "digests": digests,
            **(
                {"source_files": list(plan.sources.files)}
                if compact
                else {"sources": list(plan.sources)}
            ),
            "extras": extras or {},
            **{n: _json(getattr(plan, n)) for n in _SCALARS},
        }
        with open(os.path.join(tmp, "plan.json"), "w", encoding="utf-8") as f:
            json.dump(meta, f)
        del plan, w, arrays  # the stream's memory map
        os.rename(tmp, final)
    except BaseException as e:
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(e, OSError) and os.path.isdir(final):  # another writer's entry
            return final
        if isinstance(e, OSError):
            raise token_cache.write_error(cache_dir, "the plan cache", e) from None
        raise
    return final


def made_once(
    cache_dir: str, entry: str, write: Callable[[], Any], what: str
) -> tuple[Plan, dict[str, Any]]:
    """The entry written by process 0 (`write()`, which calls `save` or `save_built`) while the
    others wait, then loaded (memory-mapped) by every process.

    Raises:
      PplJaxError: process 0's own error, on process 0; on the others a DataError that points to
        process 0's log; a DataError where a process does not see the entry (a cache folder that
        is not shared).
    """
    import jax

    error: PplJaxError | None = None
    if jax.process_index() == 0:
        try:
            write()
        except PplJaxError as e:
            error = e
    failed = distributed.flags_of_all(error is not None)
    if error is not None:
        raise error
    if failed[0]:
        raise DataError(
            f"{what}: process 0 could not plan the corpus (its log says why); fix that and run "
            f"again."
        )
    found = load(cache_dir, entry)
    if found is None:
        raise DataError(
            f"data.cache_dir={cache_dir!r}: process {jax.process_index()} does not see the plan "
            f"that process 0 wrote there; on several hosts data.cache_dir must be a folder every "
            f"process sees (a shared filesystem, or a bucket mounted with gcsfuse)."
        )
    return found


def _json(value: Any) -> Any:
    return value.item() if isinstance(value, np.generic) else value


def fields_checked() -> None:
    """Raises AssertionError if `Plan` gained a field this cache does not store (a test calls
    this, so that a new field cannot be silently dropped from cached plans)."""
    stored = set(_SCALARS) | set(_PLAN_ARRAYS) | {"windows", "sources"}
    missing = {f.name for f in dataclasses.fields(Plan)} - stored
    if missing:
        raise AssertionError(f"plan_cache does not store Plan fields {sorted(missing)}")
