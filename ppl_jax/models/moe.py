"""A mixture-of-experts SwiGLU layer, dropless and grouped (Shazeer et al. 2017; Jiang et al.
2024, "Mixtral of Experts"), with the routing of the Hugging Face `mixtral`, `qwen2_moe`,
`qwen3_moe` and `olmoe` model types (transformers 5.23 `*TopKRouter`, `*Experts`,
`*SparseMoeBlock`).

Routing (`route`): router logits `x @ router` rounded to the input dtype (transformers'
`F.linear` in the model dtype), softmax over all experts in float32, `jax.lax.top_k`, then
division by the sum of the top-k weights when `norm_topk_prob` (Mixtral always does; OLMoE,
Qwen2-MoE and Qwen3-MoE read `norm_topk_prob`). Qwen2-MoE adds a shared SwiGLU expert scaled by
`sigmoid(x @ shared_gate)`.

Ties. `jax.lax.top_k` puts the lower expert index first among equal probabilities, so of two tied
experts straddling the k-th place ppl_jax takes the lower index. `torch.topk` on CPU has no such
rule: it runs libstdc++'s `std::nth_element` (or `std::partial_sort` when `64 * k <= experts`)
on (value, index) pairs compared by value only, so its choice depends on the other values of the
row (measured: the lower index in 40-60% of random boundary ties). Ties inside the top k give the
same set in both; only exactly equal probabilities at the k-th place can differ (identical router
rows, or bfloat16 logits rounded to the same value).

Dropless and grouped (`_weighted_sum`): every (token, slot) assignment reaches its expert
whatever the batch, with no capacity. Assignments are sorted by expert (stable), the experts'
SwiGLU runs on the sorted rows with group sizes = tokens per expert, and the rows are unsorted and
combined with the routing weights in float32. On TPU and GPU this is `jax.lax.ragged_dot`. On CPU
`ragged_dot` lowers (jax 0.10) to a masked dense product that holds an `[experts, rows, k]`
buffer and does every expert's work for every row, so there (`jax.lax.platform_dependent`) the
sorted assignments are padded per expert to whole tiles, and a loop over the experts runs a loop
over each expert's tiles (`_tiled_sum`): gather the tile's tokens, the three matmuls, add into
the tokens' float32 sums. The largest buffers are the `[tokens, embed]` sums and a few
`[tokens * top_k + experts * tile]` index vectors; no `[tokens, experts, mlp]` buffer exists on
any path.

Sharding. Weights carry `logical_axes`: router `("embed", "experts")`, expert weights
`("experts", "embed", "mlp")` and `("experts", "mlp", "embed")`, the shared expert as the dense
MLP, its gate `("embed",)`. `ppl_jax.runtime.mesh.DEFAULT_RULES` maps `experts` to None, so by
default the experts are replicated and split along `mlp` over the `model` axis, as dense MLPs are.
The mesh's weights are split over `model` only; to shard the experts themselves, map them to
`model` and unmap `mlp` (one weight cannot use `model` twice), e.g. in a config file
`c.mesh.rules = tuple(r for r in DEFAULT_RULES if r[0] != "mlp") + (("experts", "model"),
("mlp", None))` with `mesh.model=2` (the `data=4, expert=2` layout of the tests). XLA's
partitioner then stores each expert on one device at rest and all-gathers the expert weights for
the step: results are identical, but this is not all-to-all expert parallelism. The batch is
split over `data` (and a row's tokens over `context`): under the mesh that
`ppl_jax.scoring.scorer.Scorer` sets while compiling, the routing, the sort by expert and the
grouped computation run per shard (`jax.shard_map` over `data` and `context`, the `model` axis
left to the partitioner), so each device sorts and computes
only its own rows' assignments; a sort over the whole batch would make the partitioner gather
the routing and run every token's experts on every device of the axis.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import PartitionSpec

from ppl_jax.errors import CheckpointError
from ppl_jax.models.layers import normal_param


@dataclasses.dataclass(frozen=True)
class MoeSpec:
    """Shape and routing of one MoE layer.

    Attributes:
      embed_dim: the model width (`hidden_size`).
      mlp_dim: each expert's hidden width (`moe_intermediate_size` for Qwen2/3-MoE,
        `intermediate_size` for Mixtral and OLMoE).
      num_experts: routed experts (`num_local_experts` or `num_experts`; the Hugging Face
        configs are read by `ppl_jax.models.families.mixture`).
      top_k: experts per token (`num_experts_per_tok`).
      norm_topk_prob: renormalise the top-k weights to sum to 1 (always for Mixtral).
      shared_mlp_dim: the shared expert's hidden width (Qwen2-MoE
        `shared_expert_intermediate_size`), 0 for none; it comes with its sigmoid gate.
    """

    embed_dim: int
    mlp_dim: int
    num_experts: int
    top_k: int
    norm_topk_prob: bool = True
    shared_mlp_dim: int = 0

    def __post_init__(self):
        if not 0 < self.top_k <= self.num_experts:
            raise CheckpointError(
                f"num_experts_per_tok={self.top_k} must be between 1 and the "
                f"{self.num_experts} experts."
            )


def route(
    x: jax.Array, router: jax.Array, top_k: int, norm_topk_prob: bool
) -> tuple[jax.Array, jax.Array]:
    """Softmax top-k routing.

    Args:
      x: `[tokens, embed]`, any float dtype.
      router: `[embed, experts]` (the transpose of transformers' `gate.weight`).
      top_k, norm_topk_prob: as in `MoeSpec`.

    Returns:
      (weights `[tokens, top_k] float32`, experts `[tokens, top_k] int32`), by decreasing weight,
      the lower expert index first among equal weights.
    """
    logits = jnp.dot(x, router.astype(x.dtype), preferred_element_type=jnp.float32)
    probs = jax.nn.softmax(logits.astype(x.dtype).astype(jnp.float32), axis=-1)
    weights, experts = jax.lax.top_k(probs, top_k)
    if norm_topk_prob:
        weights = weights / jnp.sum(weights, axis=-1, keepdims=True)
    return weights, experts.astype(jnp.int32)


def default_tile(rows: int, num_experts: int) -> int:
    """The CPU path's rows per tile: the power of two at or below a quarter of the mean rows per
    expert, 16 to 128. Padding then wastes at most about 1/8 of the rows; on the 2-core CPU of
    BENCHMARKS.md, tiles of 128-256 rows ran fastest for 8 experts (64 ran 0.9x as fast, 512
    0.9x), and 32-256 alike for 64 narrow experts; a quarter rather than an eighth of the mean
    made the MoE families' whole model 1.04-1.05x as fast (tiles of 128 rather than 64)."""
    quarter = max(1, rows // (4 * num_experts))
    return int(min(128, max(16, 1 << (quarter.bit_length() - 1))))


def _swiglu(x, gate, up, down):
    return jnp.dot(jax.nn.silu(jnp.dot(x, gate)) * jnp.dot(x, up), down)


def _ragged_swiglu(xs, gate, up, down, group_sizes):
    h = jax.nn.silu(jax.lax.ragged_dot(xs, gate, group_sizes))
    return jax.lax.ragged_dot(h * jax.lax.ragged_dot(xs, up, group_sizes), down, group_sizes)


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


def _tiled_sum(x, token, weight, gate, up, down, group_sizes, tile):
    """The CPU path: `[tokens, embed] float32`, each token's sum of `weight * swiglu_e(x[token])`
    over its assignments.

    `token`, `weight`: `[rows]`, each assignment's token and routing weight, sorted by expert
    (`group_sizes` rows each). Each expert's assignments are padded to whole tiles (token index
    `tokens`: a zero row in, dropped out); a loop over the experts takes each expert's three
    weights once, and a loop inside it runs that expert's tiles: gather the tile's rows of `x`,
    the SwiGLU in `x.dtype`, scale by the weights in float32 and add into the tokens' sums. A
    token's sum is taken in the order of its experts' indices, whatever the batch. Measured
    (BENCHMARKS.md, 64 experts of width 128): a flat loop over tiles, which copies an expert's
    weights at every tile, and sorted copies of `x` and of the outputs (`[rows, embed]` each)
    made the layer 0.7x as fast.
    """
    tokens = x.shape[0]
    dest, first, count, num_tiles = _tile_layout(group_sizes, token.shape[0], tile)
    padded_token = jnp.full((num_tiles * tile,), tokens, jnp.int32)
    padded_token = padded_token.at[dest].set(token, unique_indices=True)
    padded_weight = jnp.zeros((num_tiles * tile,), jnp.float32)
    padded_weight = padded_weight.at[dest].set(weight, unique_indices=True)

    def expert(e, out):
        weights = (gate[e], up[e], down[e])

        def step(t, out):
            rows = jax.lax.dynamic_slice_in_dim(padded_token, t * tile, tile)
            xt = jnp.take(x, rows, axis=0, mode="fill", fill_value=0)
            yt = _swiglu(xt, *weights).astype(jnp.float32)
            wt = jax.lax.dynamic_slice_in_dim(padded_weight, t * tile, tile)
            return out.at[rows].add(yt * wt[:, None], mode="drop")

        return jax.lax.fori_loop(first[e], first[e] + count[e], step, out)

    out = jnp.zeros((tokens, x.shape[1]), jnp.float32)
    return jax.lax.fori_loop(0, gate.shape[0], expert, out)


def _weighted_sum(x, weights, experts, gate, up, down, tile):
    """`[tokens, embed] float32`: each token's experts' outputs times their routing weights,
    summed. `weights`, `experts`: `[tokens, top_k]` (`route`)."""
    tokens, top_k = experts.shape
    flat = experts.reshape(-1)  # [tokens * top_k], assignment j = (token j // top_k, slot)
    order = jnp.argsort(flat, stable=True)
    group_sizes = jnp.bincount(flat, length=gate.shape[0]).astype(jnp.int32)
    tile = tile or default_tile(flat.shape[0], gate.shape[0])

    def ragged(x, order, group_sizes, weights, gate, up, down):
        ys = _ragged_swiglu(x[order // top_k], gate, up, down, group_sizes)
        y = jnp.zeros_like(ys).at[order].set(ys, unique_indices=True)
        return jnp.einsum("tkd,tk->td", y.reshape(tokens, top_k, -1).astype(jnp.float32), weights)

    def tiled(x, order, group_sizes, weights, gate, up, down):
        w = weights.reshape(-1)[order]
        return _tiled_sum(x, order // top_k, w, gate, up, down, group_sizes, tile)

    args = (x, order, group_sizes, weights, gate, up, down)
    return jax.lax.platform_dependent(*args, cpu=tiled, default=ragged)


def data_shards() -> int:
    """Devices along the `data` axis of the mesh set by `jax.set_mesh` (1 without one): the
    shards `moe_mlp` routes and groups apart. `ppl_jax.scoring.scorer.Scorer` sets its mesh
    while it compiles the step."""
    mesh = jax.sharding.get_abstract_mesh()
    return 1 if mesh.empty else int(dict(mesh.shape).get("data", 1))


def _token_axes(shape: tuple[int, ...]) -> tuple[str | None, ...]:
    """The mesh axes the leading dims of `x` (`[B, T, ..., embed]`) are split over and routed
    apart: `data` for the rows, `context` for the tokens of a row (`ppl_jax.models.context`),
    each where the mesh has it (size > 1) and it divides the dim."""
    mesh = jax.sharding.get_abstract_mesh()
    sizes = {} if mesh.empty else dict(mesh.shape)
    data, context = sizes.get("data", 1), sizes.get("context", 1)
    rows = "data" if data > 1 and shape[0] % data == 0 else None
    tokens = "context" if len(shape) > 2 and context > 1 and shape[1] % context == 0 else None
    return (rows, tokens) if tokens else (rows,)


def _routed(x, router, gate, up, down, *, top_k, norm_topk_prob, tile):
    """`[..., embed]` -> the routed experts' weighted sum, `[..., embed] float32`."""
    shape = x.shape
    x = x.reshape(-1, shape[-1])
    weights, experts = route(x, router, top_k, norm_topk_prob)
    out = _weighted_sum(x, weights, experts, gate, up, down, tile)
    return out.reshape(shape)


def moe_mlp(
    x: jax.Array,
    router: jax.Array,
    gate: jax.Array,
    up: jax.Array,
    down: jax.Array,
    *,
    top_k: int,
    norm_topk_prob: bool,
    shared_expert: tuple[jax.Array, jax.Array, jax.Array, jax.Array] | None = None,
    tile: int | None = None,
) -> jax.Array:
    """The MoE block of transformers' `*SparseMoeBlock`, dropless.

    Args:
      x: `[..., embed]`, float32 or bfloat16; every leading position is a token. Under a mesh
        (`jax.set_mesh`) whose `data` axis has n > 1 devices and divides `x.shape[0]`, the
        leading axis is taken as sharded over `data` (and for `[B, T, embed]` the second over
        `context`, where the mesh has one that divides `T`: the context axis's token split),
        and each shard is routed, sorted by expert and grouped on its own device
        (`jax.shard_map` over those axes only; `model` stays with the partitioner): every token
        still reaches its top-k experts, so the result is the same as unsharded.
      router: `[embed, experts]`; gate, up: `[experts, embed, mlp]`; down: `[experts, mlp, embed]`.
      top_k, norm_topk_prob: the routing (see `route`).
      shared_expert: Qwen2-MoE's shared expert `(gate [embed, s], up [embed, s], down [s, embed],
        shared_gate [embed])`, added as `sigmoid(x @ shared_gate) * swiglu(x)`; or None.
      tile: rows per tile on CPU (default `default_tile`; see `_tiled_sum`).

    Returns:
      `x.shape`, in `x.dtype`. Routing weights multiply the experts' outputs and the sum over
      experts is taken in float32, then cast once (transformers rounds each expert's weighted
      output to the model dtype and adds in that dtype: the same in float32).
    """
    shape, dtype = x.shape, x.dtype
    routed = functools.partial(_routed, top_k=top_k, norm_topk_prob=norm_topk_prob, tile=tile)
    split = _token_axes(shape) if x.ndim > 1 else ()
    if any(split):
        spec = PartitionSpec(*split)
        routed = jax.shard_map(
            routed,
            in_specs=(spec, PartitionSpec(), PartitionSpec(), PartitionSpec(), PartitionSpec()),
            out_specs=spec,
            axis_names={a for a in split if a},
            check_vma=False,
        )
    out = routed(x, router, gate, up, down)
    if shared_expert is not None:
        s_gate, s_up, s_down, s_scale = shared_expert
        scale = jax.nn.sigmoid(jnp.dot(x, s_scale.astype(dtype)).astype(jnp.float32))
        out = out + scale[..., None] * _swiglu(x, s_gate, s_up, s_down).astype(jnp.float32)
    return out.astype(dtype)


class MoeMLP(nnx.Module):
    """A MoE SwiGLU layer as an NNX module (params as in `moe_mlp`, no biases).

    Params: `router [embed, experts]`, `gate`/`up [experts, embed, mlp]`,
    `down [experts, mlp, embed]`; with `spec.shared_mlp_dim`: `shared_gate_proj`/`shared_up
    [embed, s]`, `shared_down [s, embed]`, `shared_scale [embed]` (transformers'
    `shared_expert_gate.weight[0]`). Initialised like `llama.MLP` (N(0, fan_in^-1)).
    """

    def __init__(self, spec: MoeSpec, rngs: nnx.Rngs, dtype: jnp.dtype = jnp.float32):
        d, f, e, s = spec.embed_dim, spec.mlp_dim, spec.num_experts, spec.shared_mlp_dim
        self.spec = spec
        self.router = normal_param(rngs, (d, e), ("embed", "experts"), d**-0.5, dtype)
        self.gate = normal_param(rngs, (e, d, f), ("experts", "embed", "mlp"), d**-0.5, dtype)
        self.up = normal_param(rngs, (e, d, f), ("experts", "embed", "mlp"), d**-0.5, dtype)
        self.down = normal_param(rngs, (e, f, d), ("experts", "mlp", "embed"), f**-0.5, dtype)
        if s:
            self.shared_gate_proj = normal_param(rngs, (d, s), ("embed", "mlp"), d**-0.5, dtype)
            self.shared_up = normal_param(rngs, (d, s), ("embed", "mlp"), d**-0.5, dtype)
            self.shared_down = normal_param(rngs, (s, d), ("mlp", "embed"), s**-0.5, dtype)
            self.shared_scale = normal_param(rngs, (d,), ("embed",), d**-0.5, dtype)

    def __call__(self, x: jax.Array) -> jax.Array:
        """`[..., embed]` -> `[..., embed]`, in `x.dtype`."""
        spec = self.spec
        names = ("shared_gate_proj", "shared_up", "shared_down", "shared_scale")
        shared_expert = tuple(getattr(self, n)[...] for n in names) if spec.shared_mlp_dim else None
        return moe_mlp(
            x,
            self.router[...],
            self.gate[...],
            self.up[...],
            self.down[...],
            top_k=spec.top_k,
            norm_topk_prob=spec.norm_topk_prob,
            shared_expert=shared_expert,
        )
