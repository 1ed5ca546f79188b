"""What the state-carrying layers share (Mamba2's SSD scan in `ppl_jax.models.layers.ssd`, Gated
DeltaNet in `ppl_jax.models.layers.gated_delta`): where each document starts, the within-chunk
decays that stop there, the depthwise causal ("short") convolution that does not look across a
document start, and the gated RMSNorm of their outputs.

A layer runs its sequence part as `scan_chunk(inputs, state) -> (outputs, state)` over
consecutive tokens of each row (the contract of the context axis's state passing): the state
holds the recurrence's state, the last `K - 1` inputs of the convolution (`conv_after`) and the
segment id of the last token (`starts_after`), so a row cut in parts scores as one.

A row of the scorer may hold several segments (packed windows or documents, `segment_ids`, 0
for padding). A recurrent layer restarts at every segment start, as if each segment were alone
in its row: its state is zero before the segment's first token, and its convolution sees zeros
before it. A segment starts where a token's segment id differs from the previous token's (and at
the row's first token); the ids are compared, never the positions, so windows that continue a
document at a position past 0 still start afresh.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from ppl_jax.models.layers import context


def segment_starts(segment_ids: jax.Array) -> jax.Array:
    """`[B, T] bool`: True where a segment starts (the row's first token, and every token whose
    segment id differs from the previous token's). `segment_ids`: `[B, T]` int."""
    previous = jnp.pad(segment_ids[:, :-1], ((0, 0), (1, 0)), constant_values=-1)
    return segment_ids != previous


def starts_after(segment_ids: jax.Array, last_segment: jax.Array) -> jax.Array:
    """`[B, T] bool`: `segment_starts` of tokens that follow, in their row, a token of segment
    `last_segment` (`[B]`; -1 where nothing precedes: the row's first token starts)."""
    previous = jnp.concatenate([last_segment[:, None], segment_ids[:, :-1]], axis=1)
    return segment_ids != previous


def since_start(starts: jax.Array) -> jax.Array:
    """`[B, T] int32`: each token's distance to the start of its segment (0 at the start), from
    `segment_starts`' flags."""
    t = jnp.arange(starts.shape[1], dtype=jnp.int32)
    last = jax.lax.cummax(jnp.where(starts, t, 0), axis=1)
    return t - last


def causal_conv(
    x: jax.Array, weight: jax.Array, bias: jax.Array | None, starts: jax.Array
) -> jax.Array:
    """The depthwise causal convolution of Mamba2 and Gated DeltaNet (transformers'
    `causal_conv1d_fn`: `nn.Conv1d(groups=channels, padding=K-1)` cut to the sequence), followed
    by SiLU, restarted at every segment start.

    `out[t] = silu(bias + sum_{s=0}^{K-1} weight[K-1-s] * x[t-s])`, the terms with `t - s` before
    the start of `t`'s segment left out (the zeros a segment sees before its first token).
    Computed in float32 (K shifted products, no `[T, T]` buffer).

    Args:
      x: `[B, T, *channels]`, any float dtype.
      weight: `[K, *channels]` (transformers' `conv1d.weight[c, 0, k]` at `[k, c]`).
      bias: `[*channels]` or None.
      starts: `[B, T] bool`, `segment_starts(segment_ids)`.

    Returns:
      `[B, T, *channels]` in `x.dtype`.
    """
    kernel = weight.shape[0]
    dist = since_start(starts)
    extra = (1,) * (x.ndim - 2)
    x32, w32 = x.astype(jnp.float32), weight.astype(jnp.float32)
    out = jnp.zeros(x.shape, jnp.float32)
    if bias is not None:
        out = out + bias.astype(jnp.float32)
    for s in range(min(kernel, x.shape[1])):  # K is 2-4: a few shifted products
        shifted = jnp.pad(x32[:, : x.shape[1] - s], ((0, 0), (s, 0)) + ((0, 0),) * len(extra))
        visible = (dist >= s).reshape(dist.shape + extra)
        out = out + jnp.where(visible, shifted, 0.0) * w32[kernel - 1 - s]
    return jax.nn.silu(out).astype(x.dtype)


def conv_after(
    x: jax.Array,
    weight: jax.Array,
    bias: jax.Array | None,
    segment_ids: jax.Array,
    tail: jax.Array,
    tail_segments: jax.Array,
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """`causal_conv` of tokens that follow, in their row, the tokens `tail` (the `K - 1` inputs
    before them, with their segment ids `tail_segments`, -1 for none): a row cut in parts.

    Args:
      x: `[B, L, *channels]`; weight, bias: as `causal_conv`; segment_ids: `[B, L]` int.
      tail: `[B, K - 1, *channels]`; tail_segments: `[B, K - 1]` int.

    Returns:
      (the convolution `[B, L, *channels]`, the new tail: the last `K - 1` inputs of
      `tail + x` and their segment ids).
    """
    keep = tail.shape[1]
    xs = jnp.concatenate([tail.astype(x.dtype), x], axis=1)
    segments = jnp.concatenate([tail_segments, segment_ids], axis=1)
    out = causal_conv(xs, weight, bias, segment_starts(segments))[:, keep:]
    return out, xs[:, xs.shape[1] - keep :], segments[:, segments.shape[1] - keep :]


def gated_rms_norm(
    x: jax.Array,
    gate: jax.Array,
    weight: jax.Array,
    eps: float,
    *,
    groups: int,
    norm_before_gate: bool,
) -> jax.Array:
    """The gated RMSNorm of the recurrent layers' outputs, in float32, returned in `x.dtype`.

    With `norm_before_gate` (Gated DeltaNet's `Qwen3NextRMSNormGated`, Falcon-H1's default):
    `w * rms_norm(x) * silu(gate)`; without (Mamba2's and Nemotron-H's `MambaRMSNormGated`,
    `norm_before_gate=False` in mamba_ssm): `w * rms_norm(x * silu(gate))`. The mean of squares
    is taken over each of `groups` equal parts of the last dim (Mamba2's `n_groups`; one per
    head for Gated DeltaNet).

    Args:
      x, gate: `[..., D]`.
      weight: broadcastable to `[..., D]` (`[D]`, or `[D // groups]` shared by the groups).
      eps: the epsilon under the square root.
      groups: the parts of D normalised apart.
      norm_before_gate: see above.
    """
    shape = x.shape
    h = x.astype(jnp.float32)
    g = jax.nn.silu(gate.astype(jnp.float32))
    if not norm_before_gate:
        h = h * g
    h = h.reshape(shape[:-1] + (groups, shape[-1] // groups))
    h = h * jax.lax.rsqrt(jnp.mean(h * h, axis=-1, keepdims=True) + eps)
    h = h.reshape(shape) * weight.astype(jnp.float32)
    if norm_before_gate:
        h = h * g
    return h.astype(x.dtype)


def run(scan_chunk, inputs, initial_state):
    """A layer's `scan_chunk(inputs, initial_state)` over whole rows (`[B, T, ...]` inputs):
    under a context axis, with the state passed from chunk to chunk in row order
    (`ppl_jax.models.layers.context.pass_state`); without one, the plain call."""
    return context.pass_state(scan_chunk, inputs, initial_state)


def chunk_decays(log_decay: jax.Array, starts: jax.Array) -> tuple[jax.Array, ...]:
    """The decays within chunks of a scan whose state is multiplied by `exp(log_decay[t])` at
    each token and zeroed at each segment start.

    Args:
      log_decay: `[B, N, C, H] float32`, `<= 0` (N chunks of C tokens, H heads).
      starts: `[B, N, C] bool`, the segment starts.

    Returns:
      pair: `[B, N, H, C, C]`, at `[i, j]` the decay from token j to token i of a chunk
        (`exp(sum_{j<t<=i} log_decay[t])`, 1 on the diagonal), 0 above the diagonal and where a
        segment starts in `(j, i]`. The sums are taken directly (masked cumulative sums, as
        transformers' `segment_sum`), not as differences of cumulative sums.
      from_start: `[B, N, C, H]`, the decay of the state entering the chunk up to token i
        (`exp(sum_{t<=i} log_decay[t])`), 0 once a segment has started in `[0, i]`.
      to_end: `[B, N, C, H]`, the decay from token j to the chunk's last token, 0 where a
        segment starts in `(j, C-1]`.
      through: `[B, N, H]`, the decay across the whole chunk (`from_start` of its last token).
    """
    c = log_decay.shape[2]
    a = jnp.moveaxis(log_decay, 3, 2)  # [B, N, H, C]
    lower = jnp.tril(jnp.ones((c, c), bool), -1)  # t > j: the terms of pair[t, j]
    # segsum[i, j] = sum_{j < t <= i} a[t]: a cumulative sum over i of a[i] masked to i > j.
    terms = jnp.where(lower, a[..., :, None], 0.0)
    segsum = jnp.cumsum(terms, axis=-2)
    count = jnp.cumsum(starts.astype(jnp.int32), axis=2)  # starts in [0, i]
    same = count[:, :, :, None] == count[:, :, None, :]  # no start in (j, i]  [B, N, C, C]
    visible = jnp.tril(jnp.ones((c, c), bool)) & same[:, :, None]
    pair = _exp(jnp.where(visible, segsum, -jnp.inf))
    carried = (count == 0)[..., None]  # [B, N, C, 1]
    from_start = jnp.where(carried, _exp(jnp.cumsum(log_decay, axis=2)), 0.0)
    to_end = jnp.moveaxis(pair[..., -1, :], 2, 3)  # row C-1 of pair: [B, N, C, H]
    through = from_start[:, :, -1]
    return pair, from_start, to_end, through


# Decays below exp(-80) (1.8e-35, above float32's smallest normal number 1.2e-38) are taken as
# zero: their terms are below any float32 sum they join, and subnormal numbers make the CPU's
# matrix products hundreds of times slower (measured: a Gated DeltaNet layer of 2 x 512 tokens
# went from 0.2 s to minutes).
_LOG_FLOOR = -80.0


def _exp(x: jax.Array) -> jax.Array:
    """`exp(x)`, 0 below `exp(_LOG_FLOOR)`; NaN for NaN (a NaN decay, e.g. from a NaN
    `A_log`, must reach the scorer's guard, not drop the state)."""
    return jnp.where(x <= _LOG_FLOOR, 0.0, jnp.exp(jnp.maximum(x, _LOG_FLOOR)))


def flush(x: jax.Array) -> jax.Array:
    """`x` with its subnormal values (below float32's smallest normal number) set to zero: a
    state that decays chunk after chunk would otherwise slow every product it enters."""
    return jnp.where(jnp.abs(x) < jnp.finfo(jnp.float32).tiny, 0.0, x)


def to_chunks(x: jax.Array, chunk: int, fill=0) -> jax.Array:
    """`[B, T, ...]` -> `[B, N, chunk, ...]`, `T` padded with `fill` to `N * chunk`."""
    b, t = x.shape[:2]
    n = -(-t // chunk)
    pad = [(0, 0), (0, n * chunk - t)] + [(0, 0)] * (x.ndim - 2)
    return jnp.pad(x, pad, constant_values=fill).reshape((b, n, chunk) + x.shape[2:])


def from_chunks(x: jax.Array, length: int) -> jax.Array:
    """`[B, N, C, ...]` -> `[B, length, ...]` (the inverse of `to_chunks`)."""
    b, n, c = x.shape[:3]
    return x.reshape((b, n * c) + x.shape[3:])[:, :length]
