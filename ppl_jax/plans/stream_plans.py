"""Plans from a token cache's document lengths (`ppl_jax.plans.token_cache`), in bounded memory:
what the protocols' `stream_plan`s share (`ppl_jax.plans.protocols`).

A protocol's `stream_plan` builds its `Plan` from an entry: its windows from the documents' token
counts alone, its token stream (with separators and BOS, as the protocol's `plan` lays it out)
written chunk by chunk into a plan-cache entry (`ppl_jax.plans.plan_cache`) and memory-mapped, and
its counts from the per-document counts. The result is identical, array for array, to the
protocol's `plan` on the same documents (tested). Process 0 writes the plan entry; the others wait
and memory-map it (`ppl_jax.plans.planner.streamed`).

The stream is written chunk by chunk (`numpy.lib.format` header, then the data: `Stream`) and its
parts are read with `numpy.fromfile`, not memory-mapped (`segments`), so that the pages read stay
out of the process's resident memory; windows are computed from the stream's length alone, and
each window's bytes from prefix sums of the byte lengths taken while the stream is written. The
per-document arrays are read and reduced `DOCS_CHUNK` documents at a time; what a plan keeps per
document is its `doc_starts` (int64) and its sources (a file index and a line), and the token
cache's entry is dropped before the plan is read back from its cache.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator

import numpy as np

from ppl_jax.plans import token_cache
from ppl_jax.plans.plan import check_ids
from ppl_jax.plans.token_entry import Entry
from ppl_jax.tokenizer import Tokenizer

DOCS_CHUNK = 1 << 16  # documents per chunk of per-document arrays (temporaries of ~10 MB)


def segments(
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
                check_ids(ids[bad[:1]], vocab_size, where, tok)
            if sep is not None:
                ids, lens = with_separators(ids, lens, doc_tokens[: e - d], sep, first)
            first = False
            yield ids, lens
            d, at = e, hi
        if not part.num_documents:
            verifier.check()
        base += part.num_documents


def with_separators(ids, lens, doc_tokens, sep, first: bool):
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


class Stream:
    """A `.npy` file of `[n] int32` written chunk by chunk (`numpy.lib.format` header, then the
    data), with the SHA-256 of its data (`ppl_jax.plans.plan.tokens_digest`)."""

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


def doc_starts(entry: Entry, between: int, before: int) -> np.ndarray:
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
