"""LongPPL (Fang et al., "What is Wrong with Perplexity for Long-context Language Modeling?",
ICLR 2025, arXiv 2410.23771): perplexity over the key tokens, those whose loss drops with long
context, on the host in float64.

The reference implementation is PKU-ML/LongPPL, `longppl/longppl.py` (read at commit `1decd2a`);
each function below names the part of it that it reproduces:

- `key_tokens` (`find_key_token`): an evaluator model scores each document with its full
  context and with a short one; token i is a key token iff `nll_short - nll_long > alpha` (the
  long-short difference, LSD; alpha = 2 nats) and `nll_long < -beta` (the long-context loss, LCL;
  beta = -2), both in nats.
- `merge_intervals` (`merge_intervals`): the key tokens' character spans (the evaluator
  tokenizer's offsets), adjacent ones joined (`start == previous end`).
- `within` (`cal_overlap`): the evaluated model's tokens whose character span lies inside a
  merged key span; the evaluated model may have another tokenizer, its tokens are matched to the
  evaluator's by characters.
- `summary` (`compute_perplexity`'s aggregation): `exp(sum over documents of log(LongPPL_d) *
  n_d / sum n_d)` with `log(LongPPL_d)` the mean NLL of document d's key tokens and `n_d` their
  number, which is `exp(total key NLL / total key tokens)`: token-weighted over documents.

One difference from the reference is kept on purpose: where a key span would select the
evaluated model's first token of a document (its loss index -1 in the reference, which then
reads the last token's loss), that token is not a target here and is not counted. The reference's
short windows (`trunc_len`, `sliding_window`) are `ppl_jax.plans.windows.short_windows`.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

ALPHA = 2.0  # nats: the long-short difference a key token exceeds
BETA = -2.0  # the long-context loss of a key token is below -beta nats


def key_tokens(
    long_nll: np.ndarray, short_nll: np.ndarray, alpha: float = ALPHA, beta: float = BETA
) -> np.ndarray:
    """Which tokens are key tokens (`find_key_token`'s `loss_discrepancy`).

    Args:
      long_nll: `[n] float32/float64`, nats, each token's NLL with its full context.
      short_nll: `[n]`, nats, with the short context; NaN where the token was not scored with a
        short context (its context is short already): never a key token.
      alpha, beta: the thresholds (nats): `short - long > alpha` and `long < -beta`.

    Returns:
      `[n] bool`. The difference is taken in float32 when both arrays are float32, as the
      reference's float32 losses are compared.
    """
    long_nll, short_nll = np.asarray(long_nll), np.asarray(short_nll)
    if long_nll.shape != short_nll.shape:
        raise ValueError(f"NLL arrays of shapes {long_nll.shape} and {short_nll.shape}")
    with np.errstate(invalid="ignore"):
        return ((short_nll - long_nll) > alpha) & (long_nll < -beta) & ~np.isnan(short_nll)


def merge_intervals(spans: np.ndarray) -> np.ndarray:
    """`[m, 2] int64`: the key tokens' character spans `[k, 2]` (in token order) with each span
    that starts where the previous one ends joined to it (`merge_intervals`)."""
    spans = np.asarray(spans, np.int64).reshape(-1, 2)
    if not spans.shape[0]:
        return spans
    adjacent = spans[1:, 0] == spans[:-1, 1]
    keep_start = np.concatenate([[True], ~adjacent])
    keep_end = np.concatenate([~adjacent, [True]])
    return np.stack([spans[keep_start, 0], spans[keep_end, 1]], axis=1)


def within(offsets: np.ndarray, slices: np.ndarray) -> np.ndarray:
    """`[n] bool`: which tokens (character spans `[n, 2]`, in text order) lie inside a key span
    (`[m, 2]`, from `merge_intervals`), as `cal_overlap`'s walk decides: a token `[a, b)` is
    inside `[s, e)` when `a >= s and b <= e`. The walk advances over the spans in order; for
    spans in text order (a tokenizer's, merged) this is "inside the last span that starts at or
    before the token, or inside an earlier span that reaches as far" (`ends` as a running max).
    """
    offsets = np.asarray(offsets, np.int64).reshape(-1, 2)
    slices = np.asarray(slices, np.int64).reshape(-1, 2)
    if not slices.shape[0] or not offsets.shape[0]:
        return np.zeros(offsets.shape[0], bool)
    order = np.argsort(slices[:, 0], kind="stable")
    starts, ends = slices[order, 0], np.maximum.accumulate(slices[order, 1])
    j = np.searchsorted(starts, offsets[:, 0], side="right") - 1
    found = j >= 0
    return found & (offsets[:, 1] <= ends[np.maximum(j, 0)])


def within_walk(offsets: Any, slices: Any) -> list[int]:
    """`cal_overlap`'s walk itself, for tests: the indices of the tokens it appends, before its
    shift by one (the reference appends `i - 1`, the index of token i's loss)."""
    found, i, j = [], 0, 0
    while i < len(offsets) and j < len(slices):
        a_start, a_end = offsets[i]
        b_start, b_end = slices[j]
        if a_start >= b_start and a_end <= b_end:
            found.append(i)
            i += 1
        elif a_start < b_start:
            i += 1
        else:
            j += 1
    return found


def summary(
    key_nll: np.ndarray,
    all_nll: np.ndarray,
    alpha: float,
    beta: float,
    evaluator: str,
    num_evaluator_keys: int,
) -> dict[str, Any]:
    """LongPPL and its counts, strict JSON.

    Args:
      key_nll: `[k]`, nats, the evaluated model's NLL of its key tokens (all documents).
      all_nll: `[n]`, nats, its NLL of every scored token (for the perplexity beside it).
      alpha, beta, evaluator: as used (the evaluator's name: a checkpoint, or "the model").
      num_evaluator_keys: key tokens the evaluator found (in its own tokens).

    Returns:
      `{"longppl", "key_nll_per_token" (nats), "num_key_tokens", "key_fraction",
      "perplexity" (all scored tokens), "num_tokens", "alpha", "beta", "evaluator",
      "evaluator_key_tokens", "notes"}`; `longppl` is null (with a note) without key tokens,
      as the reference prints "No key tokens!".
    """
    key = np.asarray(key_nll, np.float64)
    every = np.asarray(all_nll, np.float64)
    notes: dict[str, str] = {}
    k, n = int(key.size), int(every.size)
    mean = math.fsum(key.tolist()) / k if k else None
    if mean is None:
        notes["longppl"] = "no key tokens: no token's loss dropped by more than alpha nats"
    whole = math.fsum(every.tolist()) / n if n else None
    return {
        "longppl": _exp(mean, "longppl", notes),
        "key_nll_per_token": mean,
        "num_key_tokens": k,
        "key_fraction": k / n if n else None,
        "perplexity": _exp(whole, "perplexity", notes),
        "num_tokens": n,
        "alpha": float(alpha),
        "beta": float(beta),
        "evaluator": evaluator,
        "evaluator_key_tokens": int(num_evaluator_keys),
        "notes": notes,
    }


def _exp(x: float | None, name: str, notes: dict[str, str]) -> float | None:
    if x is None:
        return None
    try:
        return math.exp(x)
    except OverflowError:
        notes[name] = "infinite (exp overflows)"
        return None
