"""The routed MLP blocks of GPT-OSS, Llama 4 and DeepSeek-V3 (transformers 5 `GptOssMLP`,
`Llama4TextMoe`, `DeepseekV3MoE`): their routers and the blocks, dropless, on the grouped experts
of `ppl_jax.models.layers.moe.experts`.

Routers (each returns weights `[tokens, top_k] float32` and experts `[tokens, top_k] int32`):

- `softmax_of_chosen` (GPT-OSS `GptOssTopKRouter`): logits `x @ W + b` in the input dtype, the
  top k logits, softmax over those k only.
- `sigmoid_of_chosen` (Llama 4 `Llama4Router`): logits `x @ W` in the input dtype, the top k,
  `sigmoid` of each (computed in float32, rounded to the input dtype). Llama 4 multiplies the
  expert's input, not its output, by this weight.
- `grouped_sigmoid` (DeepSeek-V3 `DeepseekV3TopkRouter`, also Nemotron-H's; DeepSeek-AI 2024,
  "DeepSeek-V3 Technical Report", section 2.1.2): everything in float32; scores
  `sigmoid(x @ W)`; the choice is made on `scores + correction_bias` (the auxiliary-loss-free
  balancing bias `e_score_correction_bias`): the experts fall into `groups` equal groups, each
  group is rated by the sum of its two best biased scores, only the best `top_groups` groups
  stay, and the `top_k` best biased scores among their experts are chosen; the weights are the
  chosen experts' unbiased scores, divided by their sum (`norm_topk_prob`, with transformers'
  `+ 1e-20`), times `routed_scaling_factor`.

Ties: `jax.lax.top_k` takes the lower index first among equal values, where `torch.topk` may take
either (see `ppl_jax.models.layers.moe.dropless`); only exactly equal values at the k-th place can
differ.

The blocks add their shared expert (Llama 4, DeepSeek-V3: a SwiGLU, ungated) to the routed sum.
Params carry `logical_axes` as `ppl_jax.models.layers.moe.dropless.MoeMLP`'s do (`experts`, `embed`,
`mlp`); the routing and the grouped experts run per `data` (and `context`) shard
(`ppl_jax.models.layers.moe.experts.per_token_shard`).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from flax import nnx

from ppl_jax.errors import CheckpointError
from ppl_jax.models.layers.core import normal_param, zeros_param
from ppl_jax.models.layers.moe.experts import (
    SWIGLU,
    ClampedSwiGLU,
    per_token_shard,
    swiglu,
    weighted_sum,
)


def _logits(x, router, bias=None):
    """`x @ router (+ bias)` in float32, rounded once to `x.dtype` (transformers' `F.linear` in
    the model dtype)."""
    logits = jnp.dot(x, router.astype(x.dtype), preferred_element_type=jnp.float32)
    if bias is not None:
        logits = logits + bias.astype(jnp.float32)
    return logits.astype(x.dtype).astype(jnp.float32)


def softmax_of_chosen(
    x: jax.Array, router: jax.Array, bias: jax.Array, top_k: int
) -> tuple[jax.Array, jax.Array]:
    """GPT-OSS: the `top_k` largest logits of `x [tokens, embed] @ router [embed, experts] +
    bias [experts]`, softmax over them (float32)."""
    values, experts = jax.lax.top_k(_logits(x, router, bias), top_k)
    return jax.nn.softmax(values, axis=-1), experts.astype(jnp.int32)


def sigmoid_of_chosen(x: jax.Array, router: jax.Array, top_k: int) -> tuple[jax.Array, jax.Array]:
    """Llama 4: the `top_k` largest logits of `x [tokens, embed] @ router [embed, experts]`,
    each through a sigmoid in float32 rounded to `x.dtype`."""
    values, experts = jax.lax.top_k(_logits(x, router), top_k)
    weights = jax.nn.sigmoid(values).astype(x.dtype).astype(jnp.float32)
    return weights, experts.astype(jnp.int32)


def grouped_sigmoid(
    x: jax.Array,
    router: jax.Array,
    correction_bias: jax.Array,
    *,
    top_k: int,
    groups: int,
    top_groups: int,
    norm_topk_prob: bool,
    scaling: float,
) -> tuple[jax.Array, jax.Array]:
    """DeepSeek-V3's group-limited sigmoid routing (see the module docstring).

    Args:
      x: `[tokens, embed]`; router: `[embed, experts]`; correction_bias: `[experts]`.
      top_k, groups, top_groups, norm_topk_prob, scaling: `num_experts_per_tok`, `n_group`,
        `topk_group`, `norm_topk_prob`, `routed_scaling_factor`.
    """
    logits = jnp.dot(x.astype(jnp.float32), router.astype(jnp.float32))
    scores = jax.nn.sigmoid(logits)
    choice = scores + correction_bias.astype(jnp.float32)
    tokens, num_experts = choice.shape
    per_group = num_experts // groups
    grouped = choice.reshape(tokens, groups, per_group)
    group_scores = jnp.sum(jax.lax.top_k(grouped, 2)[0], axis=-1)  # [tokens, groups]
    _, best = jax.lax.top_k(group_scores, top_groups)
    kept = jnp.any(best[..., None] == jnp.arange(groups), axis=-2)  # [tokens, groups]
    choice = jnp.where(kept[..., None], grouped, -jnp.inf).reshape(tokens, num_experts)
    _, experts = jax.lax.top_k(choice, top_k)
    weights = jnp.take_along_axis(scores, experts, axis=-1)
    if norm_topk_prob:
        weights = weights / (jnp.sum(weights, axis=-1, keepdims=True) + 1e-20)
    return weights * scaling, experts.astype(jnp.int32)


@dataclasses.dataclass(frozen=True)
class RoutedSpec:
    """One routed MLP block.

    Attributes:
      router: `softmax_of_chosen` (GPT-OSS), `sigmoid_of_chosen` (Llama 4) or `grouped_sigmoid`
        (DeepSeek-V3).
      embed_dim, mlp_dim, num_experts, top_k: the width, each expert's hidden width, the routed
        experts, the experts per token.
      shared_mlp_dim: the shared SwiGLU expert's hidden width (0: none).
      groups, top_groups, norm_topk_prob, scaling: `grouped_sigmoid`'s (DeepSeek-V3).
      alpha, limit: GPT-OSS's clamped SwiGLU (`swiglu_alpha`, `swiglu_limit`).
    """

    router: str
    embed_dim: int
    mlp_dim: int
    num_experts: int
    top_k: int
    shared_mlp_dim: int = 0
    groups: int = 1
    top_groups: int = 1
    norm_topk_prob: bool = True
    scaling: float = 1.0
    alpha: float = 1.702
    limit: float = 7.0

    def __post_init__(self):
        if self.router not in ROUTERS:
            raise CheckpointError(f"router {self.router!r} is not one of {', '.join(ROUTERS)}.")
        if not 0 < self.top_k <= self.num_experts:
            raise CheckpointError(
                f"num_experts_per_tok={self.top_k} must be between 1 and the "
                f"{self.num_experts} experts."
            )
        if self.router == "grouped_sigmoid":
            per = self.num_experts // self.groups if self.groups > 0 else 0
            if per < 2 or self.num_experts % self.groups or not 0 < self.top_groups <= self.groups:
                raise CheckpointError(
                    f"n_group={self.groups} must divide the {self.num_experts} experts into "
                    f"groups of at least 2, and topk_group={self.top_groups} be 1 to n_group."
                )
            if self.top_k > self.top_groups * per:
                raise CheckpointError(
                    f"num_experts_per_tok={self.top_k} exceeds the {self.top_groups * per} "
                    f"experts of the topk_group={self.top_groups} groups kept."
                )


ROUTERS = ("softmax_of_chosen", "sigmoid_of_chosen", "grouped_sigmoid")


class RoutedMLP(nnx.Module):
    """A routed MLP block as an NNX module (see the module docstring).

    Params: `router [embed, experts]`; `gate`, `up [experts, embed, mlp]`,
    `down [experts, mlp, embed]`; GPT-OSS: `router_bias [experts]`, `gate_bias`,
    `up_bias [experts, mlp]`, `down_bias [experts, embed]`; DeepSeek-V3: `router` and
    `router_bias [experts]` (`e_score_correction_bias`) in float32 whatever the model dtype, as
    transformers keeps them; with `shared_mlp_dim`: `shared_gate`, `shared_up [embed, s]`,
    `shared_down [s, embed]`. Initialised N(0, fan_in^-1), biases zero.
    """

    def __init__(self, spec: RoutedSpec, rngs: nnx.Rngs, dtype: jnp.dtype = jnp.float32):
        d, f, e, s = spec.embed_dim, spec.mlp_dim, spec.num_experts, spec.shared_mlp_dim
        self.spec = spec
        router_dtype = jnp.float32 if spec.router == "grouped_sigmoid" else dtype
        self.router = normal_param(rngs, (d, e), ("embed", "experts"), d**-0.5, router_dtype)
        if spec.router != "sigmoid_of_chosen":
            self.router_bias = zeros_param((e,), ("experts",), router_dtype)
        self.gate = normal_param(rngs, (e, d, f), ("experts", "embed", "mlp"), d**-0.5, dtype)
        self.up = normal_param(rngs, (e, d, f), ("experts", "embed", "mlp"), d**-0.5, dtype)
        self.down = normal_param(rngs, (e, f, d), ("experts", "mlp", "embed"), f**-0.5, dtype)
        if spec.router == "softmax_of_chosen":
            self.gate_bias = zeros_param((e, f), ("experts", "mlp"), dtype)
            self.up_bias = zeros_param((e, f), ("experts", "mlp"), dtype)
            self.down_bias = zeros_param((e, d), ("experts", "embed"), dtype)
        if s:
            self.shared_gate = normal_param(rngs, (d, s), ("embed", "mlp"), d**-0.5, dtype)
            self.shared_up = normal_param(rngs, (d, s), ("embed", "mlp"), d**-0.5, dtype)
            self.shared_down = normal_param(rngs, (s, d), ("mlp", "embed"), s**-0.5, dtype)

    def __call__(self, x: jax.Array) -> jax.Array:
        """`[..., embed]` -> `[..., embed]` in `x.dtype`; the routed experts' sum (and the
        shared expert's output) in float32, cast once."""
        spec = self.spec
        names = ("gate", "up", "down")
        if spec.router == "softmax_of_chosen":
            names += ("gate_bias", "up_bias", "down_bias")
        router = (self.router[...],)
        if spec.router != "sigmoid_of_chosen":
            router += (self.router_bias[...],)
        params = tuple(getattr(self, n)[...] for n in names)
        routed = functools.partial(_routed, spec=spec, n_router=len(router))
        out = per_token_shard(routed, x, *router, *params)
        if spec.shared_mlp_dim:
            shared = swiglu(x, self.shared_gate[...], self.shared_up[...], self.shared_down[...])
            out = out + shared.astype(jnp.float32)
        return out.astype(x.dtype)


def _routed(x, *arrays, spec: RoutedSpec, n_router: int):
    """`[..., embed]` -> the routed experts' weighted sum, `[..., embed] float32`."""
    shape = x.shape
    x = x.reshape(-1, shape[-1])
    router, params = arrays[:n_router], arrays[n_router:]
    mlp, scale_input = SWIGLU, False
    if spec.router == "softmax_of_chosen":
        weights, experts = softmax_of_chosen(x, *router, spec.top_k)
        mlp = ClampedSwiGLU(spec.alpha, spec.limit)
    elif spec.router == "sigmoid_of_chosen":
        weights, experts = sigmoid_of_chosen(x, *router, spec.top_k)
        scale_input = True
    else:
        weights, experts = grouped_sigmoid(
            x,
            *router,
            top_k=spec.top_k,
            groups=spec.groups,
            top_groups=spec.top_groups,
            norm_topk_prob=spec.norm_topk_prob,
            scaling=spec.scaling,
        )
    out = weighted_sum(x, weights, experts, params, mlp=mlp, scale_input=scale_input)
    return out.reshape(shape)
