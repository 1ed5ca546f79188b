"""The journal of a run: the per-window sums of every batch fetched so far, so that an interrupted
run resumes where it stopped and ends with the numbers of an uninterrupted one, bit for bit.

`journal.npz` in `output.dir` holds, for every window of the run's layout, its NLL sum (float64,
nats; the device's float32 value widened, so exact), scored tokens, predictive-entropy sum and
top-1 count, plus which batches are done and the run's fingerprint (`ppl_jax.runtime.fingerprint`). It is
written by process 0 every `output.journal_every` fetched batches and when the run stops on a
signal, atomically (`ppl_jax.outputs.folder`), and removed when the results are written. A run that
finds a journal of the same fingerprint skips its finished batches; a journal of another
fingerprint is refused with the parts that changed. On several processes, process 0 reads the
journal and broadcasts it, so every process skips the same batches.
"""

from __future__ import annotations

import dataclasses
import io
import json
import zipfile
from typing import Any

import numpy as np

from ppl_jax.errors import ConfigError
from ppl_jax.outputs import files
from ppl_jax.outputs.folder import OutputDir
from ppl_jax.runtime import fingerprint as fingerprint_lib

NAME = files.JOURNAL
VERSION = 1


@dataclasses.dataclass
class State:
    """The journal's contents.

    Attributes:
      window_nll: `[W] float64`, nats; window_tokens, window_correct: `[W] int64`;
        window_entropy: `[W] float64`, nats: per-window sums (zero where not yet scored).
      batch_done: `[B] bool`, the batches of the layout whose sums are in.
    """

    window_nll: np.ndarray
    window_tokens: np.ndarray
    window_entropy: np.ndarray
    window_correct: np.ndarray
    batch_done: np.ndarray

    @staticmethod
    def empty(num_windows: int, num_batches: int) -> State:
        return State(
            window_nll=np.zeros(num_windows, np.float64),
            window_tokens=np.zeros(num_windows, np.int64),
            window_entropy=np.zeros(num_windows, np.float64),
            window_correct=np.zeros(num_windows, np.int64),
            batch_done=np.zeros(num_batches, bool),
        )

    def arrays(self) -> dict[str, np.ndarray]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}


def load(
    out: OutputDir, parts: dict[str, Any], num_windows: int, num_batches: int, name: str = NAME
) -> State | None:
    """The journal in `out` if it belongs to this run, else None if there is none.

    Raises:
      ConfigError: the journal was written by a run with another fingerprint (the message names
        what changed and how to start afresh), or it cannot be read.
    """
    path = out.file(name)
    try:
        with np.load(path, allow_pickle=False) as z:
            stored = json.loads(str(z["fingerprint"]))
            arrays = {f.name: z[f.name] for f in dataclasses.fields(State)}
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, zipfile.BadZipFile) as e:
        raise ConfigError(
            f"{path!r} is not a readable journal ({e}); delete it to start the run afresh."
        ) from None
    if stored != parts:
        changed = "; ".join(fingerprint_lib.differences(stored, parts))
        raise ConfigError(
            f"{path!r} is the journal of another run, which differs in: {changed}. Run the same "
            f"command as before to resume it, or delete the journal (or set "
            f"--config.output.resume=false, or choose another output.dir) to start afresh."
        )
    state = State(**arrays)
    if state.window_nll.shape != (num_windows,) or state.batch_done.shape != (num_batches,):
        raise ConfigError(
            f"{path!r} does not fit this run's {num_windows} windows in {num_batches} batches; "
            f"delete it to start the run afresh."
        )
    return state


def save(out: OutputDir, parts: dict[str, Any], state: State, name: str = NAME) -> str:
    """Writes the journal atomically; returns its path."""
    buf = io.BytesIO()
    np.savez(buf, fingerprint=np.asarray(json.dumps(parts, sort_keys=True)), **state.arrays())
    return out.write_bytes(name, buf.getvalue())


def load_everywhere(
    out: OutputDir | None,
    parts: dict[str, Any],
    num_windows: int,
    num_batches: int,
    name: str = NAME,
) -> State | None:
    """Process 0's journal (`load` from `out`) on every process; every process calls this.

    Raises:
      ConfigError: on every process when process 0 refuses its journal (process 0 raises the
        reason; the others say that process 0 refused it), so that no process waits for another.
    """
    state, error = None, None
    if out is not None:
        try:
            state = load(out, parts, num_windows, num_batches, name)
        except ConfigError as e:
            error = e
    return broadcast(state, num_windows, num_batches, error)


def broadcast(
    state: State | None, num_windows: int, num_batches: int, error: ConfigError | None = None
) -> State | None:
    """Process 0's journal on every process (a no-op on one process).

    Every process calls this with the same sizes; only process 0's `state` and `error` are read.

    Raises:
      ConfigError: process 0's `error`, on every process.
    """
    import jax
    from jax.experimental import multihost_utils

    if jax.process_count() == 1:
        if error is not None:
            raise error
        return state
    code = 2 if error is not None else int(state is not None)
    flag = int(multihost_utils.broadcast_one_to_all(np.asarray(code, np.int32)))
    if flag == 2:
        raise error or ConfigError(
            "process 0 refused the journal in its output.dir (its message says what changed); "
            "the run is stopped."
        )
    if not flag:
        return None
    local = state if state is not None else State.empty(num_windows, num_batches)
    # Exact through the broadcast (JAX runs in 32 bits): 64-bit values travel as int32 pairs.
    arrays = {
        name: (a.astype(np.int32) if a.dtype == bool else a.view(np.int32))
        for name, a in local.arrays().items()
    }
    got = {
        k: np.array(v, np.int32) for k, v in multihost_utils.broadcast_one_to_all(arrays).items()
    }
    template = State.empty(num_windows, num_batches).arrays()
    return State(
        **{
            name: (got[name].astype(bool) if a.dtype == bool else got[name].view(a.dtype))
            for name, a in template.items()
        }
    )


class Recorder:
    """Keeps a run's journal up to date as its batches are fetched: an observer of the scoring
    loop (`ppl_jax.scoring.observers.ScoreObserver`) whose `state` the loop fills.

    Args:
      out: the output folder (process 0), or None on the other processes (nothing written).
      parts: the run's fingerprint.
      state: the journal to continue (a resumed run's) or `State.empty`; the scorer fills its
        arrays in place.
      every: fetched batches between two flushes.
    """

    def __init__(
        self,
        out: OutputDir | None,
        parts: dict[str, Any],
        state: State,
        every: int,
        name: str = NAME,
    ):
        self.out, self.parts, self.state, self.every = out, parts, state, max(1, int(every))
        self.name = name
        self.resumed_batches = int(state.batch_done.sum())
        self.resumed_tokens = int(state.window_tokens.sum())
        self._since_flush = 0

    def should_stop(self, i: int) -> bool:
        return False

    def on_batch(self, i: int, rows: Any, host: Any) -> None:
        """Marks batch `i` done (its sums are in `state`); flushes every `every` batches."""
        self.state.batch_done[i] = True
        self._since_flush += 1
        if self._since_flush >= self.every:
            self.save()

    def save(self) -> str | None:
        """Writes the journal now (process 0); returns its path."""
        self._since_flush = 0
        return save(self.out, self.parts, self.state, self.name) if self.out is not None else None

    def close(self) -> None:
        """Nothing to do: the owner saves the journal (a stopped run) or discards it (once the
        results are written)."""

    def discard(self) -> None:
        """Removes the journal (once the results are written)."""
        if self.out is not None:
            self.out.remove(self.name)
