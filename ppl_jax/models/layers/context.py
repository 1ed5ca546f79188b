"""The context axis: one window's tokens split over devices, and what layers need for it.

The mesh is `("data", "context", "model")` (`ppl_jax.runtime.mesh.make_mesh`). With `N` devices on
`context`, the scorer cuts each row's `T` model inputs into `2N` chunks `c_0 .. c_{2N-1}` of
`L = T / 2N` tokens and lays them out in the **load-balanced order** `load_balanced_order(T, N)`:
device `r` holds `c_r` then `c_{2N-1-r}`, so every device has the same share of the causal work
(MaxText's `context_parallel_load_balance`; Meta's context-parallel inference, arXiv 2411.01783).
Activations `[B, T, ...]` then carry `PartitionSpec("data", "context", ...)`. Per-token layers
need nothing; attention (`ppl_jax.models.layers.attention.attend`) all-gathers keys and values over
`context` (or passes them around a ring); sequence-carrying layers pass their state along the
chunks with `pass_state` or `prefix_state` below.

Everything here reads the mesh that `jax.set_mesh` set while tracing (the scorer sets its own);
without one, or with `context` of size 1, every function is the plain computation on the whole
row, in row order.

`settings` holds the two step settings that layers read while tracing: how attention crosses
the context axis (`all_gather` or `ring`) and how many tokens per-token layers take at once
(`per_token`; 0: the whole shard).
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
from collections.abc import Callable, Iterator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec

AXIS = "context"
CONTEXT_ATTENTION = ("all_gather", "ring")


@dataclasses.dataclass(frozen=True)
class Settings:
    """Step settings read by layers while the step is traced.

    Attributes:
      context_attention: `all_gather` (each device gathers a layer's keys and values over
        `context`, then attends its own queries) or `ring` (keys and values go round the
        devices in `N` steps, holding two shards at a time: for layers whose gathered keys and
        values do not fit).
      token_chunk: tokens per chunk of the per-token layers (`per_token`: the MLP, the
        vocabulary-blocked NLL) on each device; 0: all of the device's tokens at once.
    """

    context_attention: str = "all_gather"
    token_chunk: int = 0

    def __post_init__(self):
        if self.context_attention not in CONTEXT_ATTENTION:
            raise ValueError(
                f"context_attention {self.context_attention!r}: one of all_gather, ring"
            )
        if self.token_chunk < 0:
            raise ValueError(f"token_chunk={self.token_chunk} must be 0 or more")


_SETTINGS: contextvars.ContextVar[Settings] = contextvars.ContextVar("ppl_jax_context")


@contextlib.contextmanager
def settings(value: Settings) -> Iterator[Settings]:
    """Sets the step settings while tracing (the scorer wraps its lowering in this)."""
    token = _SETTINGS.set(value)
    try:
        yield value
    finally:
        _SETTINGS.reset(token)


def current() -> Settings:
    """The settings in force (the defaults outside `settings`)."""
    return _SETTINGS.get(Settings())


def context_size() -> int:
    """Devices along `context` of the mesh set by `jax.set_mesh` (1 without one)."""
    mesh = jax.sharding.get_abstract_mesh()
    return 1 if mesh.empty else int(dict(mesh.shape).get(AXIS, 1))


def load_balanced_order(t: int, n: int) -> np.ndarray:
    """`[t] int64`: the row index of each slot of the load-balanced order, chunks
    `[c_0, c_{2n-1}, c_1, c_{2n-2}, ..., c_{n-1}, c_n]` of `t / 2n` tokens each; `x[..., order]`
    lays a row out, `x[..., np.argsort(order)]` puts it back. The identity for `n = 1`.

    Raises:
      ValueError: `t` is not a multiple of `2n`.
    """
    if n == 1:
        return np.arange(t)
    if t % (2 * n):
        raise ValueError(f"{t} tokens do not split into {2 * n} equal chunks")
    size = t // (2 * n)
    chunks = [c for r in range(n) for c in (r, 2 * n - 1 - r)]
    return (np.asarray(chunks)[:, None] * size + np.arange(size)[None, :]).ravel()


def _chunk_slots(n: int) -> np.ndarray:
    """`[2n]`: the slot (in the gathered, load-balanced order) of each chunk `c_0 .. c_{2n-1}`."""
    order = [c for r in range(n) for c in (r, 2 * n - 1 - r)]
    return np.argsort(order)


def gather_rows(x: jax.Array, n: int) -> jax.Array:
    """Inside `shard_map` over `context`: the whole row of `x` (`[B, T / n, ...]` per device, in
    the load-balanced layout) gathered from every device, in row order (`[B, T, ...]`)."""
    full = jax.lax.all_gather(x, AXIS, axis=1, tiled=True)
    b, t = full.shape[:2]
    chunks = full.reshape(b, 2 * n, t // (2 * n), *full.shape[2:])
    return jnp.take(chunks, jnp.asarray(_chunk_slots(n)), axis=1).reshape(full.shape)


def shard_over_context(fn: Callable[..., Any], *args: Any, replicated: tuple[int, ...] = ()):
    """`fn(*args)` in a `shard_map` manual over `context` only (`data` and `model` stay with the
    partitioner): every argument but those at the `replicated` indices is `[B, T, ...]` split
    along `T`; the result is split likewise."""
    seq = PartitionSpec(None, AXIS)
    specs = tuple(PartitionSpec() if i in replicated else seq for i in range(len(args)))
    return jax.shard_map(fn, in_specs=specs, out_specs=seq, axis_names={AXIS}, check_vma=False)(
        *args
    )


def per_token(fn: Callable[[Any], Any], inputs: Any, chunk: int | None = None) -> Any:
    """`fn(inputs)` for a per-token `fn`, in chunks of at most `chunk` tokens per device.

    Args:
      fn: maps a pytree of `[rows, tokens, ...]` arrays to a pytree of `[rows, tokens, ...]`
        arrays, each token's outputs depending on its own inputs only (an MLP, a norm, the
        vocabulary-blocked NLL).
      inputs: a pytree of `[B, T, ...]` arrays (under a context mesh, `T` split over it).
      chunk: tokens per chunk (default: `current().token_chunk`); 0 or at least the device's
        tokens: `fn(inputs)` at once.

    Returns:
      `fn(inputs)`, computed `chunk` tokens of each device's shard at a time: a loop over the
      chunks reads each from the inputs (`dynamic_slice`) and writes its outputs into place in
      the whole result (`dynamic_update_slice`), so the largest temporaries of `fn` are those of
      `[B, chunk, ...]` and nothing of the row's size is made but the result itself. Each
      device's tokens stay on it (the row is seen as `[B, N, T / N]`, the shard cut into
      chunks); a last chunk that would run past the shard is moved back to end with it (its
      first tokens computed twice, to the same values).
    """
    chunk = current().token_chunk if chunk is None else chunk
    leaves, tree = jax.tree.flatten(inputs)
    b, t = leaves[0].shape[:2]
    n = context_size()
    local = t // n
    if not chunk or chunk >= local:
        return fn(inputs)
    rows = [_bits(x).reshape(b, n, local, *x.shape[2:]) for x in leaves]  # [B, N, T / N, ...]

    def piece(start):
        cut = [
            _value(jax.lax.dynamic_slice_in_dim(r, start, chunk, axis=2), x.dtype)
            for r, x in zip(rows, leaves, strict=True)
        ]
        return fn(jax.tree.unflatten(tree, [x.reshape(b * n, chunk, *x.shape[3:]) for x in cut]))

    shapes = jax.eval_shape(piece, 0)
    out_leaves, out_tree = jax.tree.flatten(shapes)
    whole = [jnp.zeros((b, n, local, *s.shape[2:]), _stored(s.dtype)) for s in out_leaves]

    def body(i, whole):
        start = jnp.minimum(i * chunk, local - chunk)
        got = jax.tree.leaves(piece(start))
        return [
            jax.lax.dynamic_update_slice_in_dim(
                w, _bits(y).reshape(b, n, chunk, *y.shape[2:]), start, 2
            )
            for w, y in zip(whole, got, strict=True)
        ]

    whole = jax.lax.fori_loop(0, -(-local // chunk), body, whole)
    return jax.tree.unflatten(
        out_tree,
        [
            _value(w, s.dtype).reshape(b, t, *w.shape[3:])
            for w, s in zip(whole, out_leaves, strict=True)
        ],
    )


# 16-bit floats are read from `per_token`'s inputs and written into its result as their bits:
# XLA:CPU has no bfloat16 dynamic slice or update and would otherwise keep each whole input and
# result in float32 (a `[T, embed]` float32 buffer each, converted at every chunk); on other
# backends the bitcast is free.
def _stored(dtype: Any) -> Any:
    return (
        jnp.uint16
        if jnp.dtype(dtype).itemsize == 2 and jnp.issubdtype(dtype, jnp.floating)
        else dtype
    )


def _bits(x: jax.Array) -> jax.Array:
    stored = _stored(x.dtype)
    return x if stored == x.dtype else jax.lax.bitcast_convert_type(x, stored)


def _value(x: jax.Array, dtype: Any) -> jax.Array:
    return x if x.dtype == dtype else jax.lax.bitcast_convert_type(x, dtype)


# ---------------------------------------------------------------- sequence-carrying layers


def _halves(tree: Any) -> tuple[Any, Any]:
    """A device's `[B, 2L, ...]` leaves as its two chunks (`c_r`, `c_{2N-1-r}`)."""
    first = jax.tree.map(lambda x: x[:, : x.shape[1] // 2], tree)
    second = jax.tree.map(lambda x: x[:, x.shape[1] // 2 :], tree)
    return first, second


def _join_halves(first: Any, second: Any) -> Any:
    return jax.tree.map(lambda a, b: jnp.concatenate([a, b], axis=1), first, second)


def _select(pred: jax.Array, a: Any, b: Any) -> Any:
    return jax.tree.map(lambda x, y: jnp.where(pred, x, y), a, b)


def pass_state(
    scan_chunk: Callable[[Any, Any], tuple[Any, Any]], inputs: Any, initial_state: Any
) -> tuple[Any, Any]:
    """A sequence-carrying layer over a row split on the context axis: the state flows through
    the chunks in row order `c_0, c_1, ..., c_{2N-1}`.

    The contract (for Mamba2's SSD scan, Gated DeltaNet, any recurrence):

    - `scan_chunk(inputs, state) -> (outputs, final_state)` runs the layer over consecutive
      tokens of each row starting from `state`: `inputs` and `outputs` are pytrees of
      `[B, L, ...]` arrays (the same `L` in and out), `state` and `final_state` pytrees of the same
      structure, shapes and dtypes (`[B, ...]`). It must handle segment starts itself: pass the
      segment ids (and whatever it needs, e.g. the last token's segment id, in the state) so
      that a packed row's next document starts from a reset state.
    - `inputs` are `[B, T, ...]` as the layer sees them (under a context mesh, in the
      load-balanced layout, `T` split over `context`); `initial_state` is the state before
      each row's first token (replicated).

    Without a context axis (or `N = 1`) this is `scan_chunk(inputs, initial_state)`. With `N`
    devices the state is passed from chunk to chunk: device `r` runs `c_r` when the state of
    `c_{r-1}` reaches it, the last device runs `c_{N-1}` and `c_N`, and the state comes back
    down through `c_{N+1} .. c_{2N-1}`: `2N` sequential steps of one chunk each, a
    `ppermute` of the state between them. The time is that of one device running the row
    (memory, not speed, is what the split buys); `prefix_state` is the parallel form for
    recurrences whose chunks compose.

    Returns:
      `(outputs, final_state)`: outputs `[B, T, ...]` in the layout of `inputs`, and the state
      after each row's last token (replicated).
    """
    n = context_size()
    if n == 1:
        return scan_chunk(inputs, initial_state)

    def body(inputs, state):
        r = jax.lax.axis_index(AXIS)
        first, second = _halves(inputs)
        out_shape = jax.eval_shape(lambda x, s: scan_chunk(x, s)[0], first, state)
        zeros = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), out_shape)
        plus = [(i, (i + 1) % n) for i in range(n)]
        minus = [(i, (i - 1) % n) for i in range(n)]

        def step(s, carry):
            state, out0, out1 = carry
            late = s >= n  # chunks c_N .. c_{2N-1} are each device's second half
            owner = jnp.where(late, 2 * n - 1 - s, s)
            chunk = _select(late, second, first)
            out, new = jax.lax.cond(r == owner, scan_chunk, lambda x, st: (zeros, st), chunk, state)
            mine = r == owner
            out0 = _select(mine & ~late, out, out0)
            out1 = _select(mine & late, out, out1)
            up = jax.lax.ppermute(new, AXIS, plus)
            down = jax.lax.ppermute(new, AXIS, minus)
            # After c_s the state goes to the owner of c_{s+1}: the next device up to c_{N-1},
            # the same one for c_N, the previous one after.
            state = _select(s < n - 1, up, _select(s == n - 1, new, down))
            return state, out0, out1

        state, out0, out1 = jax.lax.fori_loop(0, 2 * n, step, (state, zeros, zeros))
        # The last step (c_{2N-1}, on device 0) passed its final state down to device N - 1.
        final = jax.lax.psum(_select(r == n - 1, state, jax.tree.map(jnp.zeros_like, state)), AXIS)
        return _join_halves(out0, out1), final

    seq, rep = PartitionSpec(None, AXIS), PartitionSpec()
    return jax.shard_map(
        body, in_specs=(seq, rep), out_specs=(seq, rep), axis_names={AXIS}, check_vma=False
    )(inputs, initial_state)


def prefix_state(
    scan_chunk: Callable[[Any, Any], tuple[Any, Any]],
    summarize: Callable[[Any], Any],
    combine: Callable[[Any, Any], Any],
    apply: Callable[[Any, Any], Any],
    inputs: Any,
    initial_state: Any,
) -> tuple[Any, Any]:
    """`pass_state` for recurrences whose chunks compose, with every device working at once.

    Beside `scan_chunk` (the contract of `pass_state`) the layer gives its chunks' effect on
    the state as values that compose:

    - `summarize(inputs) -> summary`: a chunk's map from its initial to its final state (for a
      linear recurrence `h' = A h + b`: `A` and `b`, and what segment starts need, e.g. the
      chunk's first and last segment ids), from `[B, L, ...]` inputs;
    - `combine(earlier, later) -> summary`: the map of two consecutive chunks, associative;
    - `apply(summary, state) -> state`: the state after the chunk(s) from `state`.

    Each device summarises its two chunks, the `2N` summaries are all-gathered over `context`
    and folded in row order (on every device; they are small), each chunk's initial state is
    `apply(prefix before it, initial_state)`, and each device runs `scan_chunk` on its two
    chunks from those states: the time of two chunks plus two summaries, not `2N` chunks.

    Returns:
      `(outputs, final_state)` as `pass_state`; without a context axis
      `scan_chunk(inputs, initial_state)`.
    """
    n = context_size()
    if n == 1:
        return scan_chunk(inputs, initial_state)

    def body(inputs, state):
        r = jax.lax.axis_index(AXIS)
        first, second = _halves(inputs)
        mine = jax.tree.map(
            lambda a, b: jnp.stack([a, b]), summarize(first), summarize(second)
        )  # [2, ...]
        every = jax.lax.all_gather(mine, AXIS)  # [N, 2, ...]: device d holds c_d and c_{2N-1-d}
        summaries = [
            jax.tree.map(lambda x, c=c: x[c, 0] if c < n else x[2 * n - 1 - c, 1], every)
            for c in range(2 * n)
        ]
        prefix, states = None, [state]  # states[c]: the state before c_c; states[2N]: after
        for summary in summaries:
            prefix = summary if prefix is None else combine(prefix, summary)
            states.append(apply(prefix, state))
        stacked = jax.tree.map(lambda *xs: jnp.stack(xs), *states)  # [2N + 1, ...]
        before_first = jax.tree.map(lambda x: x[r], stacked)
        before_second = jax.tree.map(lambda x: x[2 * n - 1 - r], stacked)
        out0, _ = scan_chunk(first, before_first)
        out1, _ = scan_chunk(second, before_second)
        return _join_halves(out0, out1), jax.tree.map(lambda x: x[2 * n], stacked)

    seq, rep = PartitionSpec(None, AXIS), PartitionSpec()
    return jax.shard_map(
        body, in_specs=(seq, rep), out_specs=(seq, rep), axis_names={AXIS}, check_vma=False
    )(inputs, initial_state)
