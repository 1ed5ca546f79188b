"""Placing windows into fixed-shape batches: packing and length buckets.

Packing (for document protocols, whose windows are often shorter than a row): several windows
share a row as separate segments, each with its own positions and no attention across segments
(the segment ids reach the model's attention mask). Windows are placed best-fit decreasing, so a
row holds as many short windows as fit.

Length buckets: rows are sorted by how many positions they use and cut into batches; each batch
takes the narrowest of a few fixed widths that holds its longest row, so a run compiles one
program per bucket used, not one per length.

The layout depends only on the windows and the settings, so every process computes the same one
and runs the same number of steps.
"""

from __future__ import annotations

import bisect
import dataclasses
import math

import numpy as np

from ppl_jax.plans.windows import Windows

MAX_SEGMENTS = 64  # windows per packed row, at most


@dataclasses.dataclass(frozen=True)
class Layout:
    """Rows of windows, batched in fixed shapes.

    Attributes:
      rows: per row, the ids of the windows it holds, in order (segments 1, 2, ...).
      widths: per batch, the row width (positions); batch `i` holds rows
        `[i * batch_size, (i + 1) * batch_size)`, the last batch padded with empty rows.
      batch_size: rows per batch (global).
      max_segments: the most windows any row holds (the step returns sums per segment slot).
      padding_fraction: positions of the batches that hold no token.
    """

    rows: list[tuple[int, ...]]
    widths: list[int]
    batch_size: int
    max_segments: int
    padding_fraction: float

    @property
    def num_batches(self) -> int:
        return len(self.widths)

    def batch_rows(self, i: int) -> list[tuple[int, ...]]:
        """The rows of batch `i`, padded with empty rows to `batch_size`."""
        rows = self.rows[i * self.batch_size : (i + 1) * self.batch_size]
        return rows + [()] * (self.batch_size - len(rows))


def bucket_widths(seq_len: int, num_buckets: int) -> list[int]:
    """Up to `num_buckets` row widths: `seq_len + 1`, then rows whose model inputs (`width - 1`)
    halve, rounded up to a multiple of 8 (attention kernels tile the sequence)."""
    widths = {seq_len + 1}
    for k in range(1, num_buckets):
        inputs = int(math.ceil(seq_len / 2**k / 8) * 8)
        if inputs < seq_len:
            widths.add(inputs + 1)
    return sorted(widths)


def _pack(lengths: np.ndarray, width: int) -> list[tuple[int, ...]]:
    """Best-fit decreasing: each window (longest first) goes into the fullest row it fits."""
    order = np.argsort(-lengths, kind="stable")
    rows: list[list[int]] = []
    free: list[tuple[int, int]] = []  # (free positions, row id), sorted
    for k in order:
        need = int(lengths[k])
        i = bisect.bisect_left(free, (need, -1))
        if i < len(free):
            room, row = free.pop(i)
            rows[row].append(int(k))
            room -= need
        else:
            rows.append([int(k)])
            row, room = len(rows) - 1, width - need
        if room > 0 and len(rows[row]) < MAX_SEGMENTS:
            bisect.insort(free, (room, row))
    return [tuple(sorted(r)) for r in rows]


def plan_layout(
    windows: Windows, batch_size: int, pack: bool = False, num_buckets: int = 1
) -> Layout:
    """Places `windows` into batches of `batch_size` rows.

    Args:
      windows: the protocol's windows.
      batch_size: global rows per step.
      pack: put several windows in a row where they fit.
      num_buckets: how many row widths batches may use (1: every batch is `seq_len + 1` wide
        and rows keep the windows' order).

    Returns:
      The `Layout`.
    """
    full = windows.seq_len + 1
    lengths = windows.row_lengths()
    if pack:
        rows = _pack(lengths, full)
    else:
        rows = [(k,) for k in range(windows.num_windows)]
    used = np.asarray([int(lengths[list(r)].sum()) for r in rows], np.int64)
    widths_allowed = bucket_widths(windows.seq_len, num_buckets)
    if len(widths_allowed) > 1:
        order = np.argsort(used, kind="stable")
        rows = [rows[i] for i in order]
        used = used[order]
    widths = []
    for first in range(0, len(rows), batch_size):
        longest = int(used[first : first + batch_size].max())
        widths.append(next(w for w in widths_allowed if w >= longest))
    total = sum(w * batch_size for w in widths)
    return Layout(
        rows=rows,
        widths=widths,
        batch_size=batch_size,
        max_segments=max((len(r) for r in rows), default=1),
        padding_fraction=1.0 - float(used.sum()) / total if total else 0.0,
    )
