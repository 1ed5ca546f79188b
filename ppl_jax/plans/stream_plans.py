"""Plans from a token cache's document lengths (`ppl_jax.plans.token_cache`), in bounded memory.

`plan` builds a protocol's `Plan` from an entry: its windows from the
documents' token counts alone, its token stream (with separators and BOS, as `protocols.plan`
lays it out) written chunk by chunk into a plan-cache entry (`ppl_jax.plans.plan_cache`) and
memory-mapped, and its counts from the per-document counts. The result is identical, array for
array, to `protocols.plan` on the same documents (tested). Process 0 writes the plan entry; the
others wait and memory-map it.

The stream is written chunk by chunk (`numpy.lib.format` header, then the data) and its parts
are read with `numpy.fromfile`, not memory-mapped, so that the pages read stay out of the
process's resident memory; windows are computed from the stream's length alone, and each
window's bytes from prefix sums of the byte lengths taken while the stream is written. The
per-document arrays are read and reduced `DOCS_CHUNK` documents at a time; what a plan keeps
per document is its `doc_starts` (int64) and its sources (a file index and a line), and the
token cache's entry is dropped before the plan is read back from its cache.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator

import numpy as np

from ppl_jax.data.spec import DatasetSpec
from ppl_jax.errors import DataError
from ppl_jax.plans import plan_cache, protocols, token_cache
from ppl_jax.plans import windows as windows_lib
from ppl_jax.plans.protocols import Plan
from ppl_jax.plans.spec import ProtocolSpec
from ppl_jax.plans.token_cache import ENDS, STARTS, Entry, edges_of
from ppl_jax.tokenizer import Tokenizer

DOCS_CHUNK = 1 << 16  # documents per chunk of per-document arrays (temporaries of ~10 MB)


def planned(
    ds: DatasetSpec, ev: ProtocolSpec, tok: Tokenizer, vocab_size: int, plan_key: str
) -> Plan:
    """The dataset's plan through the token cache: the corpus tokenized (in shares, unless its
    entry is complete: `token_cache.build`), then the plan written by process 0 into the plan
    cache (`ppl_jax.plans.plan_cache`, entry `plan_key`) and memory-mapped by every process.

    Raises:
      DataError, ConfigError: as `token_cache.build` and `plan`; on the other processes, a
        DataError that points to process 0's log when its planning failed.
    """
    import jax

    # Only process 0 plans. The entry is dropped once it has (`write` returns), before every
    # process reads the plan back: the two are not held at once.
    held = [token_cache.build(ds, tok)]
    if jax.process_index() != 0:
        held.clear()
    add_bos = protocols.resolve_add_bos(ev.add_bos, tok)

    def write() -> None:
        entry = held.pop()
        plan_cache.save_built(
            ds.cache_dir,
            plan_key,
            lambda path: plan(
                entry, ev.protocol, tok, vocab_size, ev.seq_len, ev.stride, add_bos,
                ds.separator, path,
            ),
        )  # fmt: skip

    return plan_cache.made_once(ds.cache_dir, plan_key, write, f"data {ds.name!r}")[0]


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
    if protocol == "sliding":
        return _sliding(entry, tok, vocab_size, seq_len, stride, add_bos, separator, stream_path)
    if protocol == "lm_eval_rolling":
        return _rolling(entry, tok, vocab_size, seq_len, add_bos, stream_path)
    raise ValueError(f"the token cache does not plan {protocol}")


def _segments(
    entry: Entry,
    sep: tuple[np.ndarray, np.ndarray] | None,
    check: tuple[int, Tokenizer],
    before_first: bool = False,
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """The stream's text tokens and byte lengths: the documents' tokens with `sep`'s tokens
    between documents (also before the first with `before_first`), in chunks of whole documents
    of about `token_cache.COPY_TOKENS` tokens. Each chunk's ids are checked against the model's
    vocabulary (`check`: its size and the tokenizer) as they are read, so the cache is read once.

    Raises:
      DataError: an id outside the vocabulary, naming its document.
    """
    vocab_size, tok = check
    first = not before_first
    base = 0  # documents of the parts before this one
    for part in entry.parts:
        verifier = token_cache.Verifier(part)
        d, at = 0, 0  # the chunk's first document and token in the part
        while d < part.num_documents:
            # Documents d..e-1: as many of the next DOCS_CHUNK as fit in COPY_TOKENS (one at least).
            doc_tokens = part.column("doc_tokens", d, d + DOCS_CHUNK)
            ends = np.cumsum(doc_tokens, dtype=np.int64)
            e = d + max(int(np.searchsorted(ends, token_cache.COPY_TOKENS, side="right")), 1)
            lo, hi = at, at + int(ends[e - d - 1])
            ids, lens = part.read("ids", lo, hi), part.read("bytes", lo, hi)
            verifier.update(ids, lens)
            if e == part.num_documents:  # the part's last chunk: all of it was read
                verifier.check()
            bad = np.flatnonzero((ids < 0) | (ids >= vocab_size))
            if bad.size:
                doc = base + d + int(np.searchsorted(ends, bad[0], side="right"))
                where = f"document {doc} ({entry.sources[doc]})"
                protocols.check_ids(ids[bad[:1]], vocab_size, where, tok)
            if sep is not None:
                ids, lens = _with_separators(ids, lens, doc_tokens[: e - d], sep, first)
            first = False
            yield ids, lens
            d, at = e, hi
        if not part.num_documents:
            verifier.check()
        base += part.num_documents


def _with_separators(ids, lens, doc_tokens, sep, first: bool):
    """`ids`/`lens` of consecutive documents (`doc_tokens`: their token counts) with the
    separator's tokens before each document (but the corpus's first). Its temporaries are about
    5 bytes a token (`numpy.insert`: the result and a mask)."""
    starts = np.cumsum(doc_tokens, dtype=np.int64) - doc_tokens  # each document's first token
    before = starts[1:] if first else starts
    where = np.repeat(before, sep[0].size)
    return (
        np.insert(ids, where, np.tile(sep[0], before.size)),
        np.insert(lens, where, np.tile(sep[1], before.size)),
    )


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
        data_ = np.ascontiguousarray(ids, np.int32)  # no copy of an int32 chunk
        self.file.write(data_)
        self.digest.update(data_)
        self.written += ids.size

    def close(self) -> str:
        """The stream's digest. Raises AssertionError where fewer tokens came than its header
        says (the token cache's parts are checked before, so this is a bug, not a damaged file)."""
        self.file.close()
        if self.written != self.n:
            raise AssertionError(f"wrote {self.written} tokens of a stream of {self.n}")
        return self.digest.hexdigest()


def _sliding(entry, tok, vocab_size, seq_len, stride, add_bos, separator, stream_path) -> Plan:
    num_docs = entry.num_documents
    sep = None
    if separator and num_docs > 1:
        sep = tok.encode_with_bytes([separator])[0]
        protocols.check_ids(sep[0], vocab_size, f"data.separator {separator!r}", tok)
    sep_n = 0 if sep is None else sep[0].size
    bos = 1 if add_bos else 0
    text_tokens = entry.num_tokens + sep_n * max(0, num_docs - 1)
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
    for ids, lens in _segments(entry, sep, (vocab_size, tok)):
        stream.write(ids)
        prefix = np.zeros(ids.size + 1, np.int64)
        np.cumsum(lens, dtype=np.int64, out=prefix[1:])
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
        doc_starts=_doc_starts(entry, sep_n, bos),
        window_bytes=window_bytes,
        tokens_digest=digest,
    )


