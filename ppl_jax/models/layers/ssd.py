"""The Mamba2 layer: the selective state-space model computed by state-space duality (SSD; Dao &
Gu 2024, "Transformers are SSMs"), forward only, with its state in float32; shared by the
Hugging Face `mamba2`, `nemotron_h` and `falcon_h1` model types.

The recurrence, per head h with state `S [P, N]` zero at each segment start
(`ppl_jax.models.layers.recurrence`), B and C shared by the `H / G` heads of each of G groups
(transformers' `mamba2_selective_state_update`):

    S = exp(dt_t * A_h) * S + dt_t * x_t B_t^T
    y_t = S C_t + D_h * x_t

`ssd_scan` computes it by chunks of C tokens (transformers' `mamba2_chunk_scan`, the torch path
of `Mamba2Mixer.torch_forward` in older releases): inside a chunk the masked `[C, C]` products
`(C_i . B_j) exp(sum_{j<t<=i} dt_t A)` (the decays summed directly, as `segment_sum` does); across
chunks a `lax.scan` carries the state (where transformers multiplies by an `[N+1, N+1]` matrix
over all chunks). Only `[C, C]` blocks exist per head, never `[T, T]`. The chunk size changes no
number beyond float32 rounding.

`Mamba2Mixer` is the whole layer: the input projection to the gate z, x, B, C and dt (each part
optionally scaled: Falcon-H1's `ssm_multipliers`); the depthwise causal convolution with SiLU
over x, B and C; `dt = clamp(softplus(dt + dt_bias), *dt_limit)`, `A = -exp(A_log)`; the scan
with the D skip; the gate (`norm`: `gated` is Mamba2's and Nemotron-H's `w * rms_norm(y *
silu(z))` over G groups, `gated_first_norm` Falcon-H1's `w * rms_norm(y) * silu(z)`, `none`
Falcon-H1's plain `y * silu(z)`); the output projection.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from ppl_jax.errors import CheckpointError
from ppl_jax.models.layers import recurrence
from ppl_jax.models.layers.core import normal_param, ones_param, zeros_param

NORMS = ("gated", "gated_first_norm", "none")


def ssd_scan(
    x: jax.Array,
    dt: jax.Array,
    a: jax.Array,
    b: jax.Array,
    c: jax.Array,
    starts: jax.Array,
    *,
    chunk: int,
    initial_state: jax.Array | None = None,
) -> tuple[jax.Array, jax.Array]:
    """The SSD scan (the recurrence of the module docstring without the D skip), by chunks.

    Args:
      x: `[B, T, H, P]`, any float dtype.
      dt: `[B, T, H]`, the step (after softplus and limits).
      a: `[H]`, the (negative) A of each head.
      b, c: `[B, T, G, N]`, G dividing H; head h reads group `h // (H / G)`.
      starts: `[B, T] bool`, where segments start (`recurrence.segment_starts`): the state is
        zero before each.
      chunk: tokens per chunk (any positive size; T is padded to a multiple).
      initial_state: `[B, H, P, N]`, the state before the first token, or None for zeros; it
        reaches the tokens before the row's first start only (a row continued from an earlier
        part).

    Returns:
      (y `[B, T, H, P] float32`, the state after the last token `[B, H, P, N] float32`).
    """
    bsz, t, h, p = x.shape
    g, n_state = b.shape[2:]
    hg = h // g
    f32 = jnp.float32
    dt = dt.astype(f32)
    xdt = recurrence.to_chunks(x.astype(f32) * dt[..., None], chunk)
    xdt = xdt.reshape(xdt.shape[:3] + (g, hg, p))  # [B, N, C, G, hg, P]
    log_decay = recurrence.to_chunks(dt * a.astype(f32), chunk)
    pair, from_start, to_end, through = recurrence.chunk_decays(
        log_decay, recurrence.to_chunks(starts, chunk)
    )
    n, cs = xdt.shape[1], xdt.shape[2]
    pair = pair.reshape(bsz, n, g, hg, cs, cs)
    from_start, to_end = (v.reshape(bsz, n, cs, g, hg) for v in (from_start, to_end))
    through = through.reshape(bsz, n, g, hg)
    b, c = (recurrence.to_chunks(v.astype(f32), chunk) for v in (b, c))  # [B, N, C, G, N]

    cb = jnp.einsum("bnigs,bnjgs->bngij", c, b)  # [B, N, G, C, C]
    y_diag = jnp.einsum("bngkij,bnjgkp->bnigkp", cb[:, :, :, None] * pair, xdt)

    def step(state, xs):  # state [B, G, hg, P, N]
        c, b, xdt, from_start, to_end, through = xs
        y_off = jnp.einsum("bigs,bgkps->bigkp", c, state) * from_start[..., None]
        update = jnp.einsum("bigs,bigkp->bgkps", b, xdt * to_end[..., None])
        return recurrence.flush(state * through[..., None, None] + update), y_off

    state = (
        jnp.zeros((bsz, g, hg, p, n_state), f32)
        if initial_state is None
        else initial_state.astype(f32).reshape(bsz, g, hg, p, n_state)
    )
    xs = tuple(jnp.moveaxis(v, 1, 0) for v in (c, b, xdt, from_start, to_end, through))
    state, y_off = jax.lax.scan(step, state, xs)
    y = y_diag + jnp.moveaxis(y_off, 0, 1)
    return recurrence.from_chunks(y.reshape(bsz, n, cs, h, p), t), state.reshape(bsz, h, p, n_state)


@dataclasses.dataclass(frozen=True)
class Mamba2Spec:
    """Shape of one Mamba2 layer (transformers' field names in brackets).

    Attributes:
      embed_dim: `hidden_size`.
      heads, head_dim: `num_heads`, `head_dim` (Nemotron-H `mamba_num_heads`,
        `mamba_head_dim`; Falcon-H1 `mamba_n_heads`, `mamba_d_head`).
      groups: `n_groups` (`mamba_n_groups`), dividing `heads`.
      state_dim: `state_size` (`ssm_state_size`, `mamba_d_state`).
      conv_kernel: `conv_kernel` (`mamba_d_conv`).
      chunk: tokens per chunk of the scan (`chunk_size`; changes no number).
      norm_eps: the gated norm's epsilon.
      dt_limit: `(low, high)` clamp of dt (`time_step_limit`; Nemotron-H's low is
        `time_step_min`).
      conv_bias: the convolution has a bias (`use_conv_bias`, `mamba_conv_bias`).
      in_bias, out_bias: the input and output projections have biases (`use_bias`; Falcon-H1
        `mamba_proj_bias`, `projectors_bias`).
      norm: one of `NORMS` (see the module docstring).
      part_scales: factors of the projection's parts z, x, B, C, dt (Falcon-H1's
        `ssm_multipliers`, its `mup_vector`).
    """

    embed_dim: int
    heads: int
    head_dim: int
    groups: int
    state_dim: int
    conv_kernel: int = 4
    chunk: int = 256
    norm_eps: float = 1e-5
    dt_limit: tuple[float, float] = (0.0, float("inf"))
    conv_bias: bool = True
    in_bias: bool = False
    out_bias: bool = False
    norm: str = "gated"
    part_scales: tuple[float, ...] = (1.0, 1.0, 1.0, 1.0, 1.0)

    def __post_init__(self):
        if self.norm not in NORMS:
            raise CheckpointError(f"the Mamba2 norm {self.norm!r} is not one of {NORMS}.")
        if self.heads % self.groups:
            raise CheckpointError(
                f"the Mamba2 layer's {self.heads} heads are not a multiple of its "
                f"{self.groups} groups (n_groups)."
            )


class Mamba2Mixer(nnx.Module):
    """The Mamba2 layer (see the module docstring).

    Params (the parts of transformers' fused `in_proj`, in its order; heads and groups flattened
    head-major, as the parts of a fused tensor are cut): `z [embed, H*P]` (the gate), `x [embed,
    H*P]`, `b`, `c [embed, G*N]`, `dt [embed, H]`; with `in_bias` their biases `z_bias`, ...;
    `conv_x [K, H*P]`, `conv_b`, `conv_c [K, G*N]` (`conv1d.weight`, channels x, B, C) and with
    `conv_bias` their biases; `dt_bias`, `a_log`, `d [H]`; `norm [H, P]` (the gated norm's weight,
    unless `norm` is `none`); `out [H, P, embed]` (`out_proj`) and with `out_bias` `out_bias
    [embed]`.
    """

    def __init__(self, spec: Mamba2Spec, rngs: nnx.Rngs, dtype: jnp.dtype = jnp.float32):
        d, h, p, g, n, kern = (
            spec.embed_dim,
            spec.heads,
            spec.head_dim,
            spec.groups,
            spec.state_dim,
            spec.conv_kernel,
        )
        self.spec = spec
        self.dims = {"z": (h, p), "x": (h, p), "b": (g, n), "c": (g, n), "dt": (h,)}
        axes = {"z": "heads", "x": "heads", "b": "ssm_groups", "c": "ssm_groups", "dt": "heads"}
        for name, dims in self.dims.items():
            size = math.prod(dims)
            w = normal_param(rngs, (d, size), ("embed", axes[name]), d**-0.5, dtype)
            setattr(self, name, w)
            if spec.in_bias:
                setattr(self, f"{name}_bias", zeros_param((size,), (axes[name],), dtype))
        for name in ("x", "b", "c"):
            size = math.prod(self.dims[name])
            w = normal_param(rngs, (kern, size), ("conv", axes[name]), kern**-0.5, dtype)
            setattr(self, f"conv_{name}", w)
            if spec.conv_bias:
                setattr(self, f"conv_{name}_bias", zeros_param((size,), (axes[name],), dtype))
        self.dt_bias = zeros_param((h,), ("heads",), dtype)
        self.a_log = zeros_param((h,), ("heads",), dtype)
        self.d = ones_param((h,), ("heads",), dtype)
        if spec.norm != "none":
            self.norm = ones_param((h, p), ("heads", "head_dim"), dtype)
        self.out = normal_param(
            rngs, (h, p, d), ("heads", "head_dim", "embed"), (h * p) ** -0.5, dtype
        )
        if spec.out_bias:
            self.out_bias = zeros_param((d,), ("embed",), dtype)

    def _project(self, x: jax.Array, name: str, scale: float) -> jax.Array:
        w = getattr(self, name)[...]
        out = x @ w
        if self.spec.in_bias:
            out = out + getattr(self, f"{name}_bias")[...]
        out = out.reshape(*out.shape[:-1], *self.dims[name])
        return out if scale == 1.0 else out * jnp.asarray(scale, out.dtype)

    def initial_state(self, batch: int) -> dict[str, jax.Array]:
        """The state before a row's first token (`scan_chunk`'s): zero convolution tails and
        recurrent state, no previous segment."""
        spec = self.spec
        tail = (batch, spec.conv_kernel - 1)
        dtype = self.x.dtype
        return {
            "x": jnp.zeros(tail + (spec.heads, spec.head_dim), dtype),
            "b": jnp.zeros(tail + (spec.groups, spec.state_dim), dtype),
            "c": jnp.zeros(tail + (spec.groups, spec.state_dim), dtype),
            "tail_segments": jnp.full(tail, -1, jnp.int32),
            "last_segment": jnp.full((batch,), -1, jnp.int32),
            "ssm": jnp.zeros((batch, spec.heads, spec.head_dim, spec.state_dim), jnp.float32),
        }

    def scan_chunk(self, inputs: tuple, state: dict) -> tuple[jax.Array, dict]:
        """The layer's sequence part over consecutive tokens of each row, from `state`
        (`initial_state`, or the state after the tokens before them): the convolution of x, B
        and C, the scan and the D skip.

        Args:
          inputs: `(x [B, L, H, P], b, c [B, L, G, N]` before the convolution, `dt [B, L, H]`
            float32 after softplus and limits, `segment_ids [B, L])`.
          state: as `initial_state`.

        Returns:
          (`y + D x` `[B, L, H, P] float32`, the state after the last token).
        """
        x, b, c, dt, segment_ids = inputs
        tails = state["tail_segments"]
        convolved, new = [], {}
        for name, v in (("x", x), ("b", b), ("c", c)):
            dims = self.dims[name]
            weight = getattr(self, f"conv_{name}")[...].reshape(-1, *dims)
            bias = (
                getattr(self, f"conv_{name}_bias")[...].reshape(dims)
                if self.spec.conv_bias
                else None
            )
            out, new[name], tail_segments = recurrence.conv_after(
                v, weight, bias, segment_ids, state[name], tails
            )
            convolved.append(out)
        x, b, c = convolved
        starts = recurrence.starts_after(segment_ids, state["last_segment"])
        a = -jnp.exp(self.a_log[...].astype(jnp.float32))
        y, ssm = ssd_scan(x, dt, a, b, c, starts, chunk=self.spec.chunk, initial_state=state["ssm"])
        y = y + self.d[...].astype(jnp.float32)[:, None] * x.astype(jnp.float32)
        new.update(tail_segments=tail_segments, last_segment=segment_ids[:, -1], ssm=ssm)
        return y, new

    def __call__(self, hidden: jax.Array, segment_ids: jax.Array) -> jax.Array:
        """`hidden [B, T, embed]` -> `[B, T, embed]` in `hidden.dtype`; `segment_ids [B, T]`."""
        spec = self.spec
        z, x, b, c, dt = (
            self._project(hidden, name, scale)
            for name, scale in zip(("z", "x", "b", "c", "dt"), spec.part_scales, strict=True)
        )
        dt = dt.astype(jnp.float32) + self.dt_bias[...].astype(jnp.float32)
        dt = jnp.clip(jax.nn.softplus(dt), *spec.dt_limit)
        inputs = (x, b, c, dt, segment_ids)
        y, _ = recurrence.run(self.scan_chunk, inputs, self.initial_state(hidden.shape[0]))
        bsz, t, h, p = y.shape
        if spec.norm == "none":
            y = y * jax.nn.silu(z.astype(jnp.float32))
        else:
            y = recurrence.gated_rms_norm(
                y.reshape(bsz, t, h * p),
                z.reshape(bsz, t, h * p),
                self.norm[...].reshape(h * p),
                spec.norm_eps,
                groups=spec.groups,
                norm_before_gate=spec.norm == "gated_first_norm",
            ).reshape(bsz, t, h, p)
        out = jnp.einsum("bthp,hpd->btd", y.astype(hidden.dtype), self.out[...])
        return out + self.out_bias[...] if spec.out_bias else out


@dataclasses.dataclass(frozen=True, kw_only=True)
class SsmFields:
    """The Mamba2 layer's fields of a family's flat config (Mamba2, Nemotron-H, Falcon-H1);
    `mixer_spec` makes the layer's `Mamba2Spec` of them.

    Attributes:
      ssm_heads, ssm_head_dim, ssm_groups, ssm_state, ssm_conv, ssm_chunk: the layer's heads, head
        width, groups of B and C, state width, convolution width and scan chunk (see
        `Mamba2Spec`).
      ssm_dt_min, ssm_dt_max: dt's clamp (`time_step_limit`; None: no upper bound).
      ssm_conv_bias, ssm_in_bias, ssm_out_bias: the convolution's and projections' biases.
      ssm_norm: the gate and norm of the output (`ppl_jax.models.layers.ssd.NORMS`).
      ssm_scales: factors of the input projection's parts z, x, B, C, dt.
    """

    ssm_heads: int = 0
    ssm_head_dim: int = 0
    ssm_groups: int = 1
    ssm_state: int = 0
    ssm_conv: int = 4
    ssm_chunk: int = 256
    ssm_dt_min: float = 0.0
    ssm_dt_max: float | None = None
    ssm_conv_bias: bool = True
    ssm_in_bias: bool = False
    ssm_out_bias: bool = False
    ssm_norm: str = "gated"
    ssm_scales: tuple[float, ...] = (1.0, 1.0, 1.0, 1.0, 1.0)


def mixer_spec(cfg: Any) -> Mamba2Spec:
    """The Mamba2 layer of a config with `SsmFields` (and `embed_dim`, `norm_eps`)."""
    return Mamba2Spec(
        embed_dim=cfg.embed_dim,
        heads=cfg.ssm_heads,
        head_dim=cfg.ssm_head_dim,
        groups=cfg.ssm_groups,
        state_dim=cfg.ssm_state,
        conv_kernel=cfg.ssm_conv,
        chunk=cfg.ssm_chunk,
        norm_eps=cfg.norm_eps,
        dt_limit=(cfg.ssm_dt_min, float("inf") if cfg.ssm_dt_max is None else cfg.ssm_dt_max),
        conv_bias=cfg.ssm_conv_bias,
        in_bias=cfg.ssm_in_bias,
        out_bias=cfg.ssm_out_bias,
        norm=cfg.ssm_norm,
        part_scales=tuple(cfg.ssm_scales),
    )


def dt_limit(value: Any, low_default: float = 0.0) -> tuple[float, float]:
    """`time_step_limit` of a `config.json` (a pair; transformers writes infinity as
    `{"__float__": "Infinity"}`), as `(low, high)` floats.

    Raises:
      CheckpointError: not a pair of numbers.
    """

    def number(v):
        if isinstance(v, dict) and set(v) == {"__float__"}:
            v = v["__float__"]
        return float(v)

    if value is None:
        return (low_default, float("inf"))
    try:
        low, high = (number(v) for v in value)
    except (TypeError, ValueError):
        raise CheckpointError(
            f"time_step_limit {str(value)[:60]} is not a pair of numbers."
        ) from None
    return (low, high)


def hf_rules(layer: str, to: str) -> list[dict[str, Any]]:
    """The mapping rules (`ppl_jax.checkpoints.mapping.language`) of transformers' Mamba2 layer
    (`Mamba2Mixer`, `NemotronHMamba2Mixer`, `FalconH1Mixer`) whose stored names start with the
    pattern `layer` (capturing `l`), into the `Mamba2Mixer` params under `to` (`layers/{l}/mixer/`):
    `in_proj` `[z | x | B | C | dt, embed]` and `conv1d` `[x | B | C, 1, K]` cut in their parts,
    `nn.Linear`'s `[out, in]` transposed. Sizes are expressions over the `SsmFields`."""
    inner, gn = "ssm_heads * ssm_head_dim", "ssm_groups * ssm_state"
    parts = {"axis": 0, "sizes": [inner, inner, gn, gn, "ssm_heads"]}
    conv = {"axis": 0, "sizes": [inner, gn, gn]}
    names = ("z", "x", "b", "c", "dt")
    convs = ("conv_x", "conv_b", "conv_c")
    return [
        {"from": layer + r"in_proj\.weight", "to": [to + n for n in names], "split": parts,
         "transpose": [1, 0]},
        {"from": layer + r"in_proj\.bias", "to": [to + n + "_bias" for n in names],
         "split": parts},
        {"from": layer + r"conv1d\.weight", "to": [to + n for n in convs],
         "view": [-1, "ssm_conv"], "split": conv, "transpose": [1, 0]},
        {"from": layer + r"conv1d\.bias", "to": [to + n + "_bias" for n in convs],
         "split": conv},
        {"from": layer + r"dt_bias", "to": to + "dt_bias"},
        {"from": layer + r"A_log", "to": to + "a_log"},
        {"from": layer + r"D", "to": to + "d"},
        {"from": layer + r"norm\.weight", "to": to + "norm",
         "reshape": ["ssm_heads", "ssm_head_dim"]},
        {"from": layer + r"out_proj\.weight", "to": to + "out", "transpose": [1, 0],
         "reshape": ["ssm_heads", "ssm_head_dim", "embed_dim"]},
        {"from": layer + r"out_proj\.bias", "to": to + "out_bias"},
    ]  # fmt: skip
