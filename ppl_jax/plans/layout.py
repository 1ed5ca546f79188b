"""Placing windows into fixed-shape batches: packing and length buckets.

Packing (for document protocols, whose windows are often shorter than a row): several windows
share a row as separate segments, each with its own positions and no attention across segments
(the segment ids reach the model's attention mask). A row holds at most `MAX_SEGMENTS` windows
(the step's sums per segment slot, and cuDNN's packed layout, are that wide). Windows are placed
best-fit decreasing (`_pack`): longest first, each into the fullest row it fits, with no limit
on segments at first. Best fit leaves the shortest windows for last, when the rows are already
full to the position, and the few rows that then take them hold far more than `MAX_SEGMENTS`:
such a row hands its shortest windows to rows with free segment slots, each time in exchange
for one of theirs as long as the windows it takes (within the two rows' free positions;
`_spread`), and only what no exchange places opens new rows. (Best fit within the limit from
the start strands those windows in rows of `MAX_SEGMENTS` nearly empty ones.) On documents of log-uniform length
up to the row this needs the least number of rows their tokens allow, or a row or two per
thousand more (`BENCHMARKS.md`).

Length buckets: batches may take the narrowest of a few fixed widths that holds their longest
row, so a run compiles one program per width used, not one per length. Unpacked rows are sorted
by length and cut into batches. Packed rows are full, and what wastes positions is the last
batch, partly empty rows: with buckets it holds the shortest windows, packed at the narrowest
width that fits them in one batch, and the other windows fill the full batches (`_narrow_tail`;
two programs at most, whatever the number of buckets); with one bucket every batch is
`seq_len + 1` wide and the last batch's empty rows are padding.

The layout depends only on the windows and the settings, so every process computes the same one
and runs the same number of steps.
"""

from __future__ import annotations

import bisect
import dataclasses
import itertools
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
      padding_fraction: positions of the batches that hold no token (the empty rows of the
        last batch included).
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


def _best_fit(
    lengths: np.ndarray, ids: np.ndarray, width: int, max_segments: int
) -> list[list[int]]:
    """Best-fit decreasing: each window of `ids` (longest first) goes into the fullest row it
    fits, among rows of fewer than `max_segments` windows; a window that fits none opens one."""
    order = ids[np.argsort(-lengths[ids], kind="stable")]
    rows: list[list[int]] = []
    free: list[tuple[int, int]] = []  # (free positions, row id), sorted
    for k in order.tolist():
        need = int(lengths[k])
        i = bisect.bisect_left(free, (need, -1))
        if i < len(free):
            room, row = free.pop(i)
            rows[row].append(k)
            room -= need
        else:
            rows.append([k])
            row, room = len(rows) - 1, width - need
        if room > 0 and len(rows[row]) < max_segments:
            bisect.insort(free, (room, row))
    return rows


def _exchange(
    sizes: list[int], donor_sizes: list[int], slots: int, room_o: int, room_a: int
) -> tuple[int, int, int] | None:
    """The exchange that moves the most windows out of an overfull row O (its window lengths
    `sizes`, ascending; `room_o` free positions) into a donor row A (`donor_sizes`; `room_a`
    free positions, `slots` free segment slots) for one of A's windows: `(j, k, z)`, A's window
    `j` goes to O and O's windows `0..k-2` and `z` (>= k - 1) go to A, both rows within the
    width; None if none moves two windows or more."""
    kmax = min(slots + 1, len(sizes))
    prefix = list(itertools.accumulate(sizes[:kmax], initial=0))  # prefix[i]: the i shortest
    best = None
    for j, s in enumerate(donor_sizes):
        lo, hi = s - room_o, s + room_a  # what O's windows moved to A may add up to
        # k windows add up to prefix[k] at least: start from the most that stay within `hi`.
        for k in range(min(kmax, bisect.bisect_right(prefix, hi) - 1), 1, -1):
            if best is not None and k <= best[1]:
                break
            base = prefix[k - 1]
            if base + sizes[-1] < lo:
                break  # fewer windows fall shorter still
            z = bisect.bisect_left(sizes, lo - base, lo=k - 1)
            if z < len(sizes) and base + sizes[z] <= hi:
                best = (j, k, z)
                break
    return best


