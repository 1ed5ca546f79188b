"""`whole_documents`: each document scored in one window, from its first token to its last.

The long-context protocol: a document is one window of up to `seq_len + 1` tokens (set
`eval.seq_len` up to the model's positions), so that a token at position p saw every one of the
p tokens before it in its document, and nothing of another document (short documents share rows
as separate segments). With BOS (`eval.add_bos`) each document's tokens follow a BOS token and
every token is scored; without it the document's first token is context only (counted in
`unscored_tokens`), as the LongPPL reference scores the evaluated model (`add_special_tokens=False`).

A document longer than a window is never cut silently: it is refused in one sentence naming it,
unless `eval.long_documents` names the rule:

- `sliding`: windows of `seq_len` inputs every `eval.stride` tokens within the document
  (`windows.sliding` on the document's tokens): every token scored once, each with at least
  `seq_len - stride + 1` tokens of context from its own document;
- `truncate`: the document's first `seq_len + 1` tokens (BOS included) only; the rest is
  counted in `unscored_tokens` (the LongPPL reference's `--max-length`).

Bytes are the UTF-8 bytes of the scored tokens (so bits per byte are exact). Words are those of
the scored text, each document's own `str.split()` words: with BOS its whole text's, without it
the words after its context-only first token (`words.words_after`; the token cache keeps them
per document). Where a document is truncated they are not counted (0: word perplexity n/a),
since the words before a cut are not in the token cache.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ppl_jax.data.documents import Document
from ppl_jax.data.words import words_after
from ppl_jax.errors import DataError
from ppl_jax.plans import stream_plans
from ppl_jax.plans import windows as windows_lib
from ppl_jax.plans.plan import Plan, check_ids
from ppl_jax.plans.protocols.base import PlanInputs, Protocol
from ppl_jax.plans.windows import Windows

LONG_DOCUMENTS = ("sliding", "truncate")  # the rules `eval.long_documents` may name ("": none)


class WholeDocuments(Protocol):
    name = "whole_documents"
    note = "each document in one window, first token to last (long context)"
    document_level = True
    splits_documents = True
    long_context = True

    def plan(self, docs: list[Document], inputs: PlanInputs, doc_counts: Any = None) -> Plan:
        """`Protocol.plan` (see the module docstring for `inputs.options["long_documents"]`).

        Raises:
          DataError: a document longer than a window and no rule named (naming the document),
            an id outside the vocabulary, or no document with a token to score.
        """
        self._no_counts(doc_counts)
        tokenizer, vocab_size, seq_len = inputs.tokenizer, inputs.vocab_size, inputs.seq_len
        add_bos, long_documents = inputs.add_bos, long_documents_of(inputs)
        encoded = tokenizer.encode_with_bytes([d.text for d in docs])
        bos = [tokenizer.bos_id] if add_bos else []
        ids_parts, byte_parts = [], []
        for d, (doc, (ids, nbytes)) in enumerate(zip(docs, encoded, strict=True)):
            check_ids(ids, vocab_size, f"document {d} ({doc.source})", tokenizer)
            ids_parts += [np.asarray(bos, np.int32), ids]
            byte_parts += [np.zeros(len(bos), np.int32), nbytes]
        sizes = np.asarray([ids.size + len(bos) for ids, _ in encoded], np.int64)
        offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        tokens = np.concatenate([np.zeros(0, np.int32), *ids_parts]).astype(np.int32)
        byte_lens = np.concatenate([np.zeros(0, np.int32), *byte_parts]).astype(np.int64)
        sources = tuple(d.source for d in docs)
        windows = document_windows(tokens, offsets, seq_len, inputs.stride, long_documents, sources)
        scored = windows.scored_token_mask()
        doc_bytes = _per_document(np.where(scored, byte_lens, 0), offsets)
        if add_bos:
            words = np.asarray([len(d.text.split()) for d in docs], np.int64)
        else:
            words = np.asarray(
                [
                    words_after(d.text, int(nb[0])) if nb.size else 0
                    for d, (_, nb) in zip(docs, encoded, strict=True)
                ],
                np.int64,
            )
        words = _counted(words, long_documents, sizes, seq_len)
        return Plan(
            protocol=self.name,
            windows=windows,
            num_bytes=int(doc_bytes.sum()),
            num_words=int(words.sum()),
            num_documents=len(docs),
            text_tokens=int(tokens.size) - len(bos) * len(docs),
            unscored_tokens=int((~scored).sum()) - len(bos) * len(docs),
            add_bos=bool(add_bos),
            prefix_id=None,
            doc_bytes=doc_bytes,
            doc_words=words,
            sources=sources,
            doc_starts=offsets[:-1],
        )

    def stream_plan(self, entry: Any, inputs: PlanInputs, stream_path: str) -> Plan:
        """`Protocol.stream_plan`: the plan from the token cache's entry (`stream_plans`), its
        per-document scored bytes summed while the stream is written."""
        tok, vocab_size, seq_len = inputs.tokenizer, inputs.vocab_size, inputs.seq_len
        add_bos, long_documents = inputs.add_bos, long_documents_of(inputs)
        bos = 1 if add_bos else 0
        sizes = entry.doc_array("doc_tokens").astype(np.int64) + bos
        offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        n = int(offsets[-1])
        # The windows need only the documents' lengths: a stand-in of the stream's length.
        stand_in = np.broadcast_to(np.int32(0), (n,))
        windows = document_windows(
            stand_in, offsets, seq_len, inputs.stride, long_documents, entry.sources
        )
        # Per document, the stream range of its scored targets (one range: windows in order).
        has = np.bincount(windows.document, minlength=sizes.size) > 0
        lo = np.full(sizes.size, -1, np.int64)
        hi = np.full(sizes.size, -1, np.int64)
        first_of = np.unique(windows.document, return_index=True)[1]
        last_of = windows.num_windows - 1 - np.unique(windows.document[::-1], return_index=True)[1]
        lo[has] = (windows.starts + windows.first_scored)[first_of]
        hi[has] = (windows.starts + windows.lengths)[last_of]
        doc_bytes = np.zeros(sizes.size, np.int64)
        stream = stream_plans.Stream(stream_path, n)
        marker = (np.asarray([tok.bos_id], np.int32), np.zeros(1, np.int32)) if bos else None
        at, d = 0, 0
        for ids, lens in stream_plans.segments(entry, marker, (vocab_size, tok), before_first=True):
            stream.write(ids)
            cum = np.concatenate([[0], np.cumsum(lens, dtype=np.int64)])
            end = at + ids.size
            e = int(np.searchsorted(offsets, end, side="right")) - 1  # documents d..e-1 end here
            ds = np.arange(d, e)[has[d:e]]
            doc_bytes[ds] = cum[hi[ds] - at] - cum[lo[ds] - at]
            at, d = end, e
        digest = stream.close()
        tokens = np.load(stream_path, mmap_mode="r")
        windows = windows_lib.Windows(
            tokens=tokens,
            **{f: getattr(windows, f) for f in windows_lib.FIELDS},
            seq_len=seq_len,
        )
        text_tokens = n - bos * sizes.size
        words = entry.doc_array("doc_words" if add_bos else "doc_words_after")
        words = _counted(words, long_documents, sizes, seq_len)
        return Plan(
            protocol=self.name,
            windows=windows,
            num_bytes=int(doc_bytes.sum()),
            num_words=int(words.sum()),
            num_documents=int(sizes.size),
            text_tokens=text_tokens,
            unscored_tokens=text_tokens - int(windows.num_scored().sum()),
            add_bos=bool(add_bos),
            prefix_id=None,
            doc_bytes=doc_bytes,
            doc_words=words,
            sources=entry.sources,
            doc_starts=offsets[:-1],
            tokens_digest=digest,
        )


WHOLE_DOCUMENTS = WholeDocuments()


def long_documents_of(inputs: PlanInputs) -> str:
    """The rule for a document longer than a window (`eval.long_documents`; "": none)."""
    return str(inputs.options.get("long_documents", ""))


def document_windows(
    tokens: np.ndarray,
    offsets: np.ndarray,
    seq_len: int,
    stride: int | None,
    long_documents: str,
    sources: Sequence[str],
) -> Windows:
    """The windows of `whole_documents` over the documents `tokens[offsets[d]:offsets[d + 1]]`
    (BOS already in them), from their lengths alone: one window per document of at least two
    tokens (a document of one token has no target), from row position 1 on; a longer document
    than `seq_len + 1` tokens by the rule `long_documents` (see the module docstring).

    Raises:
      DataError: a document longer than a window without a rule (naming the first such
        document and the rules), or nothing to score.
    """
    sizes = np.diff(offsets)
    short = (sizes >= 2) & (sizes <= seq_len + 1)
    long = np.flatnonzero(sizes > seq_len + 1)
    if long.size and long_documents not in LONG_DOCUMENTS:
        d = int(long[0])
        raise DataError(
            f"document {d} ({sources[d]}) has {int(sizes[d]):,} tokens, more than one window "
            f"of eval.seq_len={seq_len} holds ({long.size} document(s) do); whole_documents "
            f"never cuts a document silently: raise eval.seq_len up to the model's positions, "
            f"or name the rule, eval.long_documents=sliding (windows every eval.stride tokens "
            f"within the document) or truncate (its first {seq_len + 1} tokens)."
        )
    doc = np.flatnonzero(short)
    parts = [(offsets[doc], sizes[doc], np.ones(doc.size, np.int64), doc)]
    for d in long.tolist():
        base, n = int(offsets[d]), int(sizes[d])
        if long_documents == "truncate":
            parts.append(([base], [seq_len + 1], [1], [d]))
            continue
        w = windows_lib.sliding(np.broadcast_to(np.int32(0), (n,)), seq_len, stride)
        parts.append((w.starts + base, w.lengths, w.first_scored, np.full(w.num_windows, d)))
    starts, lengths, first, document = (
        np.concatenate([np.asarray(p[i], np.int64) for p in parts]) for i in range(4)
    )
    order = np.argsort(starts, kind="stable")
    if not order.size:
        raise DataError(
            f"the corpus ({sizes.size} documents) has no document of two tokens or more: "
            f"nothing to score. Check data.path and data.format."
        )
    return windows_lib.make(
        tokens, starts[order], lengths[order], first[order], seq_len, document=document[order]
    )


def _counted(words: np.ndarray, long_documents: str, sizes: np.ndarray, seq_len: int) -> np.ndarray:
    """The documents' scored words, or zeros where a document is truncated (see the module
    docstring)."""
    cut = long_documents == "truncate" and bool((sizes > seq_len + 1).any())
    return np.zeros_like(words) if cut else words


def _per_document(values: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """`[D] int64`: `values[offsets[d]:offsets[d + 1]].sum()` per document (empty ones 0)."""
    cum = np.concatenate([[0], np.cumsum(values, dtype=np.int64)])
    return cum[offsets[1:]] - cum[offsets[:-1]]
