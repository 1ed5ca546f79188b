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

Dropless and grouped: every (token, slot) assignment reaches its expert whatever the batch, with
no capacity; the grouped computation (`jax.lax.ragged_dot` on TPU and GPU, tiles per expert on
CPU) is `ppl_jax.models.layers.moe.experts.weighted_sum`, shared with the other MoE families.

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
grouped computation run per shard (`ppl_jax.models.layers.moe.experts.per_token_shard`:
`jax.shard_map` over `data` and `context`, the `model` axis left to the partitioner), so each device
sorts and computes only its own tokens' assignments; a sort over the whole batch would make the
partitioner gather the routing and run every token's experts on every device of the axis.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from flax import nnx

from ppl_jax.errors import CheckpointError
from ppl_jax.models.layers.core import normal_param
from ppl_jax.models.layers.moe.experts import per_token_shard, swiglu, weighted_sum


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


def _routed(x, router, gate, up, down, *, top_k, norm_topk_prob, tile):
    """`[..., embed]` -> the routed experts' weighted sum, `[..., embed] float32`."""
    shape = x.shape
    x = x.reshape(-1, shape[-1])
    weights, experts = route(x, router, top_k, norm_topk_prob)
    out = weighted_sum(x, weights, experts, (gate, up, down), tile=tile)
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
      tile: rows per tile on CPU (see `ppl_jax.models.layers.moe.experts.weighted_sum`).

    Returns:
      `x.shape`, in `x.dtype`. Routing weights multiply the experts' outputs and the sum over
      experts is taken in float32, then cast once (transformers rounds each expert's weighted
      output to the model dtype and adds in that dtype: the same in float32).
    """
    dtype = x.dtype
    routed = functools.partial(_routed, top_k=top_k, norm_topk_prob=norm_topk_prob, tile=tile)
    out = per_token_shard(routed, x, router, gate, up, down)
    if shared_expert is not None:
        s_gate, s_up, s_down, s_scale = shared_expert
        scale = jax.nn.sigmoid(jnp.dot(x, s_scale.astype(dtype)).astype(jnp.float32))
        out = out + scale[..., None] * swiglu(x, s_gate, s_up, s_down).astype(jnp.float32)
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