def _spread(rows: list[list[int]], lengths: np.ndarray, width: int) -> list[list[int]]:
    """`rows` with none over `MAX_SEGMENTS` windows: each overfull row gives its shortest windows
    to rows with free segment slots (fewest windows first), each time in exchange for one of
    theirs of about the same length (`_exchange`); what no exchange places is packed into new
    rows (`_best_fit`)."""
    over = [i for i, r in enumerate(rows) if len(r) > MAX_SEGMENTS]
    if not over:
        return rows
    size = lengths.tolist()
    used = [sum(size[k] for k in r) for r in rows]
    donors = sorted(
        (i for i, r in enumerate(rows) if len(r) < MAX_SEGMENTS), key=lambda i: len(rows[i])
    )
    spilled: list[int] = []
    for o in over:
        items = sorted(rows[o], key=lambda k: (size[k], k))
        sizes = [size[k] for k in items]
        kept = []
        for at, a in enumerate(donors):
            if len(items) <= MAX_SEGMENTS:
                kept += donors[at:]
                break
            while len(items) > MAX_SEGMENTS and len(rows[a]) < MAX_SEGMENTS:
                found = _exchange(
                    sizes,
                    [size[k] for k in rows[a]],
                    MAX_SEGMENTS - len(rows[a]),
                    width - used[o],
                    width - used[a],
                )
                if found is None:
                    break
                j, k, z = found
                moved = items[: k - 1] + [items[z]]
                given = rows[a].pop(j)
                rows[a].extend(moved)
                delta = sum(sizes[: k - 1]) + sizes[z] - size[given]
                used[a] += delta
                used[o] -= delta
                del items[z], sizes[z]
                del items[: k - 1], sizes[: k - 1]
                place = bisect.bisect_left(sizes, size[given])
                items.insert(place, given)
                sizes.insert(place, size[given])
            # A donor that found no exchange is not asked again (the overfull rows are alike:
            # their shortest windows).
            if len(rows[a]) < MAX_SEGMENTS and len(items) <= MAX_SEGMENTS:
                kept.append(a)
        donors = kept
        if len(items) > MAX_SEGMENTS:
            cut = len(items) - MAX_SEGMENTS
            spilled += items[:cut]
            items = items[cut:]
        rows[o] = items
    if spilled:
        rows += _best_fit(lengths, np.asarray(spilled, np.int64), width, MAX_SEGMENTS)
    return rows


def _pack(lengths: np.ndarray, ids: np.ndarray, width: int) -> list[tuple[int, ...]]:
    """Rows of width `width` holding the windows `ids`, at most `MAX_SEGMENTS` each: best-fit
    decreasing with no limit on segments, then the overfull rows spread (`_spread`)."""
    if not ids.size:
        return []
    rows = _spread(_best_fit(lengths, ids, width, len(ids)), lengths, width)
    return [tuple(sorted(r)) for r in rows]


def _widths(used: np.ndarray, batch_size: int, allowed: list[int]) -> list[int]:
    """Per batch of `batch_size` consecutive rows (`used`: positions each row holds), the
    narrowest `allowed` width that holds its longest row."""
    return [
        next(w for w in allowed if w >= int(used[first : first + batch_size].max()))
        for first in range(0, len(used), batch_size)
    ]


def _used(rows: list[tuple[int, ...]], lengths: np.ndarray) -> np.ndarray:
    return np.asarray([int(lengths[list(r)].sum()) for r in rows], np.int64)