def _doc_starts(entry: Entry, between: int, before: int) -> np.ndarray:
    """`[D] int64`: each document's first position in the stream, `before` (BOS) plus the
    tokens of the documents before it and `between` (a separator's tokens) for each of them;
    computed `DOCS_CHUNK` documents at a time into the result."""
    out = np.empty(entry.num_documents, np.int64)
    at, total = 0, before
    for part in entry.parts:
        for lo in range(0, part.num_documents, DOCS_CHUNK):
            step = part.column("doc_tokens", lo, lo + DOCS_CHUNK).astype(np.int64) + between
            ends = np.cumsum(step) + total
            out[at : at + step.size] = ends - step
            at, total = at + step.size, int(ends[-1])
    return out


def _sliding_words(entry: Entry, tok: Tokenizer, separator: str, add_bos: bool) -> int:
    """Words of the joined text from the first scored token to the end (`protocols._span_words`),
    from the documents' word counts: words(A + B) = words(A) + words(B) - 1 when A ends and B
    begins with a non-space character (`str.split` semantics), over the segments document,
    separator, document, ... Computed `DOCS_CHUNK` documents at a time (the joins across chunks
    carried, each chunk's counts read from the part's files), so that its memory does not grow
    with the corpus."""
    with_sep = bool(separator) and entry.num_documents > 1
    sep = {
        "words": len(separator.split()) if with_sep else 0,
        "edges": edges_of(separator) if with_sep else 0,
        "bytes": len(separator.encode("utf-8")) if with_sep else 0,
    }
    trim = None if add_bos else _first_token_trim(entry, tok, separator if with_sep else "")
    total, last_ends, seen_tokens, first_doc = 0, None, False, True
    for part in entry.parts:
        for lo in range(0, part.num_documents, DOCS_CHUNK):
            hi = min(lo + DOCS_CHUNK, part.num_documents)
            n = hi - lo
            doc = {
                name: part.column(f"doc_{name}", lo, hi).astype(np.int64)
                for name in ("words", "edges", "bytes", "tokens")
            }
            if with_sep:  # a separator before each document but the corpus's first
                lead = 0 if first_doc else 1
                seg = {}
                for name, values in doc.items():
                    sv = 1 if name == "tokens" else sep[name]  # its tokens are in the stream
                    out = np.empty(2 * n - 1 + lead, np.int64)
                    out[lead::2] = values
                    out[1 - lead :: 2] = sv
                    seg[name] = out
                is_sep = np.zeros(2 * n - 1 + lead, bool)
                is_sep[1 - lead :: 2] = True
            else:
                seg = doc
                is_sep = np.zeros(n, bool)
            first_doc = False
            words, edges, nbytes = seg["words"].copy(), seg["edges"].copy(), seg["bytes"].copy()
            if trim is not None and not seen_tokens:
                has = np.flatnonzero(seg["tokens"] > 0)
                f = int(has[0]) if has.size else words.size
                words[:f], nbytes[:f] = 0, 0
                if has.size:
                    after = trim["sep"] if is_sep[f] else trim["doc"]
                    words[f] = after["words_after"]
                    edges[f] = (edges[f] & ENDS) | (STARTS if after["starts_after"] else 0)
                    nbytes[f] = max(0, int(nbytes[f]) - after["cut"])
                    seen_tokens = True
            kept = nbytes > 0
            kept_edges = edges[kept]
            joins = int((((kept_edges[:-1] & ENDS) > 0) & ((kept_edges[1:] & STARTS) > 0)).sum())
            if kept_edges.size and last_ends is not None and last_ends and kept_edges[0] & STARTS:
                joins += 1
            if kept_edges.size:
                last_ends = bool(kept_edges[-1] & ENDS)
            total += int(words[kept].sum()) - joins
    return total


