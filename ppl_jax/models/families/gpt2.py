"""GPT-2 (Hugging Face `gpt2`; Radford et al. 2019): the decoder in Flax NNX and its family.

The decoder (`GPT2`, `GPT2Config`): the LayerNorm decoder that GPT-NeoX configures too
(`ppl_jax.models.decoders.layernorm.LayerNormDecoder`), with learned absolute positions,
pre-LayerNorm blocks, multi-head causal attention, a GELU MLP, and (as published) the output tied
to the token embedding. Positions index the learned position table, so they must lie in
`[0, max_positions)` (the scorer's windows start at 0). The fused
`c_attn` projection of Hugging Face's `GPT2Attention` is held as separate q, k and v weights of
shape `[embed, heads, head_dim]`, split on loading by the mapping rules below. The attention
scale and activation follow Hugging Face `modeling_gpt2` (`scale_attn_weights`,
`scale_attn_by_inverse_layer_idx`, `activation_function`).

The family (`FAMILY`): its `config.json` (transformers' defaults) and its weights as transformers
5.23's `modeling_gpt2` stores them: `Conv1D` weights `[in, out]`, the fused `c_attn`
(`[embed, 3 * embed]`: q, then k, then v) split into q, k and v of `[embed, heads, head_dim]`,
names with or without the `transformer.` head, and the causal-mask buffers of old checkpoints
(`attn.bias`, `attn.masked_bias`) left unused. From GGUF (llama.cpp's architecture `gpt2`): the
`Conv1D` weights stored transposed (`[out, in]`), `c_attn` fused as `attn_qkv`.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

from ppl_jax.errors import CheckpointError
from ppl_jax.models import gguf_names
from ppl_jax.models.decoders.layernorm import LayerNormDecoder, norm_rules
from ppl_jax.models.family import Family
from ppl_jax.models.gguf_names import GGUFArchitecture, GGUFHeader
from ppl_jax.models.layers.core import ACTIVATIONS


@dataclasses.dataclass(frozen=True)
class GPT2Config:
    """Architecture of a GPT-2 decoder (stored as JSON beside each checkpoint).

    Attributes:
      vocab_size, embed_dim (`n_embd`), num_layers (`n_layer`), num_heads (`n_head`),
      mlp_dim (`n_inner`, default 4 * embed_dim), max_positions (`n_positions`).
      norm_eps: LayerNorm epsilon (`layer_norm_epsilon`).
      activation: a key of `ACTIVATIONS` (`activation_function`).
      scale_attn_weights: divide attention scores by sqrt(head_dim).
      scale_attn_by_inverse_layer_idx: also divide them by (layer index + 1).
      tie_embeddings: the output matrix is the token embedding (otherwise a separate `lm_head`).
    """

    vocab_size: int
    embed_dim: int
    num_layers: int
    num_heads: int
    mlp_dim: int
    max_positions: int
    norm_eps: float = 1e-5
    activation: str = "gelu_new"
    scale_attn_weights: bool = True
    scale_attn_by_inverse_layer_idx: bool = False
    tie_embeddings: bool = True

    FAMILY: ClassVar[str] = "gpt2"
    # How it configures `LayerNormDecoder` (`ppl_jax.models.decoders.layernorm`): learned
    # positions, the sequential residual, biases everywhere, the MLP's weights under `mlp/`.
    learned_positions = True
    parallel_residual = False
    bias = True
    mlp_apart = True

    def __post_init__(self):
        if self.activation not in ACTIVATIONS:
            raise CheckpointError(
                f"GPT-2 activation {self.activation!r} is not supported (supported: "
                f"{', '.join(ACTIVATIONS)})."
            )
        if self.embed_dim % self.num_heads:
            raise CheckpointError(
                f"GPT-2 embed_dim={self.embed_dim} is not a multiple of num_heads={self.num_heads}."
            )

    @property
    def head_dim(self) -> int:
        return self.embed_dim // self.num_heads

    def attention_scale(self, layer: int) -> float:
        """The logits' scale of layer `layer` (`scale_attn_weights`,
        `scale_attn_by_inverse_layer_idx`, as `modeling_gpt2`)."""
        return (self.head_dim**-0.5 if self.scale_attn_weights else 1.0) / (
            layer + 1 if self.scale_attn_by_inverse_layer_idx else 1
        )

    def to_dict(self) -> dict[str, Any]:
        return {"family": "gpt2", **dataclasses.asdict(self)}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> GPT2Config:
        fields = {f.name for f in dataclasses.fields(GPT2Config)}
        unknown = set(d) - fields - {"family"}
        if d.get("family") != "gpt2" or unknown:
            raise CheckpointError(
                f"the stored architecture {d!r} is not a GPT-2 description "
                f"(unknown keys: {sorted(unknown)})."
            )
        return GPT2Config(**{k: v for k, v in d.items() if k in fields})


class GPT2(LayerNormDecoder):
    """The decoder: `LayerNormDecoder` as `GPT2Config` configures it. `__call__` gives final
    hidden states; `unembedding()` the output matrix."""


_LAYER = r"h\.(?P<l>\d+)\."


def read_config(c: dict[str, Any]) -> GPT2Config:
    """The architecture of a `gpt2` `config.json`.

    Raises:
      CheckpointError: an unsupported activation. KeyError: a required field is missing.
    """
    d = int(c["n_embd"])
    return GPT2Config(
        vocab_size=int(c["vocab_size"]),
        embed_dim=d,
        num_layers=int(c["n_layer"]),
        num_heads=int(c["n_head"]),
        mlp_dim=int(c.get("n_inner") or 4 * d),
        max_positions=int(c.get("n_positions") or c["n_ctx"]),
        norm_eps=float(c.get("layer_norm_epsilon", 1e-5)),
        activation=c.get("activation_function", "gelu_new"),
        scale_attn_weights=bool(c.get("scale_attn_weights", True)),
        scale_attn_by_inverse_layer_idx=bool(c.get("scale_attn_by_inverse_layer_idx", False)),
        tie_embeddings=bool(c.get("tie_word_embeddings", True)),
    )


def rules(d: dict[str, Any]) -> list[dict[str, Any]]:
    """The mapping rules of a GPT-2 description's weights (names without `transformer.`)."""
    qkv = [f"layers/{{l}}/attn/{p}" for p in "qkv"]
    out = [
        {"from": r"wte\.weight", "to": "embedding"},
        {"from": r"wpe\.weight", "to": "position_embedding"},
        {"from": r"ln_f\.weight", "to": "final_norm"},
        {"from": r"ln_f\.bias", "to": "final_norm_bias"},
        {"from": r"lm_head\.weight", "to": None} if d["tie_embeddings"] else
        {"from": r"lm_head\.weight", "to": "lm_head", "transpose": [1, 0]},
        {"from": _LAYER + r"attn\.(?:masked_)?bias", "to": None},  # causal-mask buffers
        {"from": _LAYER + r"attn\.c_attn\.weight", "to": qkv, "split": {"axis": 1},
         "reshape": ["embed_dim", "num_heads", -1]},
        {"from": _LAYER + r"attn\.c_attn\.bias", "to": [n + "_bias" for n in qkv],
         "split": {"axis": 0}, "reshape": ["num_heads", -1]},
        {"from": _LAYER + r"attn\.c_proj\.weight", "to": "layers/{l}/attn/o",
         "reshape": ["num_heads", -1, "embed_dim"]},
        {"from": _LAYER + r"attn\.c_proj\.bias", "to": "layers/{l}/attn/o_bias"},
        {"from": _LAYER + r"mlp\.c_fc\.weight", "to": "layers/{l}/mlp/fc"},
        {"from": _LAYER + r"mlp\.c_fc\.bias", "to": "layers/{l}/mlp/fc_bias"},
        {"from": _LAYER + r"mlp\.c_proj\.weight", "to": "layers/{l}/mlp/proj"},
        {"from": _LAYER + r"mlp\.c_proj\.bias", "to": "layers/{l}/mlp/proj_bias"},
    ]  # fmt: skip
    return out + norm_rules(_LAYER, (("ln_1", "attn_norm"), ("ln_2", "mlp_norm")))


