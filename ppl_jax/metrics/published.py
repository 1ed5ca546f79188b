"""The arithmetic of a reference loop as published, beside ppl_jax's exact count.

`hf_strided` reads the same tokens as the Hugging Face guide "Perplexity of fixed-length models"
(transformers docs, `perplexity.md`) and reports the exact perplexity of its scored labels:
`exp(nll_sum / num_tokens)`, every label counted once. The loop as published accumulates
differently:

    neg_log_likelihood = outputs.loss                        # the mean over the window's labels
    num_valid_tokens = (target_ids != -100).sum().item()
    num_loss_tokens = num_valid_tokens - batch_size          # "subtract batch_size due to shift"
    nll_sum += neg_log_likelihood * num_loss_tokens
    n_tokens += num_loss_tokens
    ppl = torch.exp(nll_sum / n_tokens)

`num_valid_tokens` counts the labels before the model's shift, `min(trg_len, T)` for a window of
`T` tokens, while the loss averages over the labels after it, `c = min(trg_len, T - 1)`. The two
agree only where `trg_len >= T` (the first window, and every window when `stride >= seq_len`):
there the shift drops label 0 and `num_valid - 1 = c`. Every later window of a strided loop
(`trg_len = stride < T`) has `c = trg_len` scored labels but is weighted by `c - 1`. So the
published number is a weighted mean of per-window means, a little off the exact count (the
issue that reported it measured 4.6e-4 relative); numbers quoted in papers that ran the loop are
this one. `hf_guide_loop` computes it on the host from ppl_jax's per-window sums, in float64
(the loop itself accumulates in float32).

A loop whose last window holds one token (the stream is one token longer than a multiple of the
stride past `seq_len`, e.g. `seq_len + 1` tokens with `stride = seq_len`) takes the mean loss of
no label there: NaN, which poisons `nll_sum`; so does the published number, reported as null with
that reason.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

NAME = "hf_guide_loop"
WEIGHT = "num_valid_tokens - batch_size (batch_size = 1) per window"


def hf_guide_valid_labels(
    starts: np.ndarray, lengths: np.ndarray, first_scored: np.ndarray, stream_length: int
) -> tuple[np.ndarray, bool]:
    """The guide's `num_valid_tokens` of each window that scores a label, and whether the loop
    ends with a window of one token (no label after the shift).

    The windows are those of `hf_strided` in stream order (`HfStrided.windows`: a window
    begins every `stride` tokens; `trg_len = end - prev_end`; a window that scores nothing is
    not kept, which only the loop's last window, of one token, can be).

    Args:
      starts, lengths, first_scored: `[W]` int, each window's first token in the stream, its
        tokens and its first scored row (`Windows`).
      stream_length: the stream's tokens (the guide's `seq_len`).

    Returns:
      `(num_valid [W] int64, ends_with_an_empty_window)`.
    """
    starts = np.asarray(starts, np.int64)
    lengths = np.asarray(lengths, np.int64)
    ends = starts + lengths
    prev_ends = np.concatenate([[0], ends[:-1]])
    trg_len = ends - prev_ends
    valid = np.minimum(trg_len, lengths)
    last_end = int(ends[-1]) if ends.size else 0
    return valid, last_end < int(stream_length)


def hf_guide_loop(
    window_nll: np.ndarray, window_tokens: np.ndarray, num_valid: np.ndarray, empty_last: bool
) -> dict[str, Any]:
    """The Hugging Face guide's perplexity as its loop computes it (see the module docstring).

    Args:
      window_nll: `[W] float64`, nats, each window's NLL sum over its scored labels.
      window_tokens: `[W] int`, each window's scored labels (`c`; what `outputs.loss` averages).
      num_valid: `[W] int`, the guide's `num_valid_tokens` (`hf_guide_valid_labels`).
      empty_last: the loop ended with a window of one token (its loss NaN).

    Returns:
      `{"name": NAME, "weight": WEIGHT, "nll_per_token" (nats), "perplexity",
      "weighted_tokens" (the loop's `n_tokens`), "note"}`; the values are None (and `note`
      says why) where the loop gives NaN or infinity.
    """
    nll = np.asarray(window_nll, np.float64)
    count = np.asarray(window_tokens, np.float64)
    weight = np.asarray(num_valid, np.float64) - 1.0
    out: dict[str, Any] = {"name": NAME, "weight": WEIGHT, "note": None}
    out["weighted_tokens"] = int(weight.sum())
    if empty_last:
        out.update(
            nll_per_token=None,
            perplexity=None,
            note="NaN in the loop as published: its last window holds one token, whose mean "
            "loss over no label is NaN",
        )
        return out
    if weight.sum() <= 0:
        out.update(nll_per_token=None, perplexity=None, note="no label weighted (n_tokens = 0)")
        return out
    per_token = float(np.sum(nll / count * weight) / weight.sum())
    try:
        perplexity: float | None = math.exp(per_token)
    except OverflowError:
        perplexity = None
        out["note"] = "inf (overflow: exp of the NLL per token)"
    out.update(nll_per_token=per_token, perplexity=perplexity)
    return out


def of_run(plan: Any, totals: Any) -> dict[str, Any]:
    """`hf_guide_loop` of an `hf_strided` run (a protocol whose `published_loop` is the guide's),
    from its plan (`protocols.Plan`: the windows and the stream) and its per-window sums
    (`scoring.ScoreTotals`)."""
    w = plan.windows
    valid, empty = hf_guide_valid_labels(w.starts, w.lengths, w.first_scored, w.tokens.size)
    return hf_guide_loop(totals.window_nll, totals.window_tokens, valid, empty)
