"""GPT-NeoX and Pythia (Hugging Face `gpt_neox`; Black et al. 2022, Biderman et al. 2023): the
decoder in Flax NNX and its family.

The decoder (`GPTNeoX`, `GPTNeoXConfig`): the LayerNorm decoder that GPT-2 configures too
(`ppl_jax.models.decoders.layernorm.LayerNormDecoder`), with LayerNorm with bias, a parallel
residual `x + attn(ln1(x)) + mlp(ln2(x))` (or the sequential one with `use_parallel_residual:
false`),
rotary embeddings on the first `rotary_pct` of each head's dims (rotate-half within them), biases
on every projection (`attention_bias`), a plain (ungated) MLP with exact GELU, and an untied
output `embed_out`. The vocabulary of the weights is padded past the tokenizer's (Pythia: 50304
rows for 50277 ids); every row is scored, as transformers does. The interface is that of
`ppl_jax.models.decoders.llama.Llama`. The fused `query_key_value` projection, laid out per head
(`[heads, 3, head_dim]` rows: h0's q, k, v, then h1's, ...), is held as separate q, k, v weights
`[embed, heads, head_dim]`, split on reading by the mapping rules below. As transformers 5.23's
`modeling_gpt_neox`.

The family (`FAMILY`): its `config.json` (transformers' defaults: `rotary_pct` 0.25,
`rotary_emb_base` 10000, parallel residual, biases, exact GELU) and its weights as transformers
5.23's `modeling_gpt_neox` stores them: the fused `query_key_value` split into q, k and v, names
with or without the `gpt_neox.` head, the untied output `embed_out`, and the mask and rotary
buffers of old checkpoints left unused.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

from ppl_jax.errors import CheckpointError
from ppl_jax.models.decoders.layernorm import LayerNormDecoder, norm_rules
from ppl_jax.models.family import Family
from ppl_jax.models.layers import rope as rope_lib
from ppl_jax.models.layers.core import ACTIVATIONS


@dataclasses.dataclass(frozen=True)
class GPTNeoXConfig:
    """Architecture of a GPT-NeoX decoder (stored as JSON beside each checkpoint).

    Attributes:
      rope_theta: `rotary_emb_base` / `rope_parameters.rope_theta`.
      rotary_dim: rotated dims per head, `int(head_dim * rotary_pct)`.
      parallel_residual: `use_parallel_residual`.
      bias: biases on q, k, v and the output projection (`attention_bias`).
      activation: a key of `ppl_jax.models.layers.core.ACTIVATIONS` (`hidden_act`, exact `gelu`).
    """

    vocab_size: int
    embed_dim: int
    num_layers: int
    num_heads: int
    mlp_dim: int
    max_positions: int
    rotary_dim: int
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    parallel_residual: bool = True
    bias: bool = True
    activation: str = "gelu"
    tie_embeddings: bool = False
    rope_angles: str = "float32"  # `ppl_jax.models.layers.rope.ANGLES`

    FAMILY: ClassVar[str] = "gpt_neox"
    # How it configures `LayerNormDecoder` (`ppl_jax.models.decoders.layernorm`): rotary
    # positions, the MLP's weights on the block (`parallel_residual` and `bias` are fields).
    learned_positions = False
    mlp_apart = False
    # The rotary fields `ppl_jax.models.layers.rope` reads, fixed for this family.
    rope_type = "default"
    rope_attention_factor = 1.0

    def __post_init__(self):
        if self.activation not in ACTIVATIONS:
            raise CheckpointError(
                f"GPT-NeoX hidden_act {str(self.activation)[:40]!r} is not supported "
                f"(supported: {', '.join(ACTIVATIONS)})."
            )
        if self.rope_angles not in rope_lib.ANGLES:
            raise CheckpointError(
                f"rope_angles {str(self.rope_angles)[:40]!r} is not supported (supported: "
                f"{', '.join(rope_lib.ANGLES)})."
            )
        if self.embed_dim % self.num_heads or self.rotary_dim % 2:
            raise CheckpointError(
                f"GPT-NeoX hidden_size={self.embed_dim} is not a multiple of "
                f"num_attention_heads={self.num_heads}, or the rotary dims are odd."
            )

    @property
    def head_dim(self) -> int:
        return self.embed_dim // self.num_heads

    def attention_scale(self, layer: int) -> None:
        """None: `attend`'s own `head_dim ** -0.5` in every layer."""
        return None

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        if d["rope_angles"] == "float32":  # the default: descriptions as before
            del d["rope_angles"]
        return {"family": "gpt_neox", "head_dim": self.head_dim, **d}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> GPTNeoXConfig:
        fields = {f.name for f in dataclasses.fields(GPTNeoXConfig)}
        unknown = set(d) - fields - {"family", "head_dim"}
        if d.get("family") != "gpt_neox" or unknown:
            raise CheckpointError(
                f"the stored architecture is not a GPT-NeoX description "
                f"(unknown keys: {sorted(unknown)[:5]})."
            )
        return GPTNeoXConfig(**{k: v for k, v in d.items() if k in fields})