def _narrow_tail(
    lengths: np.ndarray, rows: list[tuple[int, ...]], batch_size: int, allowed: list[int]
) -> list[tuple[int, ...]]:
    """`rows` (the windows packed at the full width, `allowed[-1]`; `allowed` ascending) laid out
    again so that the last batch holds short windows at a narrower width, when one holds them in
    one batch: the full batches take the other windows, in as many rows as `rows` fills whole
    batches with. The tail is first the windows of the least filled rows beyond those (no
    window packed again; these are mostly the shortest windows, which the segment limit left
    over); else the shortest windows that the full batches cannot hold, with as much room to
    spare as lets the others fit. Returns `rows` unchanged where no narrower width does."""
    full = allowed[-1]
    cap = batch_size * (len(rows) // batch_size)  # the rows of the full batches
    by_use = np.argsort(_used(rows, lengths), kind="stable")
    rest = [rows[i] for i in np.sort(by_use[len(rows) - cap :])]
    tail = np.asarray([k for i in by_use[: len(rows) - cap] for k in rows[i]], np.int64)
    found = _tail(lengths, tail, rest, cap, batch_size, allowed)
    if found is not None:
        positions = batch_size * _positions(found, lengths, batch_size, allowed)
        if positions - cap * full <= 0.01 * positions:
            return found  # a last batch of at most 1% of the positions: no packing again
    best = found or rows
    order = np.argsort(lengths, kind="stable")  # shortest first
    cumulative = np.cumsum(lengths[order])
    beyond = max(0, int(cumulative[-1]) - cap * full)  # tokens the full batches cannot hold
    m, spare = 0, 0  # the tail's windows; positions the full batches may leave empty
    for _ in range(16):
        m = max(m, int(np.searchsorted(cumulative, beyond + spare)) + 1)
        m = min(m, order.size)
        if int(lengths[order[m - 1]]) >= full or m > batch_size * MAX_SEGMENTS:
            return best
        rest = _pack(lengths, order[m:], full)
        if len(rest) <= cap:
            found = _tail(lengths, order[:m], rest, cap, batch_size, allowed)
            break
        # The other windows did not fit: the tail takes as many more tokens and windows as the
        # rows beyond `cap` (the least filled) hold.
        extra = np.argsort(_used(rest, lengths), kind="stable")[: len(rest) - cap]
        spare += int(_used([rest[i] for i in extra], lengths).sum())
        m += sum(len(rest[i]) for i in extra)
    else:
        found = None
    if found is not None and _positions(found, lengths, batch_size, allowed) < _positions(
        best, lengths, batch_size, allowed
    ):
        return found
    return best


def _positions(
    rows: list[tuple[int, ...]], lengths: np.ndarray, batch_size: int, allowed: list[int]
) -> int:
    """Positions per row summed over the batches of `rows` (`_widths`)."""
    return sum(_widths(_used(rows, lengths), batch_size, allowed))


def _tail(
    lengths: np.ndarray,
    tail: np.ndarray,
    rest: list[tuple[int, ...]],
    cap: int,
    batch_size: int,
    allowed: list[int],
) -> list[tuple[int, ...]] | None:
    """`rest + ` the windows `tail` packed at the narrowest of the `allowed` widths but the last
    that puts them all in the batch after `cap` rows; None if none does."""
    if not tail.size or tail.size > batch_size * MAX_SEGMENTS:
        return None
    longest = int(lengths[tail].max())
    for width in allowed[:-1]:
        if width >= longest:
            rows = _pack(lengths, tail, width)
            if len(rest) + len(rows) <= cap + batch_size:
                return rest + rows
    return None


def plan_layout(
    windows: Windows, batch_size: int, pack: bool = False, num_buckets: int = 1
) -> Layout:
    """Places `windows` into batches of `batch_size` rows.

    Args:
      windows: the protocol's windows.
      batch_size: global rows per step.
      pack: put several windows in a row where they fit (at most `MAX_SEGMENTS`).
      num_buckets: how many row widths batches may use (1: every batch is `seq_len + 1` wide
        and unpacked rows keep the windows' order).

    Returns:
      The `Layout`.
    """
    full = windows.seq_len + 1
    lengths = windows.row_lengths()
    allowed = bucket_widths(windows.seq_len, num_buckets)
    if pack:
        rows = _pack(lengths, np.arange(windows.num_windows), full)
        if len(allowed) > 1 and len(rows) % batch_size:
            rows = _narrow_tail(lengths, rows, batch_size, allowed)
    else:
        rows = [(k,) for k in range(windows.num_windows)]
    used = _used(rows, lengths)
    if len(allowed) > 1 and not pack:
        order = np.argsort(used, kind="stable")
        rows = [rows[i] for i in order]
        used = used[order]
    widths = _widths(used, batch_size, allowed)
    total = sum(w * batch_size for w in widths)
    return Layout(
        rows=rows,
        widths=widths,
        batch_size=batch_size,
        max_segments=max((len(r) for r in rows), default=1),
        padding_fraction=1.0 - float(used.sum()) / total if total else 0.0,
    )
