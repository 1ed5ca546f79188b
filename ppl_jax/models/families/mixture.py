"""The Llama decoder with mixtures of experts (Hugging Face `mixtral`, `qwen2_moe`, `qwen3_moe`,
`olmoe`; transformers 5.23): the layers of `moe_layers` run
`ppl_jax.models.layers.moe.dropless.MoeMLP` (`ppl_jax.models.decoders.llama_moe`), the others the
dense MLP.

- Mixtral: Mistral's attention (optional window), softmax top-2 renormalised, every layer sparse;
  weights `block_sparse_moe.{gate, experts.{e}.w1/w3/w2}`.
- Qwen2-MoE: Qwen2's attention (q/k/v biases), a shared expert scaled by
  `sigmoid(shared_expert_gate(x))`, sparse layers by `mlp_only_layers`/`decoder_sparse_step`.
- Qwen3-MoE: Qwen3's attention (per-head QK-norm), the same choice of sparse layers.
- OLMoE: pre-norms with QK-norm over the whole projection, every layer sparse; `clip_qkv` is
  refused (not implemented).

On disk transformers 5.23 keeps one tensor per expert (`experts.{e}.{gate,up,down}_proj.weight`),
which the rules stack into `[experts, ...]` (`stack`). From GGUF (llama.cpp's architectures
`qwen2moe`, `qwen3moe`): experts stacked `[experts, out, in]`; as llama.cpp runs them, every
layer with a router is sparse and Qwen3-MoE renormalizes its top-k weights.
"""

from __future__ import annotations

from typing import Any

from ppl_jax.errors import CheckpointError
from ppl_jax.models import gguf_names
from ppl_jax.models.decoders import llama_hf
from ppl_jax.models.decoders.llama import LlamaConfig
from ppl_jax.models.decoders.llama_moe import LIMITS, MixtureLlama, layer_kinds
from ppl_jax.models.family import Family
from ppl_jax.models.gguf_names import GGUFArchitecture, GGUFHeader
from ppl_jax.models.layers.moe.dropless import MoeSpec

MODEL_TYPES = ("mixtral", "qwen2_moe", "qwen3_moe", "olmoe")
# model type -> (default expert count, default num_experts_per_tok), as in transformers 5.23's
# configuration classes.
_HF_DEFAULTS = {"mixtral": (8, 2), "qwen2_moe": (60, 4), "qwen3_moe": (128, 8), "olmoe": (64, 8)}


def num_experts(c: dict[str, Any], default: int) -> int:
    """The expert count under either name: transformers 5.23 writes `num_local_experts` for
    Mixtral and Qwen3-MoE (`attribute_map`) and `num_experts` for Qwen2-MoE and OLMoE; older
    Qwen3-MoE configs on the hub say `num_experts`."""
    return int(c.get("num_local_experts", c.get("num_experts", default)))


def moe_spec(c: dict[str, Any]) -> MoeSpec:
    """The MoE layer of a `config.json` (model types in `MODEL_TYPES`), with transformers 5.23's
    defaults for missing keys.

    Raises:
      CheckpointError: another model type, or an activation other than silu.
    """
    model_type = c.get("model_type")
    if model_type not in MODEL_TYPES:
        raise CheckpointError(f"model_type {str(model_type)[:40]!r} is not a mixture of experts.")
    llama_hf.check_activation(c, "hidden_act", "silu", ("silu",))
    qwen = model_type in ("qwen2_moe", "qwen3_moe")
    experts, top_k = _HF_DEFAULTS[model_type]
    shared = int(c.get("shared_expert_intermediate_size", 5632)) if model_type == "qwen2_moe" else 0
    return MoeSpec(
        embed_dim=int(c["hidden_size"]),
        mlp_dim=int(c["moe_intermediate_size"] if qwen else c["intermediate_size"]),
        num_experts=num_experts(c, experts),
        top_k=int(c.get("num_experts_per_tok", top_k)),
        norm_topk_prob=model_type == "mixtral" or bool(c.get("norm_topk_prob", False)),
        shared_mlp_dim=shared,
    )


def sparse_layers(c: dict[str, Any]) -> tuple[int, ...]:
    """The layers that hold a MoE block (the others a dense MLP of `intermediate_size`): all of
    them for Mixtral and OLMoE; for Qwen2/3-MoE those not in `mlp_only_layers` with
    `(i + 1) % decoder_sparse_step == 0` (transformers' `Qwen3MoeDecoderLayer`).

    Raises:
      CheckpointError: a `decoder_sparse_step` that is not a whole number of at least 1.
    """
    n = int(c["num_hidden_layers"])
    if c.get("model_type") in ("mixtral", "olmoe"):
        return tuple(range(n))
    step = c.get("decoder_sparse_step", 1)
    if isinstance(step, bool) or not isinstance(step, int) or step < 1:
        raise CheckpointError(
            f"decoder_sparse_step={str(step)[:20]} is not a whole number of at least 1 (every "
            f"step-th layer holds experts)."
        )
    dense = set(c.get("mlp_only_layers") or ())
    if num_experts(c, 0) <= 0:
        return ()
    return tuple(i for i in range(n) if i not in dense and (i + 1) % step == 0)