class GPTNeoX(LayerNormDecoder):
    """The decoder: `LayerNormDecoder` as `GPTNeoXConfig` configures it. `__call__` gives final
    hidden states; `unembedding()` the output matrix (`embed_out`, or the tied embedding)."""


_LAYER = r"layers\.(?P<l>\d+)\."


def read_config(c: dict[str, Any]) -> GPTNeoXConfig:
    """The architecture of a Hugging Face `gpt_neox` `config.json` (transformers' defaults:
    `rotary_pct` 0.25, `rotary_emb_base` 10000, parallel residual, biases, exact GELU).

    Raises:
      CheckpointError: an unsupported activation or rope scaling. KeyError: a required
        field is missing.
    """
    d, heads = int(c["hidden_size"]), int(c["num_attention_heads"])
    rope = {**(c.get("rope_scaling") or {}), **(c.get("rope_parameters") or {})}
    kind = rope.get("rope_type", rope.get("type")) or "default"
    if kind != "default":
        raise CheckpointError(
            f"GPT-NeoX rope_type {str(kind)[:40]!r} is not supported (only default)."
        )
    partial = float(rope.get("partial_rotary_factor", c.get("rotary_pct", 0.25)))
    return GPTNeoXConfig(
        vocab_size=int(c["vocab_size"]),
        embed_dim=d,
        num_layers=int(c["num_hidden_layers"]),
        num_heads=heads,
        mlp_dim=int(c["intermediate_size"]),
        max_positions=int(c["max_position_embeddings"]),
        rotary_dim=int(d // heads * partial),
        rope_theta=float(rope.get("rope_theta", c.get("rotary_emb_base", 10000.0))),
        norm_eps=float(c.get("layer_norm_eps", 1e-5)),
        parallel_residual=bool(c.get("use_parallel_residual", True)),
        bias=bool(c.get("attention_bias", True)),
        activation=c.get("hidden_act") or "gelu",
        tie_embeddings=bool(c.get("tie_word_embeddings", False)),
    )


def rules(d: dict[str, Any]) -> list[dict[str, Any]]:
    """The mapping rules of a GPT-NeoX description's weights (names without `gpt_neox.`)."""
    qkv = [f"layers/{{l}}/attn/{p}" for p in "qkv"]
    rows = ["num_heads", 3, "head_dim"]
    split = {"axis": 1, "squeeze": True}
    linear = {"transpose": [1, 0]}
    out = [
        {"from": r"embed_in\.weight", "to": "embedding"},
        {"from": r"final_layer_norm\.weight", "to": "final_norm"},
        {"from": r"final_layer_norm\.bias", "to": "final_norm_bias"},
        {"from": r"embed_out\.weight", "to": None} if d["tie_embeddings"] else
        {"from": r"embed_out\.weight", "to": "lm_head", **linear},
        {"from": _LAYER + r"attention\.(?:masked_bias|bias|rotary_emb\.inv_freq)", "to": None},
        {"from": _LAYER + r"attention\.query_key_value\.weight", "to": qkv,
         "view": [*rows, "embed_dim"], "split": split, "transpose": [2, 0, 1]},
        {"from": _LAYER + r"attention\.dense\.weight", "to": "layers/{l}/attn/o", **linear,
         "reshape": ["num_heads", "head_dim", "embed_dim"]},
        {"from": _LAYER + r"mlp\.dense_h_to_4h\.weight", "to": "layers/{l}/fc", **linear},
        {"from": _LAYER + r"mlp\.dense_h_to_4h\.bias", "to": "layers/{l}/fc_bias"},
        {"from": _LAYER + r"mlp\.dense_4h_to_h\.weight", "to": "layers/{l}/proj", **linear},
        {"from": _LAYER + r"mlp\.dense_4h_to_h\.bias", "to": "layers/{l}/proj_bias"},
    ]  # fmt: skip
    if d["bias"]:
        out.append({"from": _LAYER + r"attention\.query_key_value\.bias",
                    "to": [n + "_bias" for n in qkv], "view": rows, "split": split})  # fmt: skip
        out.append({"from": _LAYER + r"attention\.dense\.bias", "to": "layers/{l}/attn/o_bias"})
    names = (("input_layernorm", "attn_norm"), ("post_attention_layernorm", "mlp_norm"))
    return out + norm_rules(_LAYER, names)


FAMILY = Family(
    name="gpt_neox",
    config=GPTNeoXConfig,
    module=GPTNeoX,
    hf_readers={"gpt_neox": read_config},
    hf_rules=rules,
    hf_prefixes=("gpt_neox.",),
)
