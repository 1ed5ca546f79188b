"""Gated DeltaNet (Yang, Kautz & Hatamizadeh 2025, "Gated Delta Networks"), the linear-attention
layer of Qwen3-Next and Qwen3.5, forward only, with its state in float32.

The recurrence, per value head (transformers' `torch_recurrent_gated_delta_rule`), with the state
`S [Dk, Dv]` zero at each segment start (`ppl_jax.models.layers.recurrence`):

    S = exp(g_t) * S
    S = S + k_t (beta_t * (v_t - S^T k_t))^T       (the delta rule)
    o_t = S^T q_t

`chunk_gated_delta_rule` computes it by chunks of C tokens (Yang et al. 2024, "Parallelizing
Linear Transformers with the Delta Rule over Sequence Length"; transformers'
`torch_chunk_gated_delta_rule`): inside a chunk, the C delta-rule updates are folded into one
lower-triangular solve (the UT transform, by blocks and forward substitution) and a masked
`[C, C]` product; across chunks a `lax.scan` carries the state. Only `[C, C]` blocks exist per
head, never `[T, T]`. The chunk size changes no number beyond float32 rounding.

`GatedDeltaNet` is the whole layer of Qwen3.5 (`Qwen3_5GatedDeltaNet`): projections to q, k, v,
the output gate z, beta (`b`) and the decay's input (`a`); the depthwise causal convolution with
SiLU over q, k and v; q and k L2-normalised (`x * rsqrt(sum(x^2) + 1e-6)`, in float32) and q
scaled by `Dk ** -0.5`; `beta = sigmoid(b)`, `g = -exp(A_log) * softplus(a + dt_bias)`; the
delta rule; the gated RMSNorm per value head (`w * rms_norm(o) * silu(z)`); the output
projection. Each key head serves `Hv / Hk` consecutive value heads (grouped value attention).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from ppl_jax.models.layers import recurrence
from ppl_jax.models.layers.core import normal_param, ones_param

DEFAULT_CHUNK = 64  # transformers' torch_chunk_gated_delta_rule and FLA's chunk size


def chunk_gated_delta_rule(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    g: jax.Array,
    beta: jax.Array,
    starts: jax.Array,
    *,
    chunk: int = DEFAULT_CHUNK,
    initial_state: jax.Array | None = None,
) -> tuple[jax.Array, jax.Array]:
    """The gated delta rule over a batch of rows, by chunks (see the module docstring).

    Args:
      q, k: `[B, T, Hk, Dk]`, as the recurrence uses them (normalised and scaled by the caller).
      v: `[B, T, Hv, Dv]`, `Hv` a multiple of `Hk`; key head `h` serves value heads
        `h * Hv/Hk ... (h + 1) * Hv/Hk - 1` (transformers' `repeat_interleave`).
      g: `[B, T, Hv]`, the log of the state's decay at each token (`<= 0`).
      beta: `[B, T, Hv]`, the delta rule's step size.
      starts: `[B, T] bool`, where segments start (`recurrence.segment_starts`): the state is
        zero before each.
      chunk: tokens per chunk (any positive size; T is padded to a multiple).
      initial_state: `[B, Hv, Dk, Dv]`, the state before the first token, or None for zeros;
        it reaches the tokens before the row's first start only (none when `starts[:, 0]`, as
        `segment_starts` always says: it serves a row continued from an earlier part).

    Returns:
      (o `[B, T, Hv, Dv] float32`, the state after the last token `[B, Hv, Dk, Dv] float32`).
    """
    b, t, hk, dk = k.shape
    hv, dv = v.shape[2:]
    r = hv // hk
    f32 = jnp.float32
    # [B, N, C, ...] chunks; value heads split as (key head, r).
    q, k = (recurrence.to_chunks(x.astype(f32), chunk) for x in (q, k))
    v = recurrence.to_chunks(v.astype(f32), chunk).reshape(q.shape[:3] + (hk, r, dv))
    g = recurrence.to_chunks(g.astype(f32), chunk)
    beta = recurrence.to_chunks(beta.astype(f32), chunk).reshape(q.shape[:3] + (hk, r))
    pair, from_start, to_end, through = recurrence.chunk_decays(
        g, recurrence.to_chunks(starts, chunk)
    )
    n, c = q.shape[1], q.shape[2]
    pair = pair.reshape(b, n, hk, r, c, c)
    from_start, to_end = (x.reshape(b, n, c, hk, r) for x in (from_start, to_end))

    kk = jnp.einsum("bnihd,bnjhd->bnhij", k, k)  # [B, N, Hk, C, C]
    qk = jnp.einsum("bnihd,bnjhd->bnhij", q, k)
    strict = jnp.tril(jnp.ones((c, c), bool), -1)
    beta_i = jnp.moveaxis(beta, 2, 4)[..., :, None]  # [B, N, Hk, r, C, 1]
    ut = jnp.where(strict, beta_i * kk[:, :, :, None] * pair, 0.0)  # strictly lower
    intra = qk[:, :, :, None] * pair  # [B, N, Hk, r, C, C], lower with the diagonal
    # The UT transform: (I + ut) [u | w] = [beta v | beta k exp(G)], unit lower triangular.
    k_beta = k[:, :, :, :, None, :] * beta[..., None]  # [B, N, C, Hk, r, Dk]
    rhs = jnp.concatenate([v * beta[..., None], k_beta * from_start[..., None]], axis=-1)
    rhs = jnp.moveaxis(rhs, 2, 4)  # [B, N, Hk, r, C, Dv + Dk]
    solved = unit_lower_inverse(ut) @ rhs
    u, w = solved[..., :dv], solved[..., dv:]
    q_in = jnp.moveaxis(q[:, :, :, :, None, :] * from_start[..., None], 2, 4)  # [B,N,Hk,r,C,Dk]
    k_out = jnp.moveaxis(k[:, :, :, :, None, :] * to_end[..., None], 2, 4)
    through = through.reshape(b, n, hk, r)

    def step(state, xs):  # state [B, Hk, r, Dk, Dv]
        u, w, q_in, k_out, intra, through = xs
        v_new = u - w @ state
        o = q_in @ state + intra @ v_new
        state = state * through[..., None, None] + jnp.swapaxes(k_out, -1, -2) @ v_new
        return recurrence.flush(state), o

    state = (
        jnp.zeros((b, hk, r, dk, dv), f32)
        if initial_state is None
        else initial_state.astype(f32).reshape(b, hk, r, dk, dv)
    )
    xs = tuple(jnp.moveaxis(x, 1, 0) for x in (u, w, q_in, k_out, intra, through))
    state, o = jax.lax.scan(step, state, xs)  # o [N, B, Hk, r, C, Dv]
    o = jnp.moveaxis(o, (0, 4), (1, 2)).reshape(b, n, c, hv, dv)
    return recurrence.from_chunks(o, t), state.reshape(b, hv, dk, dv)


SOLVE_BLOCK = 16  # rows solved by forward substitution; larger blocks by the halving below


def unit_lower_inverse(strict: jax.Array) -> jax.Array:
    """`(I + strict)^-1` for strictly lower triangular `strict` (`[..., C, C]`), by blocks:
    `[[A, 0], [B, D]]^-1 = [[A^-1, 0], [-D^-1 B A^-1, D^-1]]` halving down to blocks of
    `SOLVE_BLOCK`, each inverted by forward substitution (C padded with the identity to
    `SOLVE_BLOCK * 2^k`). The same numbers as one solve of the whole block to float32's
    rounding, in matrix products; on the CPU one solve of 64 took 800 ms where this takes 14."""
    c = strict.shape[-1]
    size = SOLVE_BLOCK
    while size < c:
        size *= 2
    if size != c:
        pad = [(0, 0)] * (strict.ndim - 2) + [(0, size - c), (0, size - c)]
        return unit_lower_inverse(jnp.pad(strict, pad))[..., :c, :c]
    if c <= SOLVE_BLOCK:
        return _forward_substitution(strict)
    h = c // 2
    a = unit_lower_inverse(strict[..., :h, :h])
    d = unit_lower_inverse(strict[..., h:, h:])
    b = -(d @ (strict[..., h:, :h] @ a))
    top = jnp.concatenate([a, jnp.zeros_like(a)], axis=-1)
    return jnp.concatenate([top, jnp.concatenate([b, d], axis=-1)], axis=-2)


def _forward_substitution(strict: jax.Array) -> jax.Array:
    """`(I + strict)^-1` by forward substitution, row by row (what a unit lower triangular
    solve of the identity computes: row i is `e_i - strict[i, :i] @ rows[:i]`). Not LAPACK's
    `trsm` (`jax.scipy.linalg.solve_triangular`): on the CPU its batch runs on the thread pool
    that the devices' programs occupy, and eight CPU devices each solving at once deadlocked
    (seen in the default tier with eight host devices)."""
    c = strict.shape[-1]
    rows = [jnp.broadcast_to(jnp.eye(1, c, 0, dtype=strict.dtype), strict[..., :1, :].shape)]
    for i in range(1, c):
        e_i = jnp.broadcast_to(jnp.eye(1, c, i, dtype=strict.dtype), rows[0].shape)
        done = jnp.concatenate(rows, axis=-2)  # [..., i, C]
        rows.append(e_i - strict[..., i : i + 1, :i] @ done)
    return jnp.concatenate(rows, axis=-2)


def l2_normalize(x: jax.Array, eps: float = 1e-6) -> jax.Array:
    """`x * rsqrt(sum(x^2) + eps)` over the last dim, in float32 (FLA's and transformers'
    `l2norm`)."""
    x = x.astype(jnp.float32)
    return x * jax.lax.rsqrt(jnp.sum(x * x, axis=-1, keepdims=True) + eps)


@dataclasses.dataclass(frozen=True)
class GatedDeltaSpec:
    """Shape of one Gated DeltaNet layer (transformers' `linear_*` config fields).

    Attributes:
      embed_dim: `hidden_size`.
      key_heads, key_dim: `linear_num_key_heads`, `linear_key_head_dim`.
      value_heads, value_dim: `linear_num_value_heads`, `linear_value_head_dim`.
      conv_kernel: `linear_conv_kernel_dim`.
      norm_eps: the gated RMSNorm's epsilon (`rms_norm_eps`).
      chunk: tokens per chunk of the scan (changes no number).
    """

    embed_dim: int
    key_heads: int
    key_dim: int
    value_heads: int
    value_dim: int
    conv_kernel: int = 4
    norm_eps: float = 1e-6
    chunk: int = DEFAULT_CHUNK


class GatedDeltaNet(nnx.Module):
    """The Gated DeltaNet layer (see the module docstring).

    Params (transformers' Qwen3.5 names in brackets; heads flattened head-major, as the parts of
    a fused tensor are cut): `q`, `k [embed, Hk*Dk]` and `v [embed, Hv*Dv]` (`in_proj_qkv`, in
    that order), `z [embed, Hv*Dv]` (`in_proj_z`), `b`, `a [embed, Hv]` (`in_proj_b`,
    `in_proj_a`), `conv_q`, `conv_k [K, Hk*Dk]` and `conv_v [K, Hv*Dv]` (`conv1d.weight`,
    channels in the order q, k, v), `dt_bias`,
    `a_log [Hv]`, `norm [Dv]` (the gated norm's weight, shared by the heads), `out
    [Hv, Dv, embed]` (`out_proj`).
    """

    def __init__(self, spec: GatedDeltaSpec, rngs: nnx.Rngs, dtype: jnp.dtype = jnp.float32):
        d, hk, dk, hv, dv, kern = (
            spec.embed_dim,
            spec.key_heads,
            spec.key_dim,
            spec.value_heads,
            spec.value_dim,
            spec.conv_kernel,
        )
        self.spec = spec
        self.dims = {"q": (hk, dk), "k": (hk, dk), "v": (hv, dv), "z": (hv, dv)}
        for name, (heads, width) in self.dims.items():
            w = normal_param(rngs, (d, heads * width), ("embed", "heads"), d**-0.5, dtype)
            setattr(self, name, w)
        self.b = normal_param(rngs, (d, hv), ("embed", "heads"), d**-0.5, dtype)
        self.a = normal_param(rngs, (d, hv), ("embed", "heads"), d**-0.5, dtype)
        for name in ("q", "k", "v"):
            heads, width = self.dims[name]
            w = normal_param(rngs, (kern, heads * width), ("conv", "heads"), kern**-0.5, dtype)
            setattr(self, f"conv_{name}", w)
        self.dt_bias = ones_param((hv,), ("heads",), dtype)
        self.a_log = nnx.Param(jnp.zeros((hv,), dtype), logical_axes=("heads",))
        self.norm = ones_param((dv,), ("head_dim",), dtype)
        self.out = normal_param(
            rngs, (hv, dv, d), ("heads", "head_dim", "embed"), (hv * dv) ** -0.5, dtype
        )

    def initial_state(self, batch: int) -> dict[str, jax.Array]:
        """The state before a row's first token (`scan_chunk`'s): zero convolution tails and
        recurrent state, no previous segment."""
        spec = self.spec
        tail = (batch, spec.conv_kernel - 1)
        dtype = self.q.dtype
        return {
            "q": jnp.zeros(tail + (spec.key_heads, spec.key_dim), dtype),
            "k": jnp.zeros(tail + (spec.key_heads, spec.key_dim), dtype),
            "v": jnp.zeros(tail + (spec.value_heads, spec.value_dim), dtype),
            "tail_segments": jnp.full(tail, -1, jnp.int32),
            "last_segment": jnp.full((batch,), -1, jnp.int32),
            "delta": jnp.zeros(
                (batch, spec.value_heads, spec.key_dim, spec.value_dim), jnp.float32
            ),
        }

    def scan_chunk(self, inputs: tuple, state: dict) -> tuple[jax.Array, dict]:
        """The layer's sequence part over consecutive tokens of each row, from `state`
        (`initial_state`, or the state after the tokens before them): the convolution of q, k
        and v, their normalisation, and the gated delta rule.

        Args:
          inputs: `(q, k [B, L, Hk, Dk], v [B, L, Hv, Dv]` before the convolution, `g`,
            `beta [B, L, Hv]` float32, `segment_ids [B, L])`.
          state: as `initial_state`.

        Returns:
          (o `[B, L, Hv, Dv] float32`, the state after the last token).
        """
        q, k, v, g, beta, segment_ids = inputs
        tails = state["tail_segments"]
        convolved, new = [], {}
        for name, x in (("q", q), ("k", k), ("v", v)):
            weight = getattr(self, f"conv_{name}")[...].reshape(-1, *self.dims[name])
            out, new[name], tail_segments = recurrence.conv_after(
                x, weight, None, segment_ids, state[name], tails
            )
            convolved.append(out)
        q, k, v = convolved
        starts = recurrence.starts_after(segment_ids, state["last_segment"])
        q = l2_normalize(q) * self.spec.key_dim**-0.5
        o, delta = chunk_gated_delta_rule(
            q,
            l2_normalize(k),
            v,
            g,
            beta,
            starts,
            chunk=self.spec.chunk,
            initial_state=state["delta"],
        )
        new.update(tail_segments=tail_segments, last_segment=segment_ids[:, -1], delta=delta)
        return o, new

    def __call__(self, x: jax.Array, segment_ids: jax.Array) -> jax.Array:
        """`x [B, T, embed]` -> `[B, T, embed]` in `x.dtype`; `segment_ids [B, T]` int."""
        spec = self.spec
        proj = lambda n: (x @ getattr(self, n)[...]).reshape(*x.shape[:2], *self.dims[n])  # noqa: E731
        b = jnp.einsum("btd,dh->bth", x, self.b[...])
        a = jnp.einsum("btd,dh->bth", x, self.a[...]).astype(jnp.float32)
        beta = jax.nn.sigmoid(b.astype(jnp.float32))
        dt_bias = self.dt_bias[...].astype(jnp.float32)
        g = -jnp.exp(self.a_log[...].astype(jnp.float32)) * jax.nn.softplus(a + dt_bias)
        inputs = (proj("q"), proj("k"), proj("v"), g, beta, segment_ids)
        o, _ = recurrence.run(self.scan_chunk, inputs, self.initial_state(x.shape[0]))
        o = recurrence.gated_rms_norm(
            o.astype(x.dtype),
            proj("z"),
            self.norm[...],
            spec.norm_eps,
            groups=1,
            norm_before_gate=True,
        )
        return jnp.einsum("bthk,hkd->btd", o, self.out[...])


def hf_rules(layer: str, to: str, layout: str) -> list[dict[str, Any]]:
    """The mapping rules (`ppl_jax.checkpoints.mapping.language`) of transformers' Gated DeltaNet
    layer whose stored names start with the pattern `layer` (capturing `l`), into the
    `GatedDeltaNet` params under `to` (`layers/{l}/linear_attn/`). `layout` `qwen3_next` reads
    `Qwen3NextGatedDeltaNet`'s `in_proj_qkvz` `[Hk, (q, k, r values, r gates), embed]` and
    `in_proj_ba` `[Hk, (r betas, r decay inputs), embed]` (`r = Hv / Hk`), any other
    `Qwen3_5GatedDeltaNet`'s `in_proj_qkv`, `in_proj_z`, `in_proj_b`, `in_proj_a`; `conv1d` is `[q |
    k | v, 1, K]` in both. Sizes are expressions over the `gdn_*` fields."""
    kd, vd = "gdn_key_heads * gdn_key_dim", "gdn_value_heads * gdn_value_dim"
    linear = {"transpose": [1, 0]}
    if layout == "qwen3_next":
        per_head = {"view": ["gdn_key_heads", -1, "embed_dim"], "transpose": [2, 0, 1],
                    "reshape": ["embed_dim", -1]}  # fmt: skip
        rv = "gdn_value_heads // gdn_key_heads * gdn_value_dim"
        projections = [
            {"from": layer + r"in_proj_qkvz\.weight", "to": [to + n for n in "qkvz"],
             "split": {"axis": 1, "sizes": ["gdn_key_dim", "gdn_key_dim", rv, rv]}, **per_head},
            {"from": layer + r"in_proj_ba\.weight", "to": [to + "b", to + "a"],
             "split": {"axis": 1}, **per_head},
        ]  # fmt: skip
    else:
        projections = [
            {"from": layer + r"in_proj_qkv\.weight", "to": [to + n for n in "qkv"],
             "split": {"axis": 0, "sizes": [kd, kd, vd]}, **linear},
            {"from": layer + r"in_proj_(?P<p>[zba])\.weight", "to": to + "{p}", **linear},
        ]  # fmt: skip
    return projections + [
        {"from": layer + r"conv1d\.weight", "to": [to + f"conv_{n}" for n in "qkv"],
         "view": [-1, "gdn_conv"], "split": {"axis": 0, "sizes": [kd, kd, vd]}, **linear},
        {"from": layer + r"dt_bias", "to": to + "dt_bias"},
        {"from": layer + r"A_log", "to": to + "a_log"},
        {"from": layer + r"norm\.weight", "to": to + "norm"},
        {"from": layer + r"out_proj\.weight", "to": to + "out", **linear,
         "reshape": ["gdn_value_heads", "gdn_value_dim", "embed_dim"]},
    ]  # fmt: skip
