"""Windows: the rows a protocol scores, batched in fixed shapes with explicit masks.

A window is a slice of a token array, optionally after one prefix token, with the row position of
its first scored target. A row holds at most `seq_len + 1` tokens: the model reads positions
`0..seq_len-1`, and position `j + 1` is the target of position `j` (the scorer makes the shift).
Every protocol (`ppl_jax.plans.protocols`) is a way of choosing these slices; batching, padding and
masking are the same for all, and windows of different documents share batches.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from ppl_jax.errors import ConfigError, DataError

NO_PREFIX = -1
FIELDS = ("starts", "lengths", "prefix", "first_scored", "document")  # per-window arrays


@dataclasses.dataclass(frozen=True)
class Windows:
    """The windows of a protocol over `tokens`.

    Attributes:
      tokens: `[N] int32`, the token ids the windows slice.
      starts: `[W] int64`, offset in `tokens` of each window's first sliced token.
      lengths: `[W] int64`, tokens sliced (plus the prefix, at most `seq_len + 1`).
      prefix: `[W] int32`, a token id placed before the slice, or `NO_PREFIX`.
      first_scored: `[W] int64`, row position of the first scored target (>= 1); every later
        position of the row is scored.
      document: `[W] int64`, the document a window lies in, or -1 if it spans documents.
      seq_len: model inputs per row.
    """

    tokens: np.ndarray
    starts: np.ndarray
    lengths: np.ndarray
    prefix: np.ndarray
    first_scored: np.ndarray
    document: np.ndarray
    seq_len: int

    def __post_init__(self):
        row = self.lengths + (self.prefix != NO_PREFIX)
        if self.num_windows and (
            row.max() > self.seq_len + 1
            or (self.first_scored < 1).any()
            or (self.first_scored >= row).any()
        ):
            raise ValueError("a window is longer than seq_len + 1 or scores nothing")

    @property
    def num_windows(self) -> int:
        return int(self.starts.size)

    def num_batches(self, batch_size: int) -> int:
        return math.ceil(self.num_windows / batch_size)

    def num_scored(self) -> np.ndarray:
        """`[W] int64`: scored targets per window."""
        return self.lengths + (self.prefix != NO_PREFIX) - self.first_scored

    def row_lengths(self) -> np.ndarray:
        """`[W] int64`: positions each window occupies in a row (its tokens plus any prefix)."""
        return self.lengths + (self.prefix != NO_PREFIX)

    def fill(self, row_windows: list[tuple[int, ...]], width: int) -> dict[str, np.ndarray]:
        """Batch rows holding the given windows, one after another in each row (packing).

        Args:
          row_windows: per row, the ids of the windows it holds (an empty tuple is a padding row).
          width: positions per row (at least each row's total length).

        Returns:
          `tokens: [R, width] int32`; `target_mask: [R, width] bool`, true where the token is a
          scored target (never a segment's first position); `segment_ids: [R, width] int32`,
          `s + 1` for the row's `s`-th window and 0 for padding; `positions: [R, width] int32`,
          restarting at 0 in each segment.
        """
        r = len(row_windows)
        tokens = np.zeros((r, width), np.int32)
        target_mask = np.zeros((r, width), bool)
        segment_ids = np.zeros((r, width), np.int32)
        positions = np.zeros((r, width), np.int32)
        for row, ids in enumerate(row_windows):
            at = 0
            for slot, k in enumerate(ids):
                begin = at
                if self.prefix[k] != NO_PREFIX:
                    tokens[row, at] = self.prefix[k]
                    at += 1
                start = int(self.starts[k])
                chunk = self.tokens[start : start + int(self.lengths[k])]
                tokens[row, at : at + chunk.size] = chunk
                at += chunk.size
                segment_ids[row, begin:at] = slot + 1
                positions[row, begin:at] = np.arange(at - begin)
                target_mask[row, begin + int(self.first_scored[k]) : at] = True
        return {
            "tokens": tokens,
            "target_mask": target_mask,
            "segment_ids": segment_ids,
            "positions": positions,
        }

    def rows(self, window_ids: np.ndarray) -> dict[str, np.ndarray]:
        """One row of width `seq_len + 1` per window (see `fill`); an id at or past
        `num_windows` is a padding row."""
        return self.fill(
            [(int(k),) if k < self.num_windows else () for k in window_ids], self.seq_len + 1
        )

    def scored_token_mask(self) -> np.ndarray:
        """`[N] bool`: which of `tokens` some window scores (prefix tokens are never targets)."""
        mask = np.zeros(self.tokens.size, bool)
        offset = (self.prefix != NO_PREFIX).astype(np.int64)
        for k in range(self.num_windows):
            lo = int(self.starts[k] + self.first_scored[k] - offset[k])
            mask[lo : int(self.starts[k] + self.lengths[k])] = True
        return mask


def make(
    tokens: np.ndarray, starts, lengths, first_scored, seq_len: int, prefix=None, document=None
) -> Windows:
    """Builds `Windows` from per-window lists (prefix and document default to none / -1)."""
    w = len(starts)
    as64 = lambda x: np.asarray(x, np.int64).reshape(w)  # noqa: E731
    return Windows(
        tokens=tokens,
        starts=as64(starts),
        lengths=as64(lengths),
        prefix=np.full(w, NO_PREFIX, np.int32) if prefix is None else np.asarray(prefix, np.int32),
        first_scored=as64(first_scored),
        document=np.full(w, -1, np.int64) if document is None else as64(document),
        seq_len=seq_len,
    )


def sliding(tokens: np.ndarray, seq_len: int, stride: int) -> Windows:
    """The `sliding` protocol's windows over one stream `t[0..N-1]` (ppl_jax's native default).

    Window `k` reads `t[k*S : k*S + L]` (`L = seq_len`, `S = stride`) and covers the targets
    `t[k*S + 1 : k*S + L + 1]`, of which it scores those no earlier window scored: window 0 scores
    targets 1..L, window k > 0 scores `(k-1)*S + L + 1 .. k*S + L`. Hence every token after the
    first is scored exactly once; a scored token sees at least `L - S + 1` tokens of context (or
    all before it); the last window may be partial and is padded, never dropped. There are
    `1 + ceil(max(0, N - 1 - L) / S)` windows; `S = L` gives disjoint windows.
    """
    n = tokens.size
    count = 1 + math.ceil(max(0, n - 1 - seq_len) / stride)
    starts = np.arange(count, dtype=np.int64) * stride
    lengths = np.minimum(seq_len + 1, n - starts)
    first = np.where(np.arange(count) == 0, 1, seq_len - stride + 1)
    return make(tokens, starts, lengths, first, seq_len)


def context_windows(
    tokens: np.ndarray, context_length: int, targets_per_window: int, first_target: int
) -> Windows:
    """Windows over one stream `t[0..N-1]` that score the targets `t[F:]` with context length `L`.

    A context-length sweep (`eval.context_lengths`) calls this once per length `L` with the same
    `F = first_target` (the sweep's longest length) and the same `S = targets_per_window`, so
    every length scores exactly the same targets, `t[F], ..., t[N-1]` (N - F of them, each
    once), and only the context differs. The targets are cut into blocks of `S`: the block of
    targets `t[a : a + S]` (`a = F, F + S, F + 2S, ...`, the last block clipped at N) is scored by
    the window that reads `t[a - L : a + S]`, whose row position `L` is the target `t[a]`
    (`first_scored = L`). The target `t[a + i]` therefore sees exactly `L + i` tokens of context,
    `t[a - L : a + i]`: between `L` and `L + S - 1` (at most `L + min(S, N - a) - 1` in the last
    block); its position in the window (the index of `nll_by_position`) is `L + i`. No prefix;
    `seq_len = L + S - 1`; there are `ceil((N - F) / S)` windows, which the model runs over
    `L + S` positions each (the last one fewer), so the sweep costs about `(N - F) * (L + S) / S`
    positions per length: `S = L` doubles the work of scoring each target once, a smaller `S`
    narrows the context range at a higher cost. Tokens before `F` are only context.

    Args:
      tokens: `[N] int32`, the stream (any BOS token already in it counts as context).
      context_length: `L >= 1`, tokens of context of a block's first target.
      targets_per_window: `S >= 1`, targets each window scores.
      first_target: `F >= L`, index in `tokens` of the first scored target.

    Raises:
      ConfigError: `L < 1`, `S < 1` or `F < L`.
      DataError: the stream has no target (`N <= F`): the message names N, F and the length.
    """
    n, length, block, first = (
        int(tokens.size),
        int(context_length),
        int(targets_per_window),
        int(first_target),
    )
    if length < 1 or block < 1 or first < length:
        raise ConfigError(
            f"A context-length sweep needs a context length >= 1, targets per window >= 1 and "
            f"the first target at or after the context length; got {length}, {block} and "
            f"{first}: check eval.context_lengths."
        )
    if n <= first:
        raise DataError(
            f"The token stream holds {n:,} tokens, but a context-length sweep up to {first:,} "
            f"tokens scores only the tokens after the first {first:,}, so nothing is left to "
            f"score; use a longer corpus or shorter eval.context_lengths."
        )
    targets = np.arange(first, n, block, dtype=np.int64)
    starts = targets - length
    lengths = np.minimum(length + block, n - starts)
    return make(tokens, starts, lengths, np.full(targets.size, length), length + block - 1)


def short_windows(windows: Windows, context: int, targets_per_window: int) -> Windows:
    """The windows that score the targets of `windows` again with a short context: the LongPPL
    reference's short windows (`find_key_token`: `trunc_len` = C, `sliding_window` = S), per
    window of `windows`.

    For a window whose row is `r[0..R-1]` (no prefix token) scoring the row positions
    `f .. R-1`, the targets at positions `p >= F = max(C, f)` are cut into blocks of S from F:
    the block of targets `r[a : a + S]` (`a = F, F + S, ...`, the last one clipped at R) is
    scored by a window that reads `r[a - C : a + S]`, so the target `r[a + i]` sees exactly
    `C + i` tokens of context (between C and C + S - 1), all of them within the context it has
    in its own window. Targets at positions below C have no short window (their context is not
    longer than C). With `f <= C` (a document scored from its first token, as the reference
    does), the blocks are the reference's: targets `[s + C, s + C + S)` from `[s, s + C + S)`,
    `s = 0, S, 2S, ...` in the document, the last block clipped at its end.

    Args:
      windows: windows without prefix tokens (`whole_documents`, and the stream protocols).
      context: C >= 1; targets_per_window: S >= 1.

    Returns:
      Windows over the same `tokens` (`seq_len = C + S - 1`, `first_scored = C`, each window's
      `document` its source window's), in the order of their source windows and targets.

    Raises:
      ValueError: a window with a prefix token, or C, S below 1 (the caller checks settings).
    """
    if context < 1 or targets_per_window < 1:
        raise ValueError(f"short windows need C >= 1 and S >= 1: {context}, {targets_per_window}")
    if (windows.prefix != NO_PREFIX).any():
        raise ValueError("short windows are cut from windows without a prefix token")
    first = np.maximum(windows.first_scored, context)
    count = np.maximum(0, -(-(windows.lengths - first) // targets_per_window))
    source = np.repeat(np.arange(windows.num_windows), count)
    block = np.arange(source.size) - np.repeat(np.cumsum(count) - count, count)
    a = first[source] + block * targets_per_window  # the block's first target, in its row
    starts = windows.starts[source] + a - context
    lengths = np.minimum(context + targets_per_window, windows.lengths[source] - (a - context))
    return make(
        windows.tokens,
        starts,
        lengths,
        np.full(source.size, context),
        context + targets_per_window - 1,
        document=windows.document[source],
    )