def _first_token_trim(entry: Entry, tok: Tokenizer, separator: str) -> dict:
    """Without BOS the stream's first token is context only: what of its segment follows it,
    `{"doc": {...}, "sep": {...}}` for a first token in a document (its part measured it when it
    was read) or in a separator (the documents before it have no tokens)."""
    found = entry.head()
    doc = None
    if found is not None:
        head = found[1]
        doc = {k: head[k] for k in ("words_after", "starts_after")} | {
            "cut": head["first_token_bytes"]
        }
    out = {"doc": doc, "sep": None}
    if separator:
        cut = int(tok.encode_with_bytes([separator])[0][1][0])
        rest = separator.encode("utf-8")[cut:].decode("utf-8", "ignore")
        out["sep"] = {
            "words_after": len(rest.split()),
            "starts_after": bool(rest) and not rest[0].isspace(),
            "cut": cut,
        }
    return out


def _rolling(entry, tok, vocab_size, seq_len, add_bos, stream_path) -> Plan:
    prefix = protocols.rolling_prefix(tok, vocab_size)
    doc_tokens = entry.doc_array("doc_tokens") + (1 if add_bos else 0)
    num_docs = doc_tokens.size
    offsets = np.concatenate([[0], np.cumsum(doc_tokens)]).astype(np.int64)
    n = int(offsets[-1])
    stream = _Stream(stream_path, n)
    # With BOS, before every document (a separator before the first too); else the parts' ids.
    bos = (np.asarray([tok.bos_id], np.int32), np.zeros(1, np.int32)) if add_bos else None
    for ids, _ in _segments(entry, bos, (vocab_size, tok), before_first=True):
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