def read_config(c: dict[str, Any]) -> LlamaConfig:
    """The architecture of a `mixtral`, `qwen2_moe`, `qwen3_moe` or `olmoe` `config.json`.

    Raises:
      CheckpointError: an activation other than silu, OLMoE's `clip_qkv`, an unsupported rope
        scaling, bad `layer_types` or `decoder_sparse_step`. KeyError: a required field is
        missing.
    """
    model_type = c["model_type"]
    if c.get("clip_qkv") is not None:
        raise CheckpointError("clip_qkv is not supported (OLMoE's clamp of q, k and v).")
    if "num_experts" not in c and "num_local_experts" in c and model_type != "mixtral":
        # transformers 5 writes Qwen3-MoE's (attribute-mapped) num_experts as num_local_experts
        c = {**c, "num_experts": c["num_local_experts"]}
    moe = moe_spec(c)
    layers = int(c["num_hidden_layers"])
    fields: dict[str, Any] = {}
    bias = bool(c.get("attention_bias", False))
    if model_type == "mixtral":
        fields.update(llama_hf.hf_sliding(c, layers))
    elif model_type in ("qwen2_moe", "qwen3_moe"):
        fields.update(llama_hf.hf_sliding(c, layers, needs_flag=True, max_window_layers=True))
        if model_type == "qwen2_moe":
            fields.update(qkv_bias=bool(c.get("qkv_bias", True)))
        else:
            fields.update(qkv_bias=bias, o_bias=bias, qk_norm="head")
    else:  # olmoe
        fields.update(qkv_bias=bias, o_bias=bias, qk_norm="projection")
    return llama_hf.hf_config(
        c,
        moe_layers=sparse_layers(c),
        moe_experts=moe.num_experts,
        moe_mlp_dim=moe.mlp_dim,
        moe_top_k=moe.top_k,
        moe_norm_topk_prob=moe.norm_topk_prob,
        moe_shared_mlp_dim=moe.shared_mlp_dim,
        **fields,
    )


def rules(d: dict[str, Any]) -> list[dict[str, Any]]:
    """The Llama rules with each sparse layer's router, experts (stacked) and shared expert."""
    mixtral = d.get("model_type") == "mixtral"
    block = llama_hf.LAYER + (r"block_sparse_moe\." if mixtral else r"mlp\.")
    linear = {"transpose": [1, 0]}
    out = [{"from": block + r"gate\.weight", "to": "layers/{l}/mlp/router", **linear}]
    names = ("w1", "w3", "w2") if mixtral else ("gate_proj", "up_proj", "down_proj")
    for ours, theirs in zip(("gate", "up", "down"), names, strict=True):
        out.append(
            {
                "from": block + r"experts\.(?P<e>\d+)\." + theirs + r"\.weight",
                "to": f"layers/{{l}}/mlp/{ours}",
                "stack": {"axis": 0, "index": "e"},
                **linear,
            }
        )
    if d.get("moe_shared_mlp_dim"):
        shared = llama_hf.LAYER + r"mlp\.shared_expert"
        for ours, theirs in (("gate_proj", "gate_proj"), ("up", "up_proj"), ("down", "down_proj")):
            out.append(
                {"from": shared + rf"\.{theirs}\.weight", "to": f"layers/{{l}}/mlp/shared_{ours}",
                 **linear}
            )  # fmt: skip
        out.append(
            {"from": shared + r"_gate\.weight", "to": "layers/{l}/mlp/shared_scale",
             "reshape": ["embed_dim"]}
        )  # fmt: skip
    return llama_hf.rules(d) + out


def gguf_config(h: GGUFHeader, c: dict[str, Any]) -> dict[str, Any]:
    """A `qwen2moe` or `qwen3moe` GGUF file's MoE fields as llama.cpp runs the file: the layers
    without a router (`ffn_gate_inp`) dense, every other one sparse; the top-k weights
    renormalized for Qwen3-MoE (`norm_topk_prob`), not for Qwen2-MoE, whose shared expert's
    width is `expert_shared_feed_forward_length`; Qwen3-MoE's biases as the file has them."""
    qwen3 = h.arch == "qwen3moe"
    if qwen3:
        c["attention_bias"] = "blk.0.attn_q.bias" in h.tensors
    dense = [i for i in range(c["num_hidden_layers"]) if f"blk.{i}.ffn_gate_inp.weight"
             not in h.tensors]  # fmt: skip
    c.update(norm_topk_prob=qwen3, decoder_sparse_step=1, mlp_only_layers=dense)
    if not qwen3:
        c["shared_expert_intermediate_size"] = h.key("expert_shared_feed_forward_length", 0)
    return c


FAMILY = Family(
    name="mixture",
    config=LlamaConfig,
    module=MixtureLlama,
    hf_sizes={
        **dict.fromkeys(
            ("num_experts", "num_local_experts", "num_experts_per_tok"), ("moe_experts", 0)
        ),
        "moe_intermediate_size": ("moe_mlp_dim", 1),
        "shared_expert_intermediate_size": ("moe_shared_mlp_dim", 0),
        "decoder_sparse_step": ("max_positions", 1),
    },
    hf_readers={t: read_config for t in MODEL_TYPES},
    hf_rules=rules,
    hf_prefixes=llama_hf.PREFIXES,
    gguf={
        "qwen2moe": GGUFArchitecture("qwen2_moe", gguf_names.llama_rules, gguf_config),
        "qwen3moe": GGUFArchitecture("qwen3_moe", gguf_names.llama_rules, gguf_config),
    },
    layers=layer_kinds,
    limits=LIMITS,
)
