"""A protocol's plan (`Plan`: the windows it scores and the counts it reports) and what every
protocol shares: the BOS policy (`resolve_add_bos`), the vocabulary check (`check_ids`), the
bytes of window spans (`window_spans`) and the digests of what a plan scores (`tokens_digest`,
`plan_digest`). The protocols themselves are `ppl_jax.plans.protocols`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from ppl_jax.data.words import count_words
from ppl_jax.errors import ConfigError, DataError
from ppl_jax.plans.windows import Windows
from ppl_jax.tokenizer import Tokenizer


@dataclasses.dataclass(frozen=True)
class Plan:
    """What a protocol scores, and the counts it reports.

    Attributes:
      protocol: its name.
      windows: the windows to score.
      num_bytes, num_words: of the scored text, by the protocol's convention.
      num_documents: documents in the corpus.
      text_tokens: tokens of the text (no BOS/prefix tokens).
      unscored_tokens: tokens of the text the convention leaves unscored.
      add_bos: whether a BOS token was placed before the stream.
      prefix_id: lm_eval_rolling's prefix token, else None.
      doc_bytes, doc_words: `[num_documents] int64` per-document counts (document protocols).
      describe_window: names a window's place in the corpus, for messages.
      window_bytes: `[W] int64`, UTF-8 bytes of each window's scored tokens (the stream
        protocols, whose windows score disjoint tokens: they add up to `num_bytes`); None for
        `lm_eval_rolling`, whose bytes are per document (`doc_bytes`).
      tokens_digest: `tokens_digest(windows.tokens)`, when it was computed as the stream was
        written (a cached plan's), so that `plan_digest` need not read a memory-mapped stream.
    """

    protocol: str
    windows: Windows
    num_bytes: int
    num_words: int
    num_documents: int
    text_tokens: int
    unscored_tokens: int
    add_bos: bool
    prefix_id: int | None
    doc_bytes: np.ndarray | None
    doc_words: np.ndarray | None
    sources: Sequence[str]
    doc_starts: np.ndarray  # `[num_documents]` offset of each document's first token
    window_bytes: np.ndarray | None = None
    tokens_digest: str | None = None

    @property
    def per_document(self) -> bool:
        return self.doc_bytes is not None

    def describe_window(self, k: int) -> str:
        w = self.windows
        if w.document[k] >= 0:
            d = int(w.document[k])
            return f"window {k}, document {d} ({self.sources[d]})"
        offset = int(w.starts[k])
        d = max(0, int(np.searchsorted(self.doc_starts, offset, side="right")) - 1)
        return f"window {k}, document {d} ({self.sources[d]}), token {offset - self.doc_starts[d]}"


def resolve_add_bos(setting: str, tokenizer: Tokenizer) -> bool:
    """`eval.add_bos`: `auto` follows the tokenizer's configuration; `true`; `false`.

    Raises:
      ConfigError: `true` with a tokenizer that has no BOS token, or another value.
    """
    setting = str(setting).lower()
    if setting == "auto":
        return bool(tokenizer.add_bos_default and tokenizer.bos_id is not None)
    if setting == "true":
        if tokenizer.bos_id is None:
            raise ConfigError(
                f"eval.add_bos=true, but the tokenizer ({tokenizer.name}) has no BOS token; "
                f"set eval.add_bos=false or auto."
            )
        return True
    if setting == "false":
        return False
    raise ConfigError(f"eval.add_bos={setting!r} is not one of auto, true, false.")


def check_ids(ids: np.ndarray, vocab_size: int, where: str, tokenizer: Tokenizer) -> None:
    """Raises DataError naming `where` if an id of `ids` is outside `[0, vocab_size)`."""
    if ids.size and (ids.min() < 0 or ids.max() >= vocab_size):
        bad = int(ids[(ids < 0) | (ids >= vocab_size)][0])
        raise DataError(
            f"{where}: token id {bad} is outside the model's vocabulary of {vocab_size}. The "
            f"tokenizer ({tokenizer.name}, {tokenizer.vocab_size} ids) does not match the model; "
            f"use the checkpoint's own (data.tokenizer=auto)."
        )


def span_words(raw: bytes, byte_lens: np.ndarray, scored: np.ndarray) -> int:
    """Words of the text from the first to the last scored token (byte_lens: `[N]` per token).

    A last scored token that is the stream's last runs to the end of `raw`: a separator that
    tokenizes to nothing (a word-level tokenizer's "\n\n") has no token to count its bytes,
    and the span would end that many bytes early."""
    idx = np.flatnonzero(scored)
    if not idx.size:
        return 0
    lo = int(byte_lens[: idx[0]].sum(dtype=np.int64))
    hi = lo + int(byte_lens[idx[0] : idx[-1] + 1].sum(dtype=np.int64))
    if idx[-1] == byte_lens.size - 1:
        hi = len(raw)
    return count_words(raw, lo, hi)


def window_spans(values: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """`[W] int64`: `values[lo[k]:hi[k]].sum()` per window, for the ascending, disjoint,
    non-empty token ranges `[lo, hi)` of the stream protocols' scored targets (no prefix token,
    so row position `j` is token `starts + j`). Without a cumulative copy of `values`.

    Raises:
      ValueError: ranges that are empty, overlap or go backwards.
    """
    if not lo.size:
        return np.zeros(0, np.int64)
    if (hi <= lo).any() or (lo[1:] < hi[:-1]).any() or lo[0] < 0 or hi[-1] > values.size:
        raise ValueError("window spans must be ascending, disjoint and non-empty")
    cuts = np.stack([lo, hi], axis=1).ravel()
    if cuts[-1] == values.size:  # reduceat sums the last cut to the end of the array
        cuts = cuts[:-1]
    return np.add.reduceat(values, cuts, dtype=np.int64)[0::2]


def join_ids(parts: list[np.ndarray]) -> np.ndarray:
    """The int32 concatenation of `parts`, without a copy when only one is not empty."""
    full = [p for p in parts if p.size]
    if len(full) == 1:
        return full[0].astype(np.int32, copy=False)
    return np.concatenate(parts).astype(np.int32, copy=False)


def tokens_digest(tokens: np.ndarray, chunk: int = 1 << 22) -> str:
    """SHA-256 (hex) of a token stream's int32 bytes, read `chunk` tokens at a time."""
    import hashlib

    h = hashlib.sha256()
    for at in range(0, tokens.size, chunk):
        h.update(np.ascontiguousarray(tokens[at : at + chunk], np.int32).tobytes())
    return h.hexdigest()


def plan_digest(p: Plan, batch_size: int | None = None) -> str:
    """SHA-256 (hex) of what a plan scores: its token stream (`tokens_digest`), every window's
    slice, prefix, first scored position and document, and its byte and word counts (plus the
    batch size, if given). Two processes that read the same text with the same settings get the
    same digest, whatever their files' paths or modification times."""
    import hashlib

    w = p.windows
    h = hashlib.sha256()
    h.update((p.tokens_digest or tokens_digest(w.tokens)).encode())
    for array in (w.starts, w.lengths, w.prefix, w.first_scored, w.document):
        h.update(np.ascontiguousarray(array).tobytes())
    h.update(f"{p.protocol} {w.seq_len} {p.num_bytes} {p.num_words} {batch_size}".encode())
    return h.hexdigest()
