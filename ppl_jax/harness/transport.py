"""Requests from process 0 to every process: host NumPy through `multihost_utils`, once per call.

lm-evaluation-harness runs on process 0 only. Each call it makes (`loglikelihood`,
`loglikelihood_rolling`) is tokenized there and sent to every process as one message: a fixed
`[HEADER] int32` header (the operation and the lengths of its arrays) and then the `int32` payload
holding every array end to end, in chunks of at most `CHUNK` values, each padded to a power of two
so that the broadcast compiles for a few shapes only. Both go through `jax.experimental.multihost_utils.broadcast_one_to_all` (a psum
over the global devices: every process must take part, so it is also the point where a lost
process is noticed; `ppl_jax.runtime.distributed` then ends the run within its heartbeat timeout).
The end of a session is the operation `STOP`. With one process nothing is sent.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import numpy as np

HEADER = 16  # int32 slots: the operation, the number of arrays, then each array's length
STOP, LOGLIKELIHOOD, ROLLING = 0, 1, 2
MIN_PAYLOAD = 1024
CHUNK = 1 << 24  # int32 values per broadcast (64 MiB): a large call goes in several


def _broadcast(x: np.ndarray) -> np.ndarray:
    from jax.experimental import multihost_utils

    return np.asarray(multihost_utils.broadcast_one_to_all(x))


def send(op: int, arrays: Sequence[np.ndarray]) -> None:
    """Sends `op` and `arrays` (each 1-D, int32-valued) from process 0 to every process (which
    take them with `receive`). With one process: nothing.

    Raises:
      ValueError: more than `HEADER - 2` arrays, or values outside int32.
    """
    if jax.process_count() == 1:
        return
    if len(arrays) > HEADER - 2:
        raise ValueError(f"at most {HEADER - 2} arrays per message")
    flat = [np.asarray(a).reshape(-1) for a in arrays]
    for a in flat:
        if a.size and (a.min() < np.iinfo(np.int32).min or a.max() > np.iinfo(np.int32).max):
            raise ValueError("message values must fit in int32")
    header = np.zeros(HEADER, np.int32)
    header[0], header[1] = op, len(flat)
    header[2 : 2 + len(flat)] = [a.size for a in flat]
    _broadcast(header)
    if op == STOP:
        return
    payload = np.concatenate(flat).astype(np.int32) if flat else np.zeros(0, np.int32)
    for start in range(0, max(payload.size, 1), CHUNK):
        piece = payload[start : start + CHUNK]
        padded = np.zeros(_padded(piece.size), np.int32)
        padded[: piece.size] = piece
        _broadcast(padded)


def receive() -> tuple[int, list[np.ndarray]]:
    """On a process other than 0: waits for process 0's next `send`; returns (op, arrays)."""
    header = _broadcast(np.zeros(HEADER, np.int32))
    op, count = int(header[0]), int(header[1])
    if op == STOP:
        return op, []
    sizes = [int(s) for s in header[2 : 2 + count]]
    total = sum(sizes)
    pieces = []
    for start in range(0, max(total, 1), CHUNK):
        n = min(CHUNK, total - start)
        pieces.append(_broadcast(np.zeros(_padded(n), np.int32))[:n])
    payload = np.concatenate(pieces)
    cuts = np.cumsum([0, *sizes])
    return op, [payload[cuts[i] : cuts[i + 1]].copy() for i in range(count)]


def _padded(n: int) -> int:
    return max(MIN_PAYLOAD, 1 << max(0, int(n - 1).bit_length()))


def split(flat: np.ndarray, offsets: np.ndarray) -> list[np.ndarray]:
    """The parts `flat[offsets[i]:offsets[i + 1]]` of a concatenation."""
    return [flat[offsets[i] : offsets[i + 1]] for i in range(offsets.size - 1)]


def join(parts: Sequence[Sequence[int]]) -> tuple[np.ndarray, np.ndarray]:
    """(`[N] int32` concatenation of `parts`, `[len(parts) + 1] int32` offsets)."""
    offsets = np.cumsum([0] + [len(p) for p in parts]).astype(np.int64)
    flat = (
        np.concatenate([np.asarray(p, np.int64) for p in parts]) if parts else np.zeros(0, np.int64)
    )
    return flat.astype(np.int32), offsets.astype(np.int32)
