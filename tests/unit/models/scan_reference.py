"""NumPy float64 token-by-token references of the state-carrying layers, written from their
definitions (the recurrences of `ppl_jax.models.layers.gated_delta` and `ppl_jax.models.layers.ssd`,
which are transformers' `torch_recurrent_gated_delta_rule` and `mamba2_selective_state_update`), one
token at a time, restarting at every change of segment id. Used by test_gated_delta.py and
test_ssd.py."""

from __future__ import annotations

import numpy as np


def starts_of(segment_ids: np.ndarray) -> np.ndarray:
    """`[B, T] bool`: a segment starts at the row's first token and wherever the id changes."""
    seg = np.asarray(segment_ids)
    out = np.ones(seg.shape, bool)
    out[:, 1:] = seg[:, 1:] != seg[:, :-1]
    return out


def silu(x):
    return x / (1.0 + np.exp(-x))


def softplus(x):
    return np.log1p(np.exp(-np.abs(x))) + np.maximum(x, 0.0)


def causal_conv(x, weight, bias, segment_ids):
    """`x [B, T, C]`, `weight [K, C]` -> silu of the causal depthwise convolution, each token
    seeing only the tokens of its own segment."""
    x, weight = np.asarray(x, np.float64), np.asarray(weight, np.float64)
    starts = starts_of(segment_ids)
    bsz, t = x.shape[:2]
    kern = weight.shape[0]
    out = np.zeros(x.shape)
    for row in range(bsz):
        begin = 0
        for i in range(t):
            if starts[row, i]:
                begin = i
            acc = np.zeros(x.shape[2:]) if bias is None else np.asarray(bias, np.float64).copy()
            for s in range(kern):
                if i - s >= begin:
                    acc = acc + weight[kern - 1 - s] * x[row, i - s]
            out[row, i] = silu(acc)
    return out


def gated_delta(q, k, v, g, beta, segment_ids, initial_state=None):
    """The gated delta rule, token by token: `o [B, T, Hv, Dv]`, final state `[B, Hv, Dk, Dv]`.
    q, k `[B, T, Hk, Dk]` (used as given), v `[B, T, Hv, Dv]`, g and beta `[B, T, Hv]`."""
    q, k, v, g, beta = (np.asarray(a, np.float64) for a in (q, k, v, g, beta))
    bsz, t, hk, dk = k.shape
    hv, dv = v.shape[2:]
    r = hv // hk
    starts = starts_of(segment_ids)
    o = np.zeros((bsz, t, hv, dv))
    final = np.zeros((bsz, hv, dk, dv))
    for row in range(bsz):
        state = (
            np.zeros((hv, dk, dv))
            if initial_state is None
            else np.asarray(initial_state[row], np.float64).copy()
        )
        for i in range(t):
            if starts[row, i]:
                state[:] = 0.0
            for h in range(hv):
                kh = k[row, i, h // r]
                s = state[h] * np.exp(g[row, i, h])
                delta = beta[row, i, h] * (v[row, i, h] - s.T @ kh)
                s = s + np.outer(kh, delta)
                state[h] = s
                o[row, i, h] = s.T @ q[row, i, h // r]
        final[row] = state
    return o, final


def ssd(x, dt, a, b, c, segment_ids, initial_state=None):
    """The Mamba2 recurrence without the D skip, token by token: `y [B, T, H, P]`, final state
    `[B, H, P, N]`. x `[B, T, H, P]`, dt `[B, T, H]`, a `[H]`, b and c `[B, T, G, N]`."""
    x, dt, a, b, c = (np.asarray(z, np.float64) for z in (x, dt, a, b, c))
    bsz, t, h, p = x.shape
    g, n = b.shape[2:]
    hg = h // g
    starts = starts_of(segment_ids)
    y = np.zeros(x.shape)
    final = np.zeros((bsz, h, p, n))
    for row in range(bsz):
        state = (
            np.zeros((h, p, n))
            if initial_state is None
            else np.asarray(initial_state[row], np.float64).copy()
        )
        for i in range(t):
            if starts[row, i]:
                state[:] = 0.0
            for head in range(h):
                grp = head // hg
                state[head] = np.exp(dt[row, i, head] * a[head]) * state[head] + dt[
                    row, i, head
                ] * np.outer(x[row, i, head], b[row, i, grp])
                y[row, i, head] = state[head] @ c[row, i, grp]
        final[row] = state
    return y, final
