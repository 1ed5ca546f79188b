"""How context helps: loss by position in the window, and perplexity against context length.

Host-side float64/int64 arithmetic on sums the scoring step returns (never means), turned into
strict-JSON tables (`position_curve.json`, the context-length sweep); their figures are
`ppl_jax.outputs.curve_figures`.

- Loss by position: the step returns, per batch, the NLL summed over the scored targets at each
  position of the window (`[P] float32`, nats; `P = seq_len + 1`) and how many targets were
  scored there (`[P] int32`); the host adds them up in float64/int64. The position of a target is
  its row position in its window: the number of tokens of context it saw (a prefix or BOS token
  included). Every value of a curve is token-weighted: a bucket's NLL per token is the bucket's
  NLL sum over its token count, never a mean of per-position means.
- Perplexity against context length: one `(context_length, nll_sum, num_tokens)` per length of
  `eval.context_lengths`, all over the same targets (`windows.context_windows`).

The formulas are those of `ppl_jax.metrics.sums`: perplexity = exp(nll_sum / num_tokens), bits per
token = nll_sum / (num_tokens ln 2). A value that is infinite (an overflowing exp) or undefined is
null in the JSON, and `notes` maps its path to the reason, as in `results.json`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ppl_jax.metrics import sums as metrics

_STAT_KEYS = ("nll_per_token", "perplexity", "bits_per_token")


def stats(nll_sum: float, num_tokens: int, path: str, notes: dict[str, str]) -> dict[str, Any]:
    """Counts and token-weighted metrics of one group of targets; non-finite values are None,
    with their reason in `notes[path.key]`."""
    derived = metrics.derive(metrics.Sums(nll_sum=nll_sum, num_tokens=num_tokens))
    out: dict[str, Any] = {"num_tokens": num_tokens, "nll_sum": nll_sum}
    for key in _STAT_KEYS:
        value = derived[key]
        if key in derived.notes:
            value = None
            notes[f"{path}.{key}"] = derived.notes[key]
        out[key] = value
    return out


def bucket_edges(num_positions: int, max_points: int = 64) -> np.ndarray:
    """Edges of the position buckets of `position_curve`: bucket `j` is `[e[j], e[j+1])`.

    With `num_positions <= max_points`, every position is its own bucket. Otherwise position 0
    (never a target: every window scores from row position 1 on) is one bucket, and positions
    `1 .. P-1` are cut into at most `max_points - 1` log-spaced buckets, chosen one at a time:
    a bucket that starts at `s` with `m` buckets left ends before
    `max(s + 1, round(s * (P / s) ** (1 / m)))` (the last one at `P`). So the first positions,
    where the loss changes fastest, are buckets of one position each, and later buckets widen
    by a constant ratio (about 1.14 for P = 4097 and 64 points).

    Args:
      num_positions: `P >= 1`, positions of the window (`seq_len + 1`).
      max_points: the most buckets (>= 2).

    Returns:
      `[K + 1] int64` edges, `e[0] = 0`, `e[K] = P`, strictly increasing, `K <= max_points`.

    Raises:
      ValueError: `num_positions < 1` or `max_points < 2`.
    """
    p = int(num_positions)
    if p < 1 or max_points < 2:
        raise ValueError(
            f"bucket_edges needs num_positions >= 1 and max_points >= 2: {p}, {max_points}"
        )
    if p <= max_points:
        return np.arange(p + 1, dtype=np.int64)
    edges, start, left = [0, 1], 1, max_points - 1
    while start < p:
        if left == 1:
            end = p
        else:
            end = min(p, max(start + 1, round(start * (p / start) ** (1.0 / left))))
        edges.append(end)
        start, left = end, left - 1
    return np.asarray(edges, np.int64)


def position_curve(
    nll_by_position: np.ndarray, tokens_by_position: np.ndarray, max_points: int = 64
) -> dict[str, Any]:
    """Loss against position in the window, bucketed, token-weighted, as strict JSON.

    Positions are bucketed by `bucket_edges(P, max_points)`: every position its own bucket when
    `P <= max_points`, else log-spaced buckets (single positions first, then widening by a
    constant ratio). Each bucket reports the NLL summed over its positions and the targets
    counted there, and derives its metrics from those sums (token-weighted: a bucket's NLL per
    token is sum of NLL / sum of tokens, not a mean of the per-position means). Buckets without
    a scored target are left out.

    Args:
      nll_by_position: `[P] float64`, NLL summed per position, nats (`P = seq_len + 1`; index p
        holds the targets that saw p tokens of context).
      tokens_by_position: `[P] int64`, scored targets per position.
      max_points: the most buckets (>= 2).

    Returns:
      `{"num_positions": P, "bucketing": "every position" | "log", "max_points",
      "buckets": [{"first", "last" (positions, inclusive), "num_tokens", "nll_sum" (nats),
      "nll_per_token" (nats), "perplexity", "bits_per_token"}, ...] (by position),
      "total": {the same for all positions}, "notes": {path: reason a value is null}}`.
      The buckets' `num_tokens` add up to `total.num_tokens` exactly, their `nll_sum` to
      `total.nll_sum` within float64 rounding (both sums are `math.fsum`).

    Raises:
      ValueError: the arrays are not 1-D of one length, a count is negative, or a sum is not
        finite (the scorer refuses non-finite NLLs before this).
    """
    nll = np.asarray(nll_by_position, np.float64)
    count = np.asarray(tokens_by_position)
    if nll.ndim != 1 or nll.shape != count.shape or nll.size == 0:
        raise ValueError(f"position sums of shapes {nll.shape} and {count.shape}: need [P], [P]")
    if not np.issubdtype(count.dtype, np.integer) or (count < 0).any():
        raise ValueError("tokens_by_position must be non-negative integers")
    if not np.isfinite(nll).all():
        raise ValueError("nll_by_position holds a non-finite sum")
    count = count.astype(np.int64)
    p = int(nll.size)
    edges = bucket_edges(p, max_points)
    notes: dict[str, str] = {}
    buckets = []
    for lo, hi in zip(edges[:-1].tolist(), edges[1:].tolist(), strict=True):
        tokens = int(count[lo:hi].sum())
        if tokens == 0:
            continue
        path = f"buckets[{len(buckets)}]"
        found = stats(math.fsum(nll[lo:hi].tolist()), tokens, path, notes)
        buckets.append({"first": lo, "last": hi - 1, **found})
    total = stats(math.fsum(nll.tolist()), int(count.sum()), "total", notes)
    return {
        "num_positions": p,
        "bucketing": "every position" if p <= max_points else "log",
        "max_points": int(max_points),
        "buckets": buckets,
        "total": total,
        "notes": notes,
    }


def context_curve(
    results: Sequence[tuple[int, float, int]],
    targets_per_window: int | Mapping[int, int] | None = None,
) -> dict[str, Any]:
    """Perplexity against context length, as strict JSON.

    Args:
      results: per length of the sweep, `(context_length, nll_sum in nats, num_tokens)`, all
        over the same targets (`windows.context_windows`), in any order.
      targets_per_window: `S`, one for all lengths or per length; when given, each row also says
        the range of context its targets saw, `min_context = L` to `max_context = L + S - 1`.

    Returns:
      `{"num_targets", "context_lengths": [{"context_length", ["min_context", "max_context"],
      "num_tokens", "nll_sum", "nll_per_token", "perplexity", "bits_per_token"}, ...]` (by
      increasing length), `"notes": {path: reason a value is null}}`.

    Raises:
      ValueError: no result, a length below 1 or given twice, or token counts that differ between
        lengths (then the lengths did not score the same targets).
    """
    rows = sorted((int(n), float(s), int(t)) for n, s, t in results)
    lengths = [n for n, _, _ in rows]
    if not rows or lengths[0] < 1 or len(set(lengths)) != len(lengths):
        raise ValueError(f"context lengths {lengths}: need at least one, each >= 1, once each")
    counts = {t for _, _, t in rows}
    if len(counts) != 1:
        raise ValueError(
            f"the context lengths {lengths} scored different token counts "
            f"{[t for _, _, t in rows]}; they must score the same targets"
        )
    notes: dict[str, str] = {}
    table = []
    for i, (length, nll_sum, tokens) in enumerate(rows):
        row: dict[str, Any] = {"context_length": length}
        if targets_per_window is not None:
            s = (
                targets_per_window[length]
                if isinstance(targets_per_window, Mapping)
                else targets_per_window
            )
            row.update(min_context=length, max_context=length + int(s) - 1)
        row.update(stats(nll_sum, tokens, f"context_lengths[{i}]", notes))
        table.append(row)
    return {"num_targets": counts.pop(), "context_lengths": table, "notes": notes}


def _value(row: Mapping[str, Any], key: str, spec: str) -> str:
    value = row.get(key)
    return "n/a" if value is None else format(value, spec)


def context_table(curve: Mapping[str, Any]) -> str:
    """A text table of `context_curve`'s result, for the terminal: one line per length."""
    rows = curve["context_lengths"]
    ranged = bool(rows) and "min_context" in rows[0]
    header = [
        "context",
        *(["context seen"] if ranged else []),
        "tokens",
        "NLL/token (nats)",
        "bits/token",
        "perplexity",
    ]
    lines = []
    for row in rows:
        cells = [f"{row['context_length']:,}"]
        if ranged:
            cells.append(f"{row['min_context']:,}..{row['max_context']:,}")
        cells += [
            f"{row['num_tokens']:,}",
            _value(row, "nll_per_token", ".4f"),
            _value(row, "bits_per_token", ".4f"),
            _value(row, "perplexity", ".4f"),
        ]
        lines.append(cells)
    widths = [max(len(c) for c in col) for col in zip(header, *lines, strict=True)]
    text = ["  ".join(h.rjust(w) for h, w in zip(header, widths, strict=True))]
    text += ["  ".join(c.rjust(w) for c, w in zip(cells, widths, strict=True)) for cells in lines]
    return "\n".join(text)
