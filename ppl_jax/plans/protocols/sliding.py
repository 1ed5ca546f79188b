"""`sliding` (ppl_jax's native default): documents tokenized one by one and joined by the
tokens of `data.separator` into one stream, with an optional BOS first; see `windows.sliding`.
Every token after the first (every token, with BOS) is scored once.
"""

from __future__ import annotations

import numpy as np

from ppl_jax.data.documents import Document
from ppl_jax.errors import DataError
from ppl_jax.plans import stream_plans
from ppl_jax.plans import windows as windows_lib
from ppl_jax.plans.plan import Plan, check_ids
from ppl_jax.plans.protocols.base import PlanInputs
from ppl_jax.plans.protocols.stream import StreamProtocol
from ppl_jax.plans.token_cache import ENDS, STARTS, Entry, edges_of
from ppl_jax.plans.windows import Windows
from ppl_jax.tokenizer import Tokenizer


class Sliding(StreamProtocol):
    name = "sliding"
    note = "ppl_jax native: every token after the first scored once, stride windows"
    strided = True

    def between(self, separator: str) -> str:
        return separator

    def encode(
        self, docs: list[Document], inputs: PlanInputs
    ) -> tuple[str, list[np.ndarray], list[np.ndarray], list[int]]:
        """The documents tokenized one by one, the separator's tokens between them."""
        tokenizer, vocab_size, separator = inputs.tokenizer, inputs.vocab_size, inputs.separator
        texts = [d.text for d in docs]
        encoded = tokenizer.encode_with_bytes(texts)
        sep = tokenizer.encode_with_bytes([separator])[0] if separator and len(docs) > 1 else None
        ids_parts, byte_parts, doc_starts = [], [], []
        offset = 0
        for i, (doc, (ids, nbytes)) in enumerate(zip(docs, encoded, strict=True)):
            check_ids(ids, vocab_size, f"document {i} ({doc.source})", tokenizer)
            if i and sep is not None:
                ids_parts.append(sep[0])
                byte_parts.append(sep[1])
                offset += sep[0].size
            doc_starts.append(offset)
            ids_parts.append(ids)
            byte_parts.append(nbytes)
            offset += ids.size
        if sep is not None:
            check_ids(sep[0], vocab_size, f"data.separator {separator!r}", tokenizer)
        text = separator.join(texts) if separator else "".join(texts)
        return text, ids_parts, byte_parts, doc_starts

    def check_length(self, n: int, num_docs: int, seq_len: int) -> None:
        if n < 2:
            raise DataError(
                f"the corpus ({num_docs} documents) tokenizes to {n} token(s); at least two are "
                f"needed to score one. Check data.path and data.format."
            )

    def windows(self, tokens: np.ndarray, seq_len: int, stride: int | None) -> Windows:
        return windows_lib.sliding(tokens, seq_len, stride)

    def stream_plan(self, entry: Entry, inputs: PlanInputs, stream_path: str) -> Plan:
        """`Protocol.stream_plan`: the plan from the token cache's entry (`stream_plans`)."""
        tok, vocab_size, separator = inputs.tokenizer, inputs.vocab_size, inputs.separator
        seq_len, stride, add_bos = inputs.seq_len, inputs.stride, inputs.add_bos
        num_docs = entry.num_documents
        sep = None
        if separator and num_docs > 1:
            sep = tok.encode_with_bytes([separator])[0]
            check_ids(sep[0], vocab_size, f"data.separator {separator!r}", tok)
        sep_n = 0 if sep is None else sep[0].size
        bos = 1 if add_bos else 0
        text_tokens = entry.num_tokens + sep_n * max(0, num_docs - 1)
        n = bos + text_tokens
        self.check_length(n, num_docs, seq_len)
        # The windows need only the stream's length: a stand-in of that length holds no memory.
        windows = windows_lib.sliding(np.broadcast_to(np.int32(0), (n,)), seq_len, stride)
        lo = windows.starts + windows.first_scored  # scored targets [lo, hi) (no prefix tokens)
        hi = windows.starts + windows.lengths
        window_bytes, digest = _write_stream(entry, inputs, sep, n, lo, hi, stream_path)
        scored = int(windows.num_scored().sum())
        tokens = np.load(stream_path, mmap_mode="r")
        windows = windows_lib.Windows(
            tokens=tokens,
            **{f: getattr(windows, f) for f in windows_lib.FIELDS},
            seq_len=seq_len,
        )
        return Plan(
            protocol=self.name,
            windows=windows,
            num_bytes=int(window_bytes.sum()),
            num_words=_sliding_words(
                entry, tok, separator if sep is not None else "", add_bos, sep_n
            ),
            num_documents=num_docs,
            text_tokens=text_tokens,
            unscored_tokens=text_tokens - scored,
            add_bos=bool(add_bos),
            prefix_id=None,
            doc_bytes=None,
            doc_words=None,
            sources=entry.sources,
            doc_starts=stream_plans.doc_starts(entry, sep_n, bos),
            window_bytes=window_bytes,
            tokens_digest=digest,
        )


