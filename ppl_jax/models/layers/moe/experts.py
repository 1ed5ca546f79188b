"""The experts of a mixture-of-experts layer, dropless and grouped, for any expert MLP: the
computation every MoE family shares once its router has chosen (`ppl_jax.models.layers.moe.dropless`
for the softmax routers of Mixtral, Qwen-MoE and OLMoE; `ppl_jax.models.layers.moe.routing` for
GPT-OSS, Llama 4 and DeepSeek-V3).

Expert MLPs (`SwiGLU`, `ClampedSwiGLU`, `ReluSquared`) are small frozen dataclasses that say how one expert maps
its rows, `one(x, *params_e)`, and how all experts map rows sorted by expert,
`ragged(xs, group_sizes, row_expert, *params)`; their params are arrays with a leading experts
axis.

Dropless and grouped (`weighted_sum`): every (token, slot) assignment reaches its expert whatever
the batch, with no capacity. Assignments are sorted by expert (stable), the experts' MLP runs on
the sorted rows with group sizes = tokens per expert, and the rows are unsorted and combined with
the routing weights in float32: each expert's output times its weight (Mixtral, GPT-OSS,
DeepSeek-V3), or with `scale_input` each expert applied to its input times its weight (Llama 4's
`Llama4TextMoe`, which multiplies the hidden state by the router's sigmoid score before the
experts). On TPU and GPU this is `jax.lax.ragged_dot`. On CPU `ragged_dot` lowers (jax 0.10) to a
masked dense product that holds an `[experts, rows, k]` buffer and does every expert's work for
every row, so there (`jax.lax.platform_dependent`) the sorted assignments are padded per expert to
whole tiles, and a loop over the experts runs a loop over each expert's tiles (`_tiled_sum`):
gather the tile's tokens, the expert's MLP, add into the tokens' float32 sums. The largest
buffers are the `[tokens, embed]` sums and a few `[tokens * top_k + experts * tile]` index
vectors; no `[tokens, experts, mlp]` buffer exists on any path.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp


def swiglu(x: jax.Array, gate: jax.Array, up: jax.Array, down: jax.Array) -> jax.Array:
    """`(silu(x @ gate) * (x @ up)) @ down` in `x.dtype` (Shazeer 2020, "GLU Variants")."""
    return jnp.dot(jax.nn.silu(jnp.dot(x, gate)) * jnp.dot(x, up), down)


@dataclasses.dataclass(frozen=True)
class SwiGLU:
    """The SwiGLU expert: params `gate`, `up [experts, embed, mlp]`, `down [experts, mlp, embed]`
    (transformers' `*Experts.gate_up_proj` split and transposed)."""

    def one(self, x, gate, up, down):
        return swiglu(x, gate, up, down)

    def ragged(self, xs, group_sizes, row_expert, gate, up, down):
        del row_expert
        h = jax.nn.silu(jax.lax.ragged_dot(xs, gate, group_sizes))
        return jax.lax.ragged_dot(h * jax.lax.ragged_dot(xs, up, group_sizes), down, group_sizes)


@dataclasses.dataclass(frozen=True)
class ClampedSwiGLU:
    """GPT-OSS's expert (transformers 5 `GptOssExperts._apply_gate`): with `g = x @ gate +
    gate_bias` and `u = x @ up + up_bias`, `g` clamped above at `limit` and `u` to `[-limit,
    limit]`, the output is `((u + 1) * g * sigmoid(alpha * g)) @ down + down_bias`, in `x.dtype`.

    Params: `gate`, `up [experts, embed, mlp]`, `down [experts, mlp, embed]`, `gate_bias`,
    `up_bias [experts, mlp]`, `down_bias [experts, embed]` (transformers interleaves gate and up
    columns in `gate_up_proj`: gate the even ones, up the odd ones).
    """

    alpha: float = 1.702
    limit: float = 7.0

    def _act(self, g, u):
        g = jnp.minimum(g, jnp.asarray(self.limit, g.dtype))
        u = jnp.clip(u, -self.limit, self.limit).astype(u.dtype)
        return (u + 1) * (g * jax.nn.sigmoid(g * jnp.asarray(self.alpha, g.dtype)))

    def one(self, x, gate, up, down, gate_bias, up_bias, down_bias):
        h = self._act(jnp.dot(x, gate) + gate_bias, jnp.dot(x, up) + up_bias)
        return jnp.dot(h, down) + down_bias

    def ragged(self, xs, group_sizes, row_expert, gate, up, down, gate_bias, up_bias, down_bias):
        g = jax.lax.ragged_dot(xs, gate, group_sizes) + gate_bias[row_expert]
        u = jax.lax.ragged_dot(xs, up, group_sizes) + up_bias[row_expert]
        return jax.lax.ragged_dot(self._act(g, u), down, group_sizes) + down_bias[row_expert]


@dataclasses.dataclass(frozen=True)
class ReluSquared:
    """The ungated squared-ReLU expert (Nemotron-H's `NemotronHExperts`): params `up [experts,
    embed, mlp]`, `down [experts, mlp, embed]`; `relu(x @ up)^2 @ down` in `x.dtype`."""

    def one(self, x, up, down):
        return jnp.dot(jnp.square(jax.nn.relu(jnp.dot(x, up))), down)

    def ragged(self, xs, group_sizes, row_expert, up, down):
        del row_expert
        h = jnp.square(jax.nn.relu(jax.lax.ragged_dot(xs, up, group_sizes)))
        return jax.lax.ragged_dot(h, down, group_sizes)


SWIGLU = SwiGLU()


def default_tile(rows: int, num_experts: int) -> int:
    """The CPU path's rows per tile: the power of two at or below a quarter of the mean rows per
    expert, 16 to 128. Padding then wastes at most about 1/8 of the rows; on the 2-core CPU of
    BENCHMARKS.md, tiles of 128-256 rows ran fastest for 8 experts (64 ran 0.9x as fast, 512
    0.9x), and 32-256 alike for 64 narrow experts; a quarter rather than an eighth of the mean
    made the MoE families' whole model 1.04-1.05x as fast (tiles of 128 rather than 64)."""
    quarter = max(1, rows // (4 * num_experts))
    return int(min(128, max(16, 1 << (quarter.bit_length() - 1))))


def _tile_layout(group_sizes, rows, tile):
    """Each expert's rows padded to whole tiles. Returns (padded row of each sorted row `[rows]`,
    each expert's first tile `[experts]`, each expert's tile count `[experts]`, tiles allocated
    (static))."""
    num_experts = group_sizes.shape[0]
    num_tiles = -(-rows // tile) + num_experts  # an upper bound on the tiles needed
    padded = (group_sizes + tile - 1) // tile * tile
    padded_ends = jnp.cumsum(padded)
    ends = jnp.cumsum(group_sizes)
    # Row r belongs to the expert whose group holds it: the number of groups ending at or before r.
    expert_of_row = jnp.cumsum(jnp.zeros(rows + 1, jnp.int32).at[ends[:-1]].add(1))[:rows]
    shift = (padded_ends - padded) - (ends - group_sizes)
    dest = jnp.arange(rows, dtype=jnp.int32) + shift[expert_of_row]
    return dest, (padded_ends - padded) // tile, padded // tile, num_tiles


def _scaled_rows(xs, w, scale_input):
    """`xs` times its rows' routing weights `w` (float32) rounded to `xs.dtype`, with
    `scale_input`; else `xs`."""
    return (xs * w[:, None]).astype(xs.dtype) if scale_input else xs


def _weighted_rows(ys, w, scale_input):
    """The experts' outputs in float32, times their routing weights unless the inputs were."""
    ys = ys.astype(jnp.float32)
    return ys if scale_input else ys * w[:, None]


def _tiled_sum(x, token, weight, params, group_sizes, tile, mlp=SWIGLU, scale_input=False):
    """The CPU path: `[tokens, embed] float32`, each token's sum over its assignments of
    `weight * mlp_e(x[token])` (or `mlp_e(weight * x[token])` with `scale_input`).

    `token`, `weight`: `[rows]`, each assignment's token and routing weight, sorted by expert
    (`group_sizes` rows each); `params`: the expert MLP's params, each `[experts, ...]`. Each
    expert's assignments are padded to whole tiles (token index `tokens`: a zero row in, dropped
    out); a loop over the experts takes each expert's weights once, and a loop inside it runs
    that expert's tiles: gather the tile's rows of `x`, the MLP in `x.dtype`, the weights in
    float32, and add into the tokens' sums. A token's sum is taken in the order of its experts'
    indices, whatever the batch. Measured (BENCHMARKS.md, 64 experts of width 128): a flat loop
    over tiles, which copies an expert's weights at every tile, and sorted copies of `x` and of
    the outputs (`[rows, embed]` each) made the layer 0.7x as fast.
    """
    tokens = x.shape[0]
    dest, first, count, num_tiles = _tile_layout(group_sizes, token.shape[0], tile)
    padded_token = jnp.full((num_tiles * tile,), tokens, jnp.int32)
    padded_token = padded_token.at[dest].set(token, unique_indices=True)
    padded_weight = jnp.zeros((num_tiles * tile,), jnp.float32)
    padded_weight = padded_weight.at[dest].set(weight, unique_indices=True)

    def expert(e, out):
        weights = tuple(p[e] for p in params)

        def step(t, out):
            rows = jax.lax.dynamic_slice_in_dim(padded_token, t * tile, tile)
            wt = jax.lax.dynamic_slice_in_dim(padded_weight, t * tile, tile)
            xt = _scaled_rows(jnp.take(x, rows, axis=0, mode="fill", fill_value=0), wt, scale_input)
            yt = _weighted_rows(mlp.one(xt, *weights), wt, scale_input)
            return out.at[rows].add(yt, mode="drop")

        return jax.lax.fori_loop(first[e], first[e] + count[e], step, out)

    out = jnp.zeros((tokens, x.shape[1]), jnp.float32)
    return jax.lax.fori_loop(0, params[0].shape[0], expert, out)


def weighted_sum(
    x: jax.Array,
    weights: jax.Array,
    experts: jax.Array,
    params: tuple[jax.Array, ...],
    *,
    mlp=SWIGLU,
    scale_input: bool = False,
    tile: int | None = None,
) -> jax.Array:
    """Each token's chosen experts' outputs combined with their routing weights.

    Args:
      x: `[tokens, embed]`, float32 or bfloat16.
      weights: `[tokens, top_k] float32`; experts: `[tokens, top_k] int32` (a router's output).
      params: the expert MLP's params, each with a leading `[experts]` axis (see `mlp`).
      mlp: the expert MLP (`SwiGLU`, `ClampedSwiGLU`, `ReluSquared`).
      scale_input: apply each expert to its input times the routing weight (Llama 4) rather than
        weighting its output.
      tile: rows per tile on CPU (default `default_tile`; see `_tiled_sum`).

    Returns:
      `[tokens, embed] float32`; the experts run in `x.dtype`.
    """
    tokens, top_k = experts.shape
    num_experts = params[0].shape[0]
    flat = experts.reshape(-1)  # [tokens * top_k], assignment j = (token j // top_k, slot)
    order = jnp.argsort(flat, stable=True)
    group_sizes = jnp.bincount(flat, length=num_experts).astype(jnp.int32)
    tile = tile or default_tile(flat.shape[0], num_experts)

    def ragged(x, order, group_sizes, weights, *params):
        w = weights.reshape(-1)[order]
        xs = _scaled_rows(x[order // top_k], w, scale_input)
        ys = _weighted_rows(mlp.ragged(xs, group_sizes, flat[order], *params), w, scale_input)
        y = jnp.zeros_like(ys).at[order].set(ys, unique_indices=True)
        return jnp.sum(y.reshape(tokens, top_k, -1), axis=1)

    def tiled(x, order, group_sizes, weights, *params):
        w = weights.reshape(-1)[order]
        return _tiled_sum(x, order // top_k, w, params, group_sizes, tile, mlp, scale_input)

    args = (x, order, group_sizes, weights, *params)
    return jax.lax.platform_dependent(*args, cpu=tiled, default=ragged)


def data_shards() -> int:
    """Devices along the `data` axis of the mesh set by `jax.set_mesh` (1 without one).
    `ppl_jax.scoring.scorer.Scorer` sets its mesh while it compiles the step."""
    mesh = jax.sharding.get_abstract_mesh()
    return 1 if mesh.empty else int(dict(mesh.shape).get("data", 1))


def token_axes(shape: tuple[int, ...]) -> tuple[str | None, ...]:
    """The mesh axes the leading dims of `x` (`[B, T, ..., embed]`) are split over and routed
    apart: `data` for the rows, `context` for the tokens of a row (the long-context issue's
    context axis), each where the mesh set by `jax.set_mesh` has it (size > 1) and it divides
    the dim."""
    mesh = jax.sharding.get_abstract_mesh()
    sizes = {} if mesh.empty else dict(mesh.shape)
    data, context = sizes.get("data", 1), sizes.get("context", 1)
    rows = "data" if data > 1 and shape[0] % data == 0 else None
    tokens = "context" if len(shape) > 2 and context > 1 and shape[1] % context == 0 else None
    return (rows, tokens) if tokens else (rows,)


def per_token_shard(fn, x: jax.Array, *replicated: jax.Array) -> jax.Array:
    """`fn(x, *replicated)`, run on each `data` (and `context`) shard of `x` apart.

    Under a mesh (`jax.set_mesh`) whose `data` axis has n > 1 devices dividing `x.shape[0]`, the
    leading axis of `x` is taken as sharded over `data` (and for `[B, T, embed]` the second over
    `context`, where the mesh has one that divides `T`: `token_axes`), and `fn` (a MoE layer's
    routing, sort by expert and grouped experts) runs on each shard on its own device
    (`jax.shard_map` over those axes only; `model` stays with the partitioner), so each device
    sorts and computes only its own tokens' assignments: a sort over the whole batch would make
    the partitioner gather the routing and run every token's experts on every device of the
    axis. `fn` must act on each token alone (a dropless MoE layer does), so the result is the
    same as unsharded. The output has `x`'s leading axes.
    """
    split = token_axes(x.shape) if x.ndim > 1 else ()
    if any(split):
        spec = jax.sharding.PartitionSpec(*split)
        fn = jax.shard_map(
            fn,
            in_specs=(spec,) + (jax.sharding.PartitionSpec(),) * len(replicated),
            out_specs=spec,
            axis_names={a for a in split if a},
            check_vma=False,
        )
    return fn(x, *replicated)
