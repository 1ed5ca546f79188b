"""The token stream and the `sliding` window protocol, batched in fixed shapes.

Protocol `sliding` (ppl_jax's native default): the documents, joined by `data.separator`, form one
token stream `t[0..N-1]`. Window `k` feeds the model the tokens `t[k*S : k*S + L]` (at most `L =
eval.seq_len` tokens, `S = eval.stride`) and predicts each next token, so it covers the targets
`t[k*S + 1 : k*S + L + 1]`. Of these it scores only the targets no earlier window scored: window 0
scores targets 1..L, window k > 0 scores targets `(k-1)*S + L + 1 .. k*S + L`. Hence

- every token after the first is scored exactly once (the first has no context);
- a scored token sees at least `L - S + 1` tokens of context, or every token before it;
- the last window may be partial: it is padded and masked, never dropped.

There are `1 + ceil(max(0, N - 1 - L) / S)` windows. With `S = L` this is the disjoint-window
convention; with `S < L` it is the strided evaluation of the Hugging Face guide "Perplexity of
fixed-length models", without its unscored window boundaries.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from ppl_jax.data import Document
from ppl_jax.errors import DataError
from ppl_jax.tokenizer import Tokenizer


@dataclasses.dataclass(frozen=True)
class Stream:
    """The corpus as one token stream, with the size of the text it scores.

    Attributes:
      tokens: `[N] int32` token ids.
      text_bytes: UTF-8 bytes of the whole stream text (documents plus separators).
      num_bytes: UTF-8 bytes of the scored text (the stream text after the first token).
      num_words: whitespace-separated words of the scored text.
      num_documents: documents in the corpus.
      doc_starts: `[num_documents] int64`, the stream offset of each document's first token.
      sources: where each document came from (see `Document.source`).
    """

    tokens: np.ndarray
    text_bytes: int
    num_bytes: int
    num_words: int
    num_documents: int
    doc_starts: np.ndarray
    sources: tuple[str, ...]

    def describe_offset(self, offset: int) -> str:
        """Names the document holding stream token `offset`, for messages."""
        i = max(0, int(np.searchsorted(self.doc_starts, offset, side="right")) - 1)
        return f"document {i} ({self.sources[i]}), token {offset - int(self.doc_starts[i])}"


def build_stream(docs: list[Document], tokenizer: Tokenizer, separator: str,
                 vocab_size: int) -> Stream:
    """Tokenizes each document and joins them with the separator's tokens.

    Documents are tokenized one by one, so no token spans two documents; the separator is
    tokenized once on its own.

    Raises:
      DataError: a token id outside `[0, vocab_size)` (naming the document, the id and the
        model's vocabulary), or fewer than two tokens in all (nothing to predict).
    """
    texts = [d.text for d in docs]
    ids = tokenizer.encode(texts)
    sep_ids = tokenizer.encode([separator])[0] if separator and len(docs) > 1 else None
    pieces: list[np.ndarray] = []
    doc_starts: list[int] = []
    offset = 0
    for i, (doc, doc_ids) in enumerate(zip(docs, ids, strict=True)):
        if doc_ids.size and (doc_ids.min() < 0 or doc_ids.max() >= vocab_size):
            bad = int(doc_ids[(doc_ids < 0) | (doc_ids >= vocab_size)][0])
            raise DataError(
                f"document {i} ({doc.source}): token id {bad} is outside the model's vocabulary "
                f"of {vocab_size}. The tokenizer ({tokenizer.name}, {tokenizer.vocab_size} ids) "
                f"does not match the model; use the checkpoint's own (data.tokenizer=auto)."
            )
        if i and sep_ids is not None:
            pieces.append(sep_ids)
            offset += sep_ids.size
        doc_starts.append(offset)
        pieces.append(doc_ids)
        offset += doc_ids.size
    tokens = np.concatenate(pieces) if pieces else np.zeros((0,), np.int32)
    if sep_ids is not None and sep_ids.size and sep_ids.max() >= vocab_size:
        raise DataError(f"data.separator {separator!r} tokenizes to ids beyond the vocabulary.")
    if tokens.size < 2:
        raise DataError(
            f"the corpus ({len(docs)} documents) tokenizes to {tokens.size} token(s); at least "
            f"two are needed to score one. Check data.path and data.format."
        )
    text = separator.join(texts) if separator else "".join(texts)
    raw = text.encode("utf-8")
    # The stream's first token is the first token of its first non-empty piece (documents and
    # separators are tokenized apart, so it cannot merge across a boundary).
    pieces_text = [t for i, d in enumerate(texts) for t in ((separator, d) if i else (d,))]
    first = tokenizer.first_token_bytes(next(t for t in pieces_text if t))
    scored = raw[first:].decode("utf-8", errors="ignore")
    return Stream(
        tokens=tokens.astype(np.int32),
        text_bytes=len(raw),
        num_bytes=len(raw) - first,
        num_words=len(scored.split()),
        num_documents=len(docs),
        doc_starts=np.asarray(doc_starts, np.int64),
        sources=tuple(d.source for d in docs),
    )


@dataclasses.dataclass(frozen=True)
class SlidingWindows:
    """Windows of the `sliding` protocol over a stream (see the module docstring).

    Rows of a batch hold `seq_len + 1` tokens: the model reads positions `0..seq_len-1` and
    position `j + 1` is the target of position `j`; the scorer makes that shift.
    """

    tokens: np.ndarray  # [N] int32
    seq_len: int
    stride: int

    def window_start(self, k: int) -> int:
        """Stream offset of window `k`'s first input token."""
        return k * self.stride

    @property
    def num_windows(self) -> int:
        n = self.tokens.size
        return 1 + math.ceil(max(0, n - 1 - self.seq_len) / self.stride)

    def num_batches(self, batch_size: int) -> int:
        return math.ceil(self.num_windows / batch_size)

    def rows(self, window_ids: np.ndarray) -> dict[str, np.ndarray]:
        """The batch rows for the given windows; an id at or past `num_windows` is padding.

        Returns:
          `tokens: [R, seq_len + 1] int32`; `target_mask: [R, seq_len + 1] bool`, true where the
          token is a scored target (never at position 0); `segment_ids: [R, seq_len + 1] int32`,
          1 for real tokens and 0 for padding; `positions: [R, seq_len + 1] int32`.
        """
        L, S = self.seq_len, self.stride
        r = len(window_ids)
        tokens = np.zeros((r, L + 1), np.int32)
        target_mask = np.zeros((r, L + 1), bool)
        segment_ids = np.zeros((r, L + 1), np.int32)
        num_windows = self.num_windows
        for row, k in enumerate(window_ids):
            if k >= num_windows:
                continue
            start = int(k) * S
            chunk = self.tokens[start : start + L + 1]
            tokens[row, : chunk.size] = chunk
            segment_ids[row, : chunk.size] = 1
            first_scored = 1 if k == 0 else L - S + 1
            target_mask[row, first_scored : chunk.size] = True
        positions = np.broadcast_to(np.arange(L + 1, dtype=np.int32), (r, L + 1)).copy()
        return {
            "tokens": tokens,
            "target_mask": target_mask,
            "segment_ids": segment_ids,
            "positions": positions,
        }
