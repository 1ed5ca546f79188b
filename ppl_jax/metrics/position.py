"""Loss by position in the document, to its full length, with 95% bands over documents, and the
context gain of each position bucket: the long-context curve (the TTT paper's Figure 2: Sun et
al. 2024, arXiv 2407.04620), on the host in float64 from per-token NLLs.

A target's position is the number of tokens of context it saw in its window (BOS included), as
in `ppl_jax.metrics.curves.position_curve`, whose buckets (`curves.bucket_edges`: single positions
first, then log-spaced) and JSON layout this curve keeps; it adds per bucket:

- `documents`: how many documents have a target there (far buckets hold only the longest);
- `perplexity_interval`: the 95% percentile interval of the bucket's perplexity under the
  bootstrap over documents (`ppl_jax.metrics.uncertainty.curve_intervals`: each replicate draws
  documents with replacement and takes `exp` of the ratio of its NLL and token sums in the
  bucket); null with fewer than two documents there (the curve's `intervals` says how it was
  drawn, as the other curves' do);
- with a short context (`short_nll`), `context_gain`: over the bucket's targets that were scored
  again with the short context (those at positions >= C), `num_tokens`, `long_nll_sum`,
  `short_nll_sum` and `gain_sum = short - long` (nats, positive where the far context helped)
  and `gain_per_token`.

Sums are `math.fsum` of the float32 per-token values taken exactly in float64, so a bucket's sum
is the correctly rounded sum of its tokens; the buckets' `num_tokens` add up to the total's
exactly, their `nll_sum` to `total.nll_sum` within float64 rounding. The context gains total is
`fsum` of the short NLLs and the negated long ones together: the exactly rounded difference of
the two sums, equal bit for bit to the `fsum` of the per-token gains (`short - long` of two
float32 values is exact in float64 whenever their exponents differ by at most 29).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ppl_jax.metrics import curves, uncertainty


def document_curve(
    nll: np.ndarray,
    position: np.ndarray,
    document: np.ndarray,
    num_positions: int,
    short_nll: np.ndarray | None = None,
    samples: int = 1000,
    seed: int = 0,
    max_points: int = 64,
) -> dict[str, Any]:
    """The long-context position curve (see the module docstring), strict JSON.

    Args:
      nll: `[n] float32`, nats, each scored target's NLL with its full context.
      position: `[n] int`, its position in its window (0 <= position < num_positions).
      document: `[n] int`, its document (the bootstrap's unit), >= 0.
      num_positions: `P` (`seq_len + 1`).
      short_nll: `[n] float32`, nats, its NLL with the short context, NaN where it was not
        scored again (positions below the short context); None: no context gains.
      samples, seed: bootstrap replicates (0: no bands) and their seed.
      max_points: the most buckets.

    Returns:
      `curves.position_curve`'s dict, its buckets with `documents`, `perplexity_interval` and
      (with `short_nll`) `context_gain`; plus `documents`, `"intervals": {"method", "unit",
      "units", "samples", "seed", "level"}` (None without samples) and (with `short_nll`)
      `"context_gain"`, the gains over all targets.

    Raises:
      ValueError: arrays of different lengths, a position outside `[0, P)`, a negative
        document, or a non-finite NLL.
    """
    nll, position, document = _checked(nll, position, document, num_positions)
    edges = curves.bucket_edges(num_positions, max_points)
    k = edges.size - 1
    bucket = np.searchsorted(edges, position, side="right") - 1
    values = nll.astype(np.float64)
    gains = None if short_nll is None else _rescored(short_nll, values, bucket)
    units, nll_u, tokens_u = _unit_sums(values, bucket, document, k)
    bands = (
        uncertainty.curve_intervals(nll_u, tokens_u, samples, seed)
        if samples > 0 and units
        else [None] * k
    )
    notes: dict[str, str] = {}
    rows = _bucket_rows(values, bucket, document, edges, bands, gains, notes)
    total = curves.stats(math.fsum(values.tolist()), int(values.size), "total", notes)
    out: dict[str, Any] = {
        "num_positions": int(num_positions),
        "bucketing": "every position" if num_positions <= max_points else "log",
        "max_points": int(max_points),
        "buckets": rows,
        "total": total,
        "documents": int(units),
        "intervals": None if samples <= 0 else _intervals(units, samples, seed),
        "notes": notes,
    }
    if gains is not None:
        out["context_gain"] = _gain(gains[0], gains[1])
    return out


def _checked(
    nll: Any, position: Any, document: Any, num_positions: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The per-token arrays as NumPy arrays (positions and documents int64), checked.

    Raises:
      ValueError: as `document_curve`.
    """
    nll = np.asarray(nll)
    position, document = np.asarray(position, np.int64), np.asarray(document, np.int64)
    n = nll.size
    if position.shape != (n,) or document.shape != (n,) or nll.ndim != 1:
        raise ValueError(
            f"per-token arrays of shapes {nll.shape}, {position.shape}, {document.shape}"
        )
    if n and (position.min() < 0 or position.max() >= num_positions or document.min() < 0):
        raise ValueError("a position outside [0, num_positions) or a negative document")
    if not np.isfinite(nll).all():
        raise ValueError("a scored target has a non-finite NLL")
    return nll, position, document


def _rescored(
    short_nll: Any, values: np.ndarray, bucket: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(short NLLs, long NLLs, buckets) of the targets scored again with the short context
    (float64; not NaN in `short_nll`).

    Raises:
      ValueError: `short_nll` of another length than the targets.
    """
    short_nll = np.asarray(short_nll)
    if short_nll.shape != values.shape:
        raise ValueError(f"short NLLs of shape {short_nll.shape} for {values.size} targets")
    again = ~np.isnan(short_nll)
    return short_nll[again].astype(np.float64), values[again], bucket[again]


def _intervals(units: int, samples: int, seed: int) -> dict[str, Any]:
    """How the bands were drawn: the bootstrap over documents."""
    return {
        "method": uncertainty.METHODS["document"],
        "unit": "document",
        "units": int(units),
        "samples": int(samples),
        "seed": int(seed),
        "level": uncertainty.LEVEL,
    }


def _bucket_rows(
    values: np.ndarray,
    bucket: np.ndarray,
    document: np.ndarray,
    edges: np.ndarray,
    bands: list[Any],
    gains: tuple[np.ndarray, np.ndarray, np.ndarray] | None,
    notes: dict[str, str],
) -> list[dict[str, Any]]:
    """One row per bucket that holds a target: its positions, `curves.stats` of its NLLs, its
    documents, its band and (with `gains`: short NLLs, long NLLs, buckets) its context gain."""
    k = edges.size - 1
    order = np.argsort(bucket, kind="stable")
    bounds = np.searchsorted(bucket[order], np.arange(k + 1))
    rows = []
    for b in range(k):
        ids = order[bounds[b] : bounds[b + 1]]
        if not ids.size:
            continue
        path = f"buckets[{len(rows)}]"
        row = {"first": int(edges[b]), "last": int(edges[b + 1] - 1)}
        row.update(curves.stats(math.fsum(values[ids].tolist()), int(ids.size), path, notes))
        row["documents"] = int(np.unique(document[ids]).size)
        row["perplexity_interval"] = bands[b]
        if gains is not None:
            row["context_gain"] = _gain(*[g[gains[2] == b] for g in gains[:2]])
        rows.append(row)
    return rows


def _unit_sums(
    values: np.ndarray, bucket: np.ndarray, document: np.ndarray, k: int
) -> tuple[int, np.ndarray, np.ndarray]:
    """(documents, `[U, k] float64` NLL, `[U, k] int64` targets): per document with a target,
    its NLL sum and target count in each bucket."""
    docs, unit = np.unique(document, return_inverse=True)
    cell = unit * k + bucket
    nll = np.bincount(cell, weights=values, minlength=docs.size * k).reshape(docs.size, k)
    count = np.bincount(cell, minlength=docs.size * k).reshape(docs.size, k)
    return int(docs.size), nll, count


def _gain(short: np.ndarray, long: np.ndarray) -> dict[str, Any]:
    """The context gain of targets scored with both contexts (float64 of float32 values)."""
    n = int(short.size)
    gain = math.fsum(np.concatenate([short, -long]).tolist())
    return {
        "num_tokens": n,
        "long_nll_sum": math.fsum(long.tolist()),
        "short_nll_sum": math.fsum(short.tolist()),
        "gain_sum": gain,
        "gain_per_token": gain / n if n else None,
    }
