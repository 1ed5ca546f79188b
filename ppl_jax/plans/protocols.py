"""Named evaluation protocols: which tokens are scored, with what context, and what is counted.

Each protocol turns documents into `Windows` plus the counts its convention reports. Every
protocol scores its windows the same way (batched, padded, masked); they differ only in slicing.

- `sliding` (native default): documents tokenized one by one and joined by the tokens of
  `data.separator` into one stream, with an optional BOS first; see `windows.sliding`. Every token
  after the first (every token, with BOS) is scored once.
- `hf_strided`: the Hugging Face transformers guide "Perplexity of fixed-length models": documents
  joined with "\\n\\n" and tokenized as one string; windows of `seq_len` tokens begin every
  `stride` tokens; inside each window the labels of tokens already scored are -100. Counted tokens
  are the labels actually scored (not the guide's `trg_len` approximation).
- `lm_eval_rolling`: lm-evaluation-harness `loglikelihood_rolling` (`get_rolling_token_windows`
  with `context_len=1`, then `make_disjoint_window`), per document: the prefix token (BOS if the
  tokenizer has one, else EOS) predicts the first token; disjoint windows of `seq_len`
  predictions with one token of context; the last window extended to the left to a full window.
  Words are `len(re.split(r"\\s+", doc))` and bytes the document's UTF-8 length, as the harness's
  wikitext task counts them.
- `gptq_chunks`: the GPTQ/AWQ evaluation: documents joined with "\\n\\n", tokenized as one string,
  cut into `n // seq_len` chunks (the tail dropped), each scored from its second token.

Bytes are those of the scored tokens (per-token UTF-8 lengths from the tokenizer) except for
`lm_eval_rolling`, which follows the harness. Words are those of the text from the first to the
last scored token (for `sliding` and `lm_eval_rolling` exactly the scored text).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from ppl_jax.data.documents import Document
from ppl_jax.data.words import WORD_CHUNK, count_harness_words, count_words  # noqa: F401
from ppl_jax.errors import ConfigError, DataError
from ppl_jax.plans import windows as windows_lib
from ppl_jax.plans.spec import PROTOCOLS
from ppl_jax.plans.windows import Windows
from ppl_jax.tokenizer import Tokenizer

JOIN = "\n\n"  # how hf_strided and gptq_chunks join documents (their reference recipes' choice)


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


def _span_words(raw: bytes, byte_lens: np.ndarray, scored: np.ndarray) -> int:
    """Words of the text from the first to the last scored token (byte_lens: `[N]` per token)."""
    idx = np.flatnonzero(scored)
    if not idx.size:
        return 0
    lo = int(byte_lens[: idx[0]].sum(dtype=np.int64))
    hi = lo + int(byte_lens[idx[0] : idx[-1] + 1].sum(dtype=np.int64))
    return count_words(raw, lo, hi)


def plan(
    protocol: str,
    docs: list[Document],
    tokenizer: Tokenizer,
    vocab_size: int,
    seq_len: int,
    stride: int | None,
    add_bos: bool,
    separator: str = JOIN,
    doc_counts: tuple[np.ndarray, np.ndarray] | None = None,
) -> Plan:
    """Builds the windows and counts of `protocol` for `docs`.

    Args:
      protocol: one of `PROTOCOLS`.
      docs: the corpus.
      tokenizer: the model's tokenizer (special tokens are never added by encoding; BOS and the
        prefix token are placed by the protocol).
      vocab_size: the model's vocabulary; every token id is checked against it.
      seq_len: the model inputs per window; stride: for `sliding` and `hf_strided` (None for the others).
      add_bos: BOS before the stream (`sliding`, `hf_strided`, `gptq_chunks`), or before each
        document's tokens (`lm_eval_rolling`, as the harness's `tok_encode` does when the
        tokenizer adds BOS; the prefix token comes before that).
      separator: the text between documents for `sliding` (the others use "\\n\\n").
      doc_counts: `([num_documents] int64, [num_documents] int64)`: UTF-8 bytes and words to
        report per document in place of those of its text (`lm_eval_rolling` only), for a
        preparation that scores a rewritten text and counts the original, as the harness's
        wikitext task does (`preparations.Prepared.doc_counts`).

    Raises:
      DataError: an id outside the vocabulary (naming the document), or nothing to score.
      ConfigError: `lm_eval_rolling` with a tokenizer that has neither BOS nor EOS.
      ValueError: `doc_counts` with another protocol, or not one count per document (a bug of
        the caller: `preparations.check` rejects such a configuration first).
    """
    if protocol not in PROTOCOLS:
        raise ConfigError(f"eval.protocol={protocol!r} is not one of {', '.join(PROTOCOLS)}.")
    if protocol == "lm_eval_rolling":
        return _lm_eval_rolling(docs, tokenizer, vocab_size, seq_len, add_bos, doc_counts)
    if doc_counts is not None:
        raise ValueError(
            f"doc_counts are per document: only lm_eval_rolling reports them, not {protocol}"
        )
    texts = [d.text for d in docs]
    bos = [tokenizer.bos_id] if add_bos else []
    if protocol == "sliding":
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
    else:
        text = JOIN.join(texts)
        ids, nbytes = tokenizer.encode_with_bytes([text])[0]
        check_ids(
            ids, vocab_size, f"the corpus joined with '\\n\\n' ({len(docs)} documents)", tokenizer
        )
        ids_parts, byte_parts = [ids], [nbytes]
        starts_chars = np.cumsum([0] + [len(t.encode()) + 2 for t in texts[:-1]])
        doc_starts = list(
            np.searchsorted(np.cumsum(nbytes, dtype=np.int64), starts_chars, side="right")
        )
    # Bounded memory for long corpora: int32 arrays, and no copy where one part suffices.
    text_ids = _join([np.zeros(0, np.int32), *ids_parts])
    token_bytes = _join([np.zeros(0, np.int32), *byte_parts])
    tokens = _join([np.asarray(bos, np.int32), text_ids])
    byte_lens = _join([np.zeros(len(bos), np.int32), token_bytes])
    n = tokens.size
    if protocol == "sliding":
        if n < 2:
            raise DataError(
                f"the corpus ({len(docs)} documents) tokenizes to {n} token(s); at least two are "
                f"needed to score one. Check data.path and data.format."
            )
        windows = windows_lib.sliding(tokens, seq_len, stride)
    elif protocol == "hf_strided":
        if n < 2:
            raise DataError(f"the corpus tokenizes to {n} token(s); nothing to score.")
        windows = _hf_strided(tokens, seq_len, stride)
    else:
        if n < seq_len:
            raise DataError(
                f"gptq_chunks: the corpus has {n} tokens, fewer than one chunk of "
                f"eval.seq_len={seq_len}; use a shorter seq_len or more text."
            )
        count = n // seq_len
        windows = windows_lib.make(
            tokens, np.arange(count) * seq_len, np.full(count, seq_len), np.ones(count), seq_len
        )
    scored = windows.scored_token_mask()
    raw = text.encode("utf-8")
    return Plan(
        protocol=protocol,
        windows=windows,
        num_bytes=int(byte_lens[scored].sum()),
        num_words=_span_words(raw, byte_lens, scored),
        num_documents=len(docs),
        text_tokens=int(text_ids.size),
        unscored_tokens=int(text_ids.size - scored[len(bos) :].sum()),
        add_bos=bool(bos),
        prefix_id=None,
        doc_bytes=None,
        doc_words=None,
        sources=tuple(d.source for d in docs),
        doc_starts=np.asarray(doc_starts, np.int64) + len(bos),
        window_bytes=window_spans(
            byte_lens, windows.starts + windows.first_scored, windows.starts + windows.lengths
        ),
    )


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


def _join(parts: list[np.ndarray]) -> np.ndarray:
    """The int32 concatenation of `parts`, without a copy when only one is not empty."""
    full = [p for p in parts if p.size]
    if len(full) == 1:
        return full[0].astype(np.int32, copy=False)
    return np.concatenate(parts).astype(np.int32, copy=False)


def _hf_strided(tokens: np.ndarray, seq_len: int, stride: int) -> Windows:
    """The loop of the Hugging Face guide, recording each window instead of running it."""
    n = tokens.size
    starts, lengths, first = [], [], []
    prev_end = 0
    for begin in range(0, n, stride):
        end = min(begin + seq_len, n)
        trg_len = end - prev_end  # may differ from stride on the last loop
        width = end - begin
        f = max(1, width - trg_len)  # labels[:, :-trg_len] = -100, and the model shifts by one
        if f < width:
            starts.append(begin)
            lengths.append(width)
            first.append(f)
        prev_end = end
        if end == n:
            break
    return windows_lib.make(tokens, starts, lengths, first, seq_len)


def rolling_prefix(tokenizer: Tokenizer, vocab_size: int) -> int:
    """lm_eval_rolling's prefix token: BOS if the tokenizer has one, else EOS.

    Raises:
      ConfigError: the tokenizer has neither; DataError: it is outside the vocabulary.
    """
    prefix = tokenizer.bos_id if tokenizer.bos_id is not None else tokenizer.eos_id
    if prefix is None:
        raise ConfigError(
            f"eval.protocol=lm_eval_rolling needs a BOS or EOS token to predict each document's "
            f"first token, and the tokenizer ({tokenizer.name}) has neither."
        )
    check_ids(np.asarray([prefix]), vocab_size, "the prefix (BOS/EOS) token", tokenizer)
    return int(prefix)


def rolling_windows(tokens: np.ndarray, offsets: np.ndarray, seq_len: int, prefix: int) -> Windows:
    """lm_eval_rolling's windows over documents `tokens[offsets[d]:offsets[d + 1]]`, from their
    lengths alone (see the module docstring)."""
    starts, lengths, first, pre, document = [], [], [], [], []
    for d in range(offsets.size - 1):
        n, base = int(offsets[d + 1] - offsets[d]), int(offsets[d])
        if n == 0:
            continue
        # First window: [prefix] + t[:m-1] predicts t[:m], m = min(seq_len, n).
        m = min(seq_len, n)
        starts.append(base)
        lengths.append(m)
        first.append(1)
        pre.append(prefix)
        document.append(d)
        predicted = m
        while predicted < n:
            k = min(n - predicted, seq_len)  # predictions of this window
            end = predicted + k
            # context t[end-seq_len-1 : end-k] (disjoint part), continuation t[end-k : end]
            lo = end - seq_len - 1
            starts.append(base + lo)
            lengths.append(end - lo)
            first.append(end - k - lo)
            pre.append(windows_lib.NO_PREFIX)
            document.append(d)
            predicted = end
    return windows_lib.make(tokens, starts, lengths, first, seq_len, prefix=pre, document=document)


def _lm_eval_rolling(
    docs: list[Document],
    tokenizer: Tokenizer,
    vocab_size: int,
    seq_len: int,
    add_bos: bool,
    doc_counts: tuple[np.ndarray, np.ndarray] | None = None,
) -> Plan:
    prefix = rolling_prefix(tokenizer, vocab_size)
    encoded = tokenizer.encode([d.text for d in docs])
    if add_bos:  # the harness encodes with the tokenizer's own special tokens (HFLM.tok_encode)
        encoded = [np.concatenate([[tokenizer.bos_id], ids]).astype(np.int32) for ids in encoded]
    for d, (doc, ids) in enumerate(zip(docs, encoded, strict=True)):
        check_ids(ids, vocab_size, f"document {d} ({doc.source})", tokenizer)
    offsets = np.cumsum([0] + [ids.size for ids in encoded]).astype(np.int64)
    tokens = np.concatenate(encoded).astype(np.int32) if encoded else np.zeros(0, np.int32)
    windows = rolling_windows(tokens, offsets, seq_len, prefix)
    if doc_counts is None:
        doc_bytes = np.asarray([len(d.text.encode("utf-8")) for d in docs], np.int64)
        doc_words = np.asarray([count_harness_words(d.text) for d in docs], np.int64)
    else:
        doc_bytes, doc_words = (np.asarray(c, np.int64) for c in doc_counts)
        if doc_bytes.shape != (len(docs),) or doc_words.shape != (len(docs),):
            raise ValueError(f"doc_counts must have one count per document ({len(docs)})")
    if not windows.num_windows:
        raise DataError(f"the corpus ({len(docs)} documents) tokenizes to no tokens.")
    return Plan(
        protocol="lm_eval_rolling",
        windows=windows,
        num_bytes=int(doc_bytes.sum()),
        num_words=int(doc_words.sum()),
        num_documents=len(docs),
        text_tokens=int(tokens.size),
        unscored_tokens=0,
        add_bos=add_bos,
        prefix_id=int(prefix),
        doc_bytes=doc_bytes,
        doc_words=doc_words,
        sources=tuple(d.source for d in docs),
        doc_starts=offsets[:-1].astype(np.int64),
    )


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
