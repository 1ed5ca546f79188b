"""Llama 4's text model (Hugging Face `llama4_text`; Meta 2025), as transformers 5.24's
`modeling_llama4` computes it:

- rotary layers (`no_rope_layers` 1; by default all but every fourth, `no_rope_layer_interval`)
  rotate adjacent pairs of each head (complex multiplication,
  `ppl_jax.models.layers.qk.rotate_pairs`) with the `llama3` scaling, then (with `use_qk_norm`)
  normalise queries and keys by the L2 norm without a weight (`qk.l2_norm`), and attend within
  chunks of `attention_chunk_size` positions (`layer_types` `chunked_attention`; `attend(chunk=)`);
- NoPE layers (`no_rope_layers` 0) attend to every earlier position without rotation or QK-norm,
  their queries at position p times `1 + attn_scale * log(1 + floor((p + 1) / floor_scale))`
  (`attn_temperature_tuning`; `qk.temperature`);
- MLPs: dense SwiGLU of `intermediate_size_mlp`, or on `moe_layers` (by default every
  `interleave_moe_layer_step`-th) a routed block (`ppl_jax.models.layers.moe.routing`,
  `sigmoid_of_chosen`): the top `num_experts_per_tok` router logits through a sigmoid scale
  the chosen experts' input, plus a shared SwiGLU expert; both of `intermediate_size`.

Quantized weights are read as `quantization_config` says where ppl_jax reads its method
(`ppl_jax.checkpoints.quantized.methods`; the FP8 release's `fbgemm_fp8` is refused there).
Refused: `attention_bias`. Chunked layers: cuDNN runs them as the rows reshaped into their chunks
(`ppl_jax.models.layers.split_merge`), splash by segment ids, one per run of a document's chunk
(`ppl_jax.models.layers.splash_cases`). Verified under a context axis
(tests/slow/test_frontier_context.py).
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
from flax import nnx

from ppl_jax.errors import CheckpointError
from ppl_jax.models.decoders import llama_hf
from ppl_jax.models.decoders.llama import Attention, Llama, LlamaConfig
from ppl_jax.models.family import Family, Layer
from ppl_jax.models.layers import qk
from ppl_jax.models.layers import rope as rope_lib
from ppl_jax.models.layers.moe import routing


@dataclasses.dataclass(frozen=True)
class Llama4Config(LlamaConfig):
    """`LlamaConfig` with Llama 4's attention.

    Attributes:
      nope_layers: the layers without rotary embedding.
      attn_chunk, chunk_layers: the chunk of chunked attention and its layers (the description
        key `attn_chunk` is what `ppl_jax.models.layers.attention.resolve_for` reads).
      qk_l2_norm: the L2 QK-norm on the rotary layers (`use_qk_norm`).
      temperature_tuning, floor_scale, attn_scale: the NoPE layers' query temperature.
    """

    nope_layers: tuple[int, ...] = ()
    attn_chunk: int | None = None
    chunk_layers: tuple[int, ...] = ()
    qk_l2_norm: bool = True
    temperature_tuning: bool = True
    floor_scale: float = 8192.0
    attn_scale: float = 0.1

    FAMILY: ClassVar[str] = "llama4"

    def __post_init__(self):
        super().__post_init__()
        if self.chunk_layers and not self.attn_chunk:
            raise CheckpointError("chunk_layers are given without an attn_chunk.")
        if self.floor_scale <= 0:
            raise CheckpointError(f"floor_scale={self.floor_scale} is not positive.")


class Llama4Attention(Attention):
    """Llama's attention (no biases by default) with Llama 4's treatment of queries and keys,
    and chunks on the chunked layers."""

    def __init__(self, cfg, rngs, dtype, layer: int, attention="xla"):
        super().__init__(cfg, rngs, dtype, None, attention, rotary=layer not in cfg.nope_layers)
        self.chunk = cfg.attn_chunk if layer in cfg.chunk_layers else None

    def position_q(self, q, positions, segment_ids) -> jax.Array:
        cfg = self.cfg
        if self.rotary:
            return self._rotate(q, positions)
        if cfg.temperature_tuning:
            t = qk.temperature(positions, cfg.floor_scale, cfg.attn_scale)
            q = (q.astype(jnp.float32) * t[..., None, None]).astype(q.dtype)
        return q

    def position_k(self, k, positions, segment_ids) -> jax.Array:
        return self._rotate(k, positions) if self.rotary else k

    def _rotate(self, x, positions) -> jax.Array:
        """Adjacent pairs rotated, then (with `use_qk_norm`) the L2 norm without a weight."""
        cfg = self.cfg
        x = qk.rotate_pairs(x, positions, rope_lib.inv_freq(cfg), cfg.rope_attention_factor)
        return qk.l2_norm(x, cfg.norm_eps) if cfg.qk_l2_norm else x

    def attend_options(self) -> dict[str, Any]:
        return {"chunk": self.chunk}


def routed_spec(cfg: Llama4Config) -> routing.RoutedSpec:
    """The `RoutedSpec` of the routed layers."""
    return routing.RoutedSpec(
        "sigmoid_of_chosen",
        cfg.embed_dim,
        cfg.moe_mlp_dim,
        cfg.moe_experts,
        cfg.moe_top_k,
        shared_mlp_dim=cfg.moe_shared_mlp_dim,
    )


class Llama4(Llama):
    """The Llama decoder with `Llama4Attention` on every layer and a routed block on
    `moe_layers`."""

    def make_attention(
        self, cfg: Llama4Config, layer: int, rngs: nnx.Rngs, dtype: jnp.dtype, attention: str
    ) -> nnx.Module:
        return Llama4Attention(cfg, rngs, dtype, layer, attention)

    def make_mlp(self, cfg: Llama4Config, layer: int, rngs: nnx.Rngs, dtype: jnp.dtype):
        if layer in cfg.moe_layers:
            return routing.RoutedMLP(routed_spec(cfg), rngs, dtype)
        return super().make_mlp(cfg, layer, rngs, dtype)


def read_config(c: dict[str, Any]) -> Llama4Config:
    """The architecture of a `llama4_text` `config.json` (transformers 5.24's defaults).

    Raises:
      CheckpointError: an activation other than silu, attention biases,
        `no_rope_layers` or `layer_types` that do not mark every layer, an unsupported rope
        scaling. KeyError: a required field is missing.
    """
    llama_hf.check_activation(c, "hidden_act", "silu", ("silu",))
    if c.get("attention_bias"):
        raise CheckpointError("attention_bias is not supported for Llama 4 (no model uses it).")
    n = int(c["num_hidden_layers"])
    interval = c.get("no_rope_layer_interval", 4)
    rope = c.get("no_rope_layers") or [int((i + 1) % interval != 0) for i in range(n)]
    if not isinstance(rope, list) or len(rope) != n or any(r not in (0, 1) for r in rope):
        raise CheckpointError(f"no_rope_layers must mark each of the {n} layers 1 or 0.")
    chunk = c.get("attention_chunk_size", 8192)
    types = c.get("layer_types") or [
        "chunked_attention" if r and chunk is not None else "full_attention" for r in rope
    ]
    if len(types) != n or set(types) - {"chunked_attention", "full_attention"}:
        raise CheckpointError(f"layer_types are not {n} of chunked_attention and full_attention.")
    chunked = tuple(i for i, t in enumerate(types) if t == "chunked_attention")
    if chunked and not chunk:
        raise CheckpointError("layer_types name chunked layers without an attention_chunk_size.")
    step = int(c.get("interleave_moe_layer_step", 1))
    moe = c.get("moe_layers")
    moe = tuple(range(step - 1, n, step)) if moe is None else tuple(int(i) for i in moe)
    experts = int(c.get("num_local_experts", 16))
    dim = int(c["intermediate_size"])
    return llama_hf.hf_config(
        {**c, "intermediate_size": int(c.get("intermediate_size_mlp", 16384))},
        config=Llama4Config,
        nope_layers=tuple(i for i in range(n) if not rope[i]),
        attn_chunk=int(chunk) if chunked else None,
        chunk_layers=chunked,
        qk_l2_norm=bool(c.get("use_qk_norm", True)),
        temperature_tuning=bool(c.get("attn_temperature_tuning", True)),
        floor_scale=float(c.get("floor_scale", 8192)),
        attn_scale=float(c.get("attn_scale", 0.1)),
        moe_layers=moe if experts else (),
        moe_experts=experts,
        moe_mlp_dim=dim,
        moe_top_k=int(c.get("num_experts_per_tok", 1)),
        moe_shared_mlp_dim=dim,
    )


def rules(d: dict[str, Any]) -> list[dict[str, Any]]:
    """The Llama rules (embeddings, norms, attention) with the MLPs under `feed_forward`: dense,
    or router, experts (gate and up halves of `gate_up_proj`) and shared expert."""
    ff, to, linear = llama_hf.LAYER + r"feed_forward\.", "layers/{l}/mlp/", {"transpose": [1, 0]}
    return [
        {"from": ff + r"(?P<p>gate|up|down)_proj\.weight", "to": to + "{p}", **linear},
        {"from": ff + r"router\.weight", "to": to + "router", **linear},
        {"from": ff + r"experts\.gate_up_proj", "to": [to + "gate", to + "up"],
         "split": {"axis": 2}},
        {"from": ff + r"experts\.down_proj", "to": to + "down"},
        {"from": ff + r"shared_expert\.(?P<p>gate|up|down)_proj\.weight", "to": to + "shared_{p}",
         **linear},
    ] + llama_hf.rules(d)  # fmt: skip


def layer_kinds(cfg: Llama4Config) -> tuple[Layer, ...]:
    """Attention on every layer (`nope` or `chunked`), a routed block on `moe_layers`."""
    return tuple(
        Layer(
            "attention",
            "moe" if i in cfg.moe_layers else "dense",
            "nope" if i in cfg.nope_layers else "chunked" if i in cfg.chunk_layers else "",
        )
        for i in range(cfg.num_layers)
    )


FAMILY = Family(
    name="llama4",
    config=Llama4Config,
    module=Llama4,
    hf_sizes={
        "intermediate_size_mlp": ("mlp_dim", 1),
        "attention_chunk_size": ("attn_chunk", 1),
        **dict.fromkeys(
            ("no_rope_layer_interval", "interleave_moe_layer_step"), ("max_positions", 1)
        ),
        **dict.fromkeys(("num_local_experts", "num_experts_per_tok"), ("moe_experts", 0)),
    },
    hf_readers={"llama4_text": read_config},
    hf_rules=rules,
    hf_prefixes=llama_hf.PREFIXES,
    layers=layer_kinds,
)