def gguf_config(h: GGUFHeader, c: dict[str, Any]) -> dict[str, Any]:
    """A `gpt2` GGUF file's `config.json`, in GPT-2's own names (`n_embd`, ...), from the sizes
    every architecture shares (`c`) and its MLP width and LayerNorm epsilon."""
    return {
        "model_type": c["model_type"], "vocab_size": c["vocab_size"], "n_embd": c["hidden_size"],
        "n_layer": c["num_hidden_layers"], "n_head": c["num_attention_heads"],
        "n_positions": c["max_position_embeddings"],
        "n_inner": h.key("feed_forward_length", None),
        "layer_norm_epsilon": h.key("attention.layer_norm_epsilon", 1e-5),
        "tie_word_embeddings": c["tie_word_embeddings"],
    }  # fmt: skip


def gguf_rules(d: dict[str, Any]) -> list[dict[str, Any]]:
    """The mapping rules of a `gpt2` GGUF file's tensors: llama.cpp's converter stores the
    `Conv1D` weights transposed (`[out, in]`) and keeps the fused `c_attn` (`attn_qkv`: rows q,
    then k, then v)."""
    layer, qkv = gguf_names.LAYER, [f"layers/{{l}}/attn/{p}" for p in "qkv"]
    out = [
        {"from": r"token_embd\.weight", "to": "embedding"},
        {"from": r"position_embd\.weight", "to": "position_embedding"},
        {"from": r"output_norm\.weight", "to": "final_norm"},
        {"from": r"output_norm\.bias", "to": "final_norm_bias"},
        {"from": r"output\.weight", "to": "lm_head", "transpose": [1, 0]},
        {"from": layer + r"attn_qkv\.weight", "to": qkv, "split": {"axis": 0},
         "transpose": [1, 0], "reshape": ["embed_dim", "num_heads", -1]},
        {"from": layer + r"attn_qkv\.bias", "to": [n + "_bias" for n in qkv],
         "split": {"axis": 0}, "reshape": ["num_heads", -1]},
        {"from": layer + r"attn_output\.weight", "to": "layers/{l}/attn/o",
         "transpose": [1, 0], "reshape": ["num_heads", -1, "embed_dim"]},
        {"from": layer + r"attn_output\.bias", "to": "layers/{l}/attn/o_bias"},
        {"from": layer + r"ffn_up\.weight", "to": "layers/{l}/mlp/fc", "transpose": [1, 0]},
        {"from": layer + r"ffn_up\.bias", "to": "layers/{l}/mlp/fc_bias"},
        {"from": layer + r"ffn_down\.weight", "to": "layers/{l}/mlp/proj",
         "transpose": [1, 0]},
        {"from": layer + r"ffn_down\.bias", "to": "layers/{l}/mlp/proj_bias"},
    ]  # fmt: skip
    return out + norm_rules(layer, (("attn_norm", "attn_norm"), ("ffn_norm", "mlp_norm")))


FAMILY = Family(
    name="gpt2",
    config=GPT2Config,
    module=GPT2,
    hf_sizes={
        "n_layer": ("num_layers", 1),
        "n_embd": ("embed_dim", 1),
        "n_inner": ("mlp_dim", 1),
        "n_head": ("num_heads", 1),
        "n_positions": ("max_positions", 1),
    },
    hf_readers={"gpt2": read_config},
    hf_rules=rules,
    hf_prefixes=("transformer.",),
    gguf={"gpt2": GGUFArchitecture("gpt2", gguf_rules, gguf_config, llama_like=False)},
)
