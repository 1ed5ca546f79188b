"""Qwen3.5 and Qwen3-Next (Hugging Face `qwen3_5_text`, the text model of `qwen3_5`, and
`qwen3_next`; transformers 5.24's `modeling_qwen3_5` and `modeling_qwen3_next`): decoders whose
layers mix with Gated DeltaNet (`ppl_jax.models.layers.gated_delta`, the `linear_attention` layers,
three of every four by default) or with gated full attention, each followed by an MLP:

    x = x + mixer(rms_norm(x));   x = x + mlp(rms_norm(x))

with RMSNorms `x̂·(1+w)` (weights stored around 0). The attention (`ppl_jax.models.decoders.hybrid`)
packs each head's query and output gate in `q_proj` (`out = attn * sigmoid(gate)`), normalises each
head of q and k (`x̂·(1+w)`) and rotates the first `partial_rotary_factor` of each head's dims
(Qwen3.5's multimodal rotary sections coincide with the plain rotation when the three position axes
are equal, as they are for text). Qwen3-Next's MLPs are mixtures of experts on the layers
`decoder_sparse_step` and `mlp_only_layers` choose (softmax top-k, renormalised by
`norm_topk_prob`), each with a shared expert scaled by `sigmoid(x @ shared_expert_gate)`
(`ppl_jax.models.layers.moe.dropless`). Qwen3-Next keeps each key head's q, k, values and gates
interleaved in one projection (`in_proj_qkvz`, `in_proj_ba`), Qwen3.5 in separate ones: the weights'
mapping differs, the model does not.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
from flax import nnx

from ppl_jax.errors import CheckpointError
from ppl_jax.models.decoders import hybrid, llama_hf
from ppl_jax.models.decoders.stack import run_layers
from ppl_jax.models.family import Family, Layer
from ppl_jax.models.layers import gated_delta, packed
from ppl_jax.models.layers import rope as rope_lib
from ppl_jax.models.layers.core import normal_param, rms_norm
from ppl_jax.models.layers.moe import dropless

MODEL_TYPES = ("qwen3_5_text", "qwen3_5", "qwen3_next")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Qwen35Config(hybrid.DescribedConfig):
    """Architecture of a Qwen3.5 or Qwen3-Next model (stored as JSON beside each checkpoint).

    Attributes:
      vocab_size, embed_dim, num_layers, mlp_dim: the sizes.
      linear_layers: the Gated DeltaNet layers (the others: full attention).
      num_heads, num_kv_heads, head_dim, rope, max_positions, attention_bias: the attention
        (`rope`: `rope_*` fields as pairs, `rotary_dim` the rotated dims).
      gdn_key_heads, gdn_key_dim, gdn_value_heads, gdn_value_dim, gdn_conv: the Gated DeltaNet
        layers (`linear_num_key_heads`, ...); gdn_chunk: their scan's chunk (changes no number).
      moe_layers, moe_experts, moe_mlp_dim, moe_top_k, moe_norm_topk_prob,
        moe_shared_mlp_dim: Qwen3-Next's mixtures of experts (none for Qwen3.5).
      norm_eps: every RMSNorm's epsilon (`rms_norm_eps`).
      tie_embeddings: the output matrix is the embedding's transpose.
      model_type: the Hugging Face model type it was read from (its weights' layout).
    """

    FAMILY: ClassVar[str] = "qwen3_5"
    vocab_size: int
    embed_dim: int
    num_layers: int
    mlp_dim: int
    linear_layers: tuple[int, ...]
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rope: tuple[tuple[str, Any], ...] = (("rope_theta", 10000.0), ("rope_type", "default"))
    max_positions: int = 32768
    attention_bias: bool = False
    gdn_key_heads: int
    gdn_key_dim: int
    gdn_value_heads: int
    gdn_value_dim: int
    gdn_conv: int = 4
    gdn_chunk: int = gated_delta.DEFAULT_CHUNK
    moe_layers: tuple[int, ...] = ()
    moe_experts: int = 0
    moe_mlp_dim: int = 0
    moe_top_k: int = 0
    moe_norm_topk_prob: bool = True
    moe_shared_mlp_dim: int = 0
    norm_eps: float = 1e-6
    tie_embeddings: bool = False
    model_type: str = "qwen3_5_text"

    def __post_init__(self):
        if self.gdn_value_heads % self.gdn_key_heads:
            raise CheckpointError(
                f"linear_num_value_heads={self.gdn_value_heads} is not a multiple of "
                f"linear_num_key_heads={self.gdn_key_heads}."
            )
        self.attention_spec()
        if self.moe_layers:
            self.moe_spec()

    def attention_spec(self) -> hybrid.AttentionSpec:
        return hybrid.spec_of(
            hybrid.AttentionSpec, self, output_gate=True, qk_norm=True, bias=self.attention_bias
        )

    def gdn_spec(self) -> gated_delta.GatedDeltaSpec:
        return hybrid.spec_of(gated_delta.GatedDeltaSpec, self, "gdn_", conv_kernel=self.gdn_conv)

    def moe_spec(self) -> dropless.MoeSpec:
        return hybrid.spec_of(dropless.MoeSpec, self, "moe_", num_experts=self.moe_experts)


def from_hf_config(c: dict[str, Any]) -> Qwen35Config:
    """The architecture of a Hugging Face `qwen3_5_text`, `qwen3_5` (its `text_config`) or
    `qwen3_next` `config.json`, with transformers 5.24's defaults for missing fields.

    Raises:
      CheckpointError: another activation than silu, an unsupported rope scaling, bad
        `layer_types`. KeyError: a required field is missing.
    """
    model_type = c.get("model_type")
    if model_type == "qwen3_5":
        tie = c.get("tie_word_embeddings")
        c = {**c["text_config"], "model_type": "qwen3_5"}
        if tie is not None:
            c["tie_word_embeddings"] = tie
    if (c.get("hidden_act") or "silu") != "silu":
        raise CheckpointError(f"hidden_act {str(c['hidden_act'])[:40]!r} is not supported (silu).")
    layers = int(c["num_hidden_layers"])
    types = c.get("layer_types")
    if types is None:
        interval = int(c.get("full_attention_interval", 4))
        types = [
            "linear_attention" if (i + 1) % interval else "full_attention" for i in range(layers)
        ]
    if len(types) != layers or set(types) - {"linear_attention", "full_attention"}:
        raise CheckpointError(
            f"layer_types are not {layers} of linear_attention and full_attention."
        )
    common = llama_hf.hf_common(c, num_heads=16, head_dim=256, max_positions=32768)
    head_dim, max_positions = common["head_dim"], common["max_positions"]
    rope = {**(c.get("rope_scaling") or {}), **(c.get("rope_parameters") or {})}
    rope.setdefault("rope_theta", c.get("rope_theta", 10000.0))
    rope.setdefault("partial_rotary_factor", c.get("partial_rotary_factor", 0.25))
    try:
        rope_fields = rope_lib.from_hf(rope, c, head_dim, max_positions)
    except ValueError as e:
        raise CheckpointError(f"{e}.") from None
    fields: dict[str, Any] = {}
    if model_type == "qwen3_next" and int(c.get("num_experts", 512)) > 0:
        step, dense = int(c.get("decoder_sparse_step", 1)), set(c.get("mlp_only_layers") or ())
        fields = dict(
            moe_layers=tuple(i for i in range(layers) if i not in dense and (i + 1) % step == 0),
            moe_experts=int(c.get("num_experts", 512)),
            moe_mlp_dim=int(c.get("moe_intermediate_size", 512)),
            moe_top_k=int(c.get("num_experts_per_tok", 10)),
            moe_norm_topk_prob=bool(c.get("norm_topk_prob", True)),
            moe_shared_mlp_dim=int(c.get("shared_expert_intermediate_size", 512)),
        )
    return Qwen35Config(
        **common,
        linear_layers=tuple(i for i, t in enumerate(types) if t == "linear_attention"),
        rope=tuple(sorted(rope_fields.items())),
        attention_bias=bool(c.get("attention_bias", False)),
        gdn_key_heads=int(c.get("linear_num_key_heads", 16)),
        gdn_key_dim=int(c.get("linear_key_head_dim", 128)),
        gdn_value_heads=int(c.get("linear_num_value_heads", 32)),
        gdn_value_dim=int(c.get("linear_value_head_dim", 128)),
        gdn_conv=int(c.get("linear_conv_kernel_dim", 4)),
        model_type=str(model_type),
        **fields,
    )


def _norm(dim: int, dtype: jnp.dtype) -> nnx.Param:
    return nnx.Param(jnp.zeros((dim,), dtype), logical_axes=("embed",))  # x̂·(1+w)


class Block(nnx.Module):
    def __init__(
        self, cfg: Qwen35Config, layer: int, rngs: nnx.Rngs, dtype: jnp.dtype, attention: str
    ):
        self.eps = cfg.norm_eps
        self.linear = layer in cfg.linear_layers
        self.attn_norm = _norm(cfg.embed_dim, dtype)
        if self.linear:
            self.linear_attn = gated_delta.GatedDeltaNet(cfg.gdn_spec(), rngs, dtype)
        else:
            self.attn = hybrid.Attention(cfg.attention_spec(), rngs, dtype, attention)
        self.mlp_norm = _norm(cfg.embed_dim, dtype)
        if layer in cfg.moe_layers:
            self.mlp = dropless.MoeMLP(cfg.moe_spec(), rngs, dtype)
        else:
            self.mlp = hybrid.MLP(hybrid.MLPSpec(cfg.embed_dim, cfg.mlp_dim), rngs, dtype)

    def __call__(self, x: jax.Array, positions: jax.Array, segment_ids: jax.Array) -> jax.Array:
        h = rms_norm(x, self.attn_norm[...], self.eps, 1.0)
        if self.linear:
            x = x + self.linear_attn(h, segment_ids)
        else:
            x = x + self.attn(h, positions, segment_ids)
        return x + self.mlp(rms_norm(x, self.mlp_norm[...], self.eps, 1.0))


class Qwen35(nnx.Module):
    """The decoder. `__call__(tokens, positions, segment_ids)` gives final hidden states
    `[B, T, embed]` in the weights' dtype; `unembedding()` the `[embed, vocab]` output matrix."""

    def __init__(
        self, cfg: Qwen35Config, rngs: nnx.Rngs, dtype: jnp.dtype = jnp.float32, attention="xla"
    ):
        self.cfg = cfg
        d = cfg.embed_dim
        self.embedding = normal_param(rngs, (cfg.vocab_size, d), ("vocab", "embed"), d**-0.5, dtype)
        self.layers = nnx.List(
            [Block(cfg, i, rngs, dtype, attention) for i in range(cfg.num_layers)]
        )
        self.final_norm = _norm(d, dtype)
        if not cfg.tie_embeddings:
            self.lm_head = normal_param(
                rngs, (d, cfg.vocab_size), ("embed", "vocab"), d**-0.5, dtype
            )

    def __call__(self, tokens: jax.Array, positions: jax.Array, segment_ids: jax.Array):
        x = packed.take(self.embedding, tokens)
        x = run_layers(self.layers, x, positions, segment_ids)
        return rms_norm(x, self.final_norm[...], self.cfg.norm_eps, 1.0)

    def unembedding(self) -> jax.Array:
        return self.embedding[...].T if self.cfg.tie_embeddings else self.lm_head[...]


LAYER = r"layers\.(?P<l>\d+)\."


def rules(d: dict[str, Any]) -> list[dict[str, Any]]:
    """The mapping rules of a `qwen3_5_text`, `qwen3_5` or `qwen3_next` directory's weights
    (names without the text model's prefix; the vision tower and the multi-token-prediction
    layer left unused): Gated DeltaNet by the layout of `model_type`, the attention's packed
    query and gate, Qwen3-Next's per-expert tensors stacked into `[experts, ...]`."""
    linear, mlp = {"transpose": [1, 0]}, LAYER + r"mlp\."
    experts = [
        {"from": mlp + r"gate\.weight", "to": "layers/{l}/mlp/router", **linear},
        {"from": mlp + r"experts\.(?P<e>\d+)\.(?P<p>gate|up|down)_proj\.weight",
         "to": "layers/{l}/mlp/{p}", "stack": {"axis": 0, "index": "e"}, **linear},
        {"from": mlp + r"shared_expert\.gate_proj\.weight", "to": "layers/{l}/mlp/shared_gate_proj",
         **linear},
        {"from": mlp + r"shared_expert\.(?P<p>up|down)_proj\.weight",
         "to": "layers/{l}/mlp/shared_{p}", **linear},
        {"from": mlp + r"shared_expert_gate\.weight", "to": "layers/{l}/mlp/shared_scale",
         "reshape": ["embed_dim"]},
    ]  # fmt: skip
    return [
        {"from": r"(visual|mtp)\..*", "to": None},
        *hybrid.embedding_rules(d, r"embed_tokens\.weight", r"norm\.weight"),
        {"from": LAYER + r"input_layernorm\.weight", "to": "layers/{l}/attn_norm"},
        {"from": LAYER + r"post_attention_layernorm\.weight", "to": "layers/{l}/mlp_norm"},
        *gated_delta.hf_rules(
            LAYER + r"linear_attn\.", "layers/{l}/linear_attn/", d.get("model_type", "")
        ),
        *hybrid.attention_rules(LAYER + r"self_attn\.", "layers/{l}/attn/", output_gate=True),
        *hybrid.mlp_rules(mlp, "layers/{l}/mlp/"),
        *experts,
    ]


def layer_kinds(cfg: Qwen35Config) -> tuple[Layer, ...]:
    """Gated DeltaNet (`linear_attention`) or gated attention, then a dense MLP or experts."""
    return tuple(
        Layer(
            "linear_attention" if i in cfg.linear_layers else "attention",
            "moe" if i in cfg.moe_layers else "dense",
        )
        for i in range(cfg.num_layers)
    )


FAMILY = Family(
    name="qwen3_5",
    config=Qwen35Config,
    module=Qwen35,
    hf_sizes={
        **dict.fromkeys(("num_experts", "num_experts_per_tok"), ("moe_experts", 0)),
        "moe_intermediate_size": ("moe_mlp_dim", 1),
        "shared_expert_intermediate_size": ("moe_shared_mlp_dim", 0),
        **dict.fromkeys(("decoder_sparse_step", "full_attention_interval"), ("max_positions", 1)),
        "linear_conv_kernel_dim": ("gdn_conv", 1),
        **dict.fromkeys(("linear_num_key_heads", "linear_num_value_heads"), ("gdn_key_heads", 1)),
        **dict.fromkeys(("linear_key_head_dim", "linear_value_head_dim"), ("gdn_key_dim", 1)),
    },
    hf_readers={t: from_hf_config for t in MODEL_TYPES},
    hf_rules=rules,
    hf_prefixes=llama_hf.PREFIXES,
    layers=layer_kinds,
)
