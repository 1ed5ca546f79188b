"""`ppl_jax.harness.transport`: what process 0 sends is what the others receive, in chunks, with
padded shapes; the multi-process broadcast itself is exercised in
tests/multiprocess/test_harness_processes.py."""

from __future__ import annotations

import numpy as np
import pytest

from ppl_jax.harness import transport


@pytest.fixture
def wire(monkeypatch):
    """Two processes in one: `send` (process 0) appends each broadcast to a list, `receive`
    (another process) takes them in order; shapes must agree, as in a real broadcast."""
    sent: list[np.ndarray] = []
    state = {"sending": True}

    def broadcast(x):
        if state["sending"]:
            sent.append(x.copy())
            return x
        got = sent.pop(0)
        assert got.shape == x.shape and got.dtype == x.dtype
        return got

    monkeypatch.setattr(transport, "_broadcast", broadcast)
    monkeypatch.setattr(transport.jax, "process_count", lambda: 2)
    monkeypatch.setattr(transport, "CHUNK", 7)
    monkeypatch.setattr(transport, "MIN_PAYLOAD", 4)
    return sent, state


def test_arrays_arrive_whole_and_in_order(wire):
    sent, state = wire
    rng = np.random.default_rng(0)
    arrays = [rng.integers(-(2**31), 2**31 - 1, n, dtype=np.int64) for n in (0, 1, 5, 23, 3)]
    transport.send(transport.LOGLIKELIHOOD, arrays)
    transport.send(transport.ROLLING, [np.zeros(0, np.int32)])
    transport.send(transport.STOP, [])
    assert all(b.size in (4, 8, 16) for b in sent)  # the header (16) and chunks padded to 2^k
    state["sending"] = False
    op, got = transport.receive()
    assert op == transport.LOGLIKELIHOOD
    assert [g.tolist() for g in got] == [a.tolist() for a in arrays]
    op, got = transport.receive()
    assert op == transport.ROLLING and [g.size for g in got] == [0]
    assert transport.receive() == (transport.STOP, [])
    assert not sent


def test_values_outside_int32_are_refused(wire):
    with pytest.raises(ValueError, match="int32"):
        transport.send(transport.LOGLIKELIHOOD, [np.asarray([2**31])])


def test_join_and_split_are_inverse():
    parts = [[1, 2], [], [3], [4, 5, 6]]
    flat, offsets = transport.join(parts)
    assert flat.dtype == np.int32 and offsets.tolist() == [0, 2, 2, 3, 6]
    assert [p.tolist() for p in transport.split(flat, offsets)] == parts
