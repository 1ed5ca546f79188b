"""Plans of lm-evaluation-harness requests: one window per `loglikelihood` request, and the
`lm_eval_rolling` windows of `loglikelihood_rolling` documents.

A `loglikelihood` request is a tokenized (context, continuation) pair, as the harness's
`TemplateLM.loglikelihood` encodes it. Its window follows `HFLM._loglikelihood_tokens`
(lm-evaluation-harness 0.4, `lm_eval/models/huggingface.py`): the row is
`(context + continuation)[-(seq_len + 1):]` (the context left-truncated so that the model reads at
most `seq_len` tokens), and only the continuation's tokens are scored (`first_scored` = the row
length minus the continuation's length). The window's scored NLL sum is minus the request's
log-likelihood, and the request is greedy exactly when every scored target is the model's top-1
prediction (`correct == scored`). The harness refuses a continuation longer than `seq_len`
(an assertion) and an empty context or continuation; so does `loglikelihood_plan`, with a
sentence.

Windows of many requests share packed rows as separate segments (`ppl_jax.plans.layout`); each
row position attends only within its own request, so packing and batch size change nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ppl_jax.errors import DataError
from ppl_jax.plans import protocols
from ppl_jax.plans import windows as windows_lib
from ppl_jax.plans.protocols import Plan

LOGLIKELIHOOD = "loglikelihood"


def _stream(parts: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """(`[N] int32` concatenation of `parts`, `[len(parts) + 1] int64` offsets)."""
    offsets = np.cumsum([0] + [len(p) for p in parts]).astype(np.int64)
    tokens = (
        np.concatenate([np.asarray(p, np.int32) for p in parts]).astype(np.int32, copy=False)
        if parts
        else np.zeros(0, np.int32)
    )
    return tokens, offsets


def loglikelihood_plan(
    contexts: Sequence[np.ndarray],
    continuations: Sequence[np.ndarray],
    continuation_bytes: Sequence[int] | np.ndarray,
    seq_len: int,
    vocab_size: int,
) -> Plan:
    """The plan of `loglikelihood` requests: window `k` scores request `k`'s continuation.

    Args:
      contexts, continuations: per request, `[n] int` token ids (the harness's encoding;
        contexts may be longer than `seq_len`, continuations not).
      continuation_bytes: per request, the UTF-8 bytes of the continuation's text (the
        denominator of its bits per byte; `Plan.doc_bytes`).
      seq_len: the model inputs per row (the harness's `max_length`).
      vocab_size: the model's; every id is checked against it.

    Returns:
      A `Plan` of protocol `loglikelihood` with one window per request (`document` = the
      request's index), `doc_bytes` = `continuation_bytes`, `num_bytes` their sum; words are
      not counted (0).

    Raises:
      DataError: an empty context or continuation, a continuation longer than `seq_len`, or an
        id outside the vocabulary, naming the request.
    """
    n = len(contexts)
    if len(continuations) != n or len(continuation_bytes) != n:
        raise ValueError("one context, continuation and byte count per request")
    rows, starts, lengths, first = [], [], [], []
    at = 0
    for k, (ctx, cont) in enumerate(zip(contexts, continuations, strict=True)):
        whole, scored = _request_row(k, ctx, cont, seq_len, vocab_size)
        rows.append(whole)
        starts.append(at)
        lengths.append(whole.size)
        first.append(whole.size - scored)
        at += whole.size
    tokens, _ = _stream(rows)
    windows = windows_lib.make(tokens, starts, lengths, first, seq_len, document=np.arange(n))
    doc_bytes = np.asarray(continuation_bytes, np.int64).reshape(n)
    return Plan(
        protocol=LOGLIKELIHOOD,
        windows=windows,
        num_bytes=int(doc_bytes.sum()),
        num_words=0,
        num_documents=n,
        text_tokens=int(tokens.size),
        unscored_tokens=int(tokens.size - windows.num_scored().sum()),
        add_bos=False,
        prefix_id=None,
        doc_bytes=doc_bytes,
        doc_words=np.zeros(n, np.int64),
        sources=tuple(f"request {k}" for k in range(n)),
        doc_starts=np.asarray(starts, np.int64),
    )


def _request_row(
    k: int, ctx: Any, cont: Any, seq_len: int, vocab_size: int
) -> tuple[np.ndarray, int]:
    """Request `k`'s row, `[<= seq_len + 1] int32`: its context's last tokens then its
    continuation, and the continuation's length (the targets scored).

    Raises:
      DataError: as `loglikelihood_plan`, naming the request.
    """
    ctx, cont = np.asarray(ctx, np.int64), np.asarray(cont, np.int64)
    if ctx.size == 0 or cont.size == 0:
        raise DataError(
            f"loglikelihood request {k} has an empty "
            f"{'context' if ctx.size == 0 else 'continuation'} after tokenization; the "
            f"harness scores a continuation of at least one token after a context of at "
            f"least one (the prefix token stands for an empty context text)."
        )
    if cont.size > seq_len:
        raise DataError(
            f"loglikelihood request {k}: its continuation is {cont.size} tokens, longer than "
            f"the model's window of {seq_len} (seq_len), which the harness refuses too; "
            f"use a larger seq_len or a shorter continuation."
        )
    whole = np.concatenate([ctx, cont])[-(seq_len + 1) :]
    if whole.min() < 0 or whole.max() >= vocab_size:
        bad = int(whole[(whole < 0) | (whole >= vocab_size)][0])
        raise DataError(
            f"loglikelihood request {k}: token id {bad} is outside the model's vocabulary "
            f"of {vocab_size}; the tokenizer does not match the model."
        )
    return whole.astype(np.int32), int(cont.size)


def rolling_plan(
    documents: Sequence[np.ndarray],
    document_bytes: Sequence[int] | np.ndarray,
    seq_len: int,
    prefix: int,
    vocab_size: int,
) -> Plan:
    """The `lm_eval_rolling` plan of `loglikelihood_rolling` documents already tokenized as the
    harness's `tok_encode` does (with the tokenizer's own BOS where it adds one): the windows of
    `ppl_jax.plans.protocols.rolling_windows` (`get_rolling_token_windows` with `context_len=1`
    and `make_disjoint_window`), `prefix` predicting each document's first token. A document
    that tokenizes to nothing has no window (the harness sums nothing for it: log-likelihood 0).

    Args:
      documents: per document, `[n] int` token ids.
      document_bytes: per document, its text's UTF-8 bytes (`Plan.doc_bytes`).
      seq_len: predictions per window (the harness's `max_length`).
      prefix: the harness's `prefix_token_id`.
      vocab_size: the model's.

    Raises:
      DataError: an id outside the vocabulary, naming the document.
    """
    tokens, offsets = _stream(documents)
    for d in range(len(documents)):
        part = tokens[offsets[d] : offsets[d + 1]]
        if part.size and (part.min() < 0 or part.max() >= vocab_size):
            raise DataError(
                f"loglikelihood_rolling document {d}: a token id is outside the model's "
                f"vocabulary of {vocab_size}; the tokenizer does not match the model."
            )
    if not 0 <= prefix < vocab_size:
        raise DataError(f"the prefix token {prefix} is outside the vocabulary of {vocab_size}.")
    windows = protocols.rolling_windows(tokens, offsets, seq_len, prefix)
    doc_bytes = np.asarray(document_bytes, np.int64).reshape(len(documents))
    return Plan(
        protocol=protocols.LM_EVAL_ROLLING.name,
        windows=windows,
        num_bytes=int(doc_bytes.sum()),
        num_words=0,
        num_documents=len(documents),
        text_tokens=int(tokens.size),
        unscored_tokens=0,
        add_bos=False,
        prefix_id=int(prefix),
        doc_bytes=doc_bytes,
        doc_words=np.zeros(len(documents), np.int64),
        sources=tuple(f"document {d}" for d in range(len(documents))),
        doc_starts=offsets[:-1],
    )


def per_document(plan: Plan, window_values: np.ndarray) -> np.ndarray:
    """`[num_documents]` float64: the sums of per-window values (`[W]`) over each document's
    windows (0 for a document without one)."""
    out = np.zeros(plan.num_documents, np.float64)
    np.add.at(out, plan.windows.document, np.asarray(window_values, np.float64))
    return out