def _write_stream(
    entry: Entry,
    inputs: PlanInputs,
    sep: tuple[np.ndarray, np.ndarray] | None,
    n: int,
    lo: np.ndarray,
    hi: np.ndarray,
    stream_path: str,
) -> tuple[np.ndarray, str]:
    """Writes the stream of `n` tokens (BOS, the documents and `sep`'s ids between them) to
    `stream_path`, summing its byte lengths at every window bound meanwhile: returns each
    window's scored bytes (`[W] int64`, targets `[lo, hi)`) and the stream's digest."""
    tok = inputs.tokenizer
    bounds = np.concatenate([lo, hi])
    order = np.argsort(bounds, kind="stable")
    ordered = bounds[order]
    cum = np.zeros(bounds.size, np.int64)
    at, total, k = 0, 0, 0
    stream = stream_plans.Stream(stream_path, n)
    if inputs.add_bos:
        stream.write(np.asarray([tok.bos_id], np.int32))
        at = 1
    for ids, lens in stream_plans.segments(entry, sep, (inputs.vocab_size, tok)):
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
    return cum[lo.size :] - cum[: lo.size], stream.close()


def _sliding_words(
    entry: Entry, tok: Tokenizer, separator: str, add_bos: bool, sep_tokens: int
) -> int:
    """Words of the joined text from the first scored token to the end (`plan.span_words`), from
    the documents' word counts: words(A + B) = words(A) + words(B) - 1 when A ends and B
    begins with a non-space character (`str.split` semantics), over the segments document,
    separator, document, ... Computed `stream_plans.DOCS_CHUNK` documents at a time (the joins across chunks
    carried, each chunk's counts read from the part's files), so that its memory does not grow
    with the corpus."""
    with_sep = bool(separator) and entry.num_documents > 1  # `sep_tokens`: its tokens (0 for a
    # separator of spaces that a word-level tokenizer drops)
    sep = {
        "words": len(separator.split()) if with_sep else 0,
        "edges": edges_of(separator) if with_sep else 0,
        "bytes": len(separator.encode("utf-8")) if with_sep else 0,
    }
    trim = None if add_bos else _first_token_trim(entry, tok, separator if sep_tokens else "")
    total, last_ends, seen_tokens, first_doc = 0, None, False, True
    for part in entry.parts:
        chunk = stream_plans.DOCS_CHUNK
        for lo in range(0, part.num_documents, chunk):
            hi = min(lo + chunk, part.num_documents)
            n = hi - lo
            doc = {
                name: part.column(f"doc_{name}", lo, hi).astype(np.int64)
                for name in ("words", "edges", "bytes", "tokens")
            }
            if with_sep:  # a separator before each document but the corpus's first
                lead = 0 if first_doc else 1
                seg = {}
                for name, values in doc.items():
                    sv = sep_tokens if name == "tokens" else sep[name]  # in the stream
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


SLIDING = Sliding()
