"""GPT-2 (Hugging Face `gpt2`; Radford et al. 2019): the decoder in Flax NNX and its family.

The decoder (`GPT2`, `GPT2Config`): learned absolute positions, pre-LayerNorm blocks, multi-head
causal attention, a GELU MLP, and (as published) the output tied to the token embedding. The
interface is that of `ppl_jax.models.decoders.llama.Llama`: `__call__(tokens, positions,
segment_ids)` gives the hidden states after the final LayerNorm, `unembedding()` the
`[embed, vocab]` output matrix. Attention is causal within a segment; segment 0 is padding.
Positions index the learned position table, so they must lie in `[0, max_positions)` (the
scorer's windows start at 0). Every parameter names its dims in `logical_axes` metadata with the
names of `ppl_jax.config.defaults.DEFAULT_RULES` (`vocab`, `embed`, `heads`, `head_dim`, `mlp`),
plus `positions` for the position table, which the rules do not map (replicated). The fused
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

import jax
import jax.numpy as jnp
from flax import nnx

from ppl_jax.errors import CheckpointError
from ppl_jax.models import gguf_names
from ppl_jax.models.decoders.stack import run_layers
from ppl_jax.models.family import Family
from ppl_jax.models.gguf_names import GGUFArchitecture, GGUFHeader
from ppl_jax.models.layers.attention import attend
from ppl_jax.models.layers.context import per_token
from ppl_jax.models.layers.core import (
    ACTIVATIONS,
    layer_norm,
    normal_param,
    ones_param,
    zeros_param,
)


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


class Attention(nnx.Module):
    def __init__(
        self, cfg: GPT2Config, layer: int, rngs: nnx.Rngs, dtype: jnp.dtype, attention: str = "xla"
    ):
        d, h, hd = cfg.embed_dim, cfg.num_heads, cfg.head_dim
        self.attention = attention
        self.scale = (hd**-0.5 if cfg.scale_attn_weights else 1.0) / (
            layer + 1 if cfg.scale_attn_by_inverse_layer_idx else 1
        )
        axes = ("embed", "heads", "head_dim")
        self.q = normal_param(rngs, (d, h, hd), axes, d**-0.5, dtype)
        self.k = normal_param(rngs, (d, h, hd), axes, d**-0.5, dtype)
        self.v = normal_param(rngs, (d, h, hd), axes, d**-0.5, dtype)
        self.q_bias = zeros_param((h, hd), ("heads", "head_dim"), dtype)
        self.k_bias = zeros_param((h, hd), ("heads", "head_dim"), dtype)
        self.v_bias = zeros_param((h, hd), ("heads", "head_dim"), dtype)
        self.o = normal_param(rngs, (h, hd, d), ("heads", "head_dim", "embed"), d**-0.5, dtype)
        self.o_bias = zeros_param((d,), ("embed",), dtype)

    def __call__(self, x: jax.Array, positions: jax.Array, segment_ids: jax.Array) -> jax.Array:
        q = jnp.einsum("btd,dhk->bthk", x, self.q[...]) + self.q_bias[...]
        k = jnp.einsum("btd,dhk->bthk", x, self.k[...]) + self.k_bias[...]
        v = jnp.einsum("btd,dhk->bthk", x, self.v[...]) + self.v_bias[...]
        out = attend(
            q,
            k,
            v,
            segment_ids=segment_ids,
            positions=positions,
            scale=self.scale,
            implementation=self.attention,
        )
        return jnp.einsum("bthk,hkd->btd", out, self.o[...]) + self.o_bias[...]


class MLP(nnx.Module):
    def __init__(self, cfg: GPT2Config, rngs: nnx.Rngs, dtype: jnp.dtype):
        d, f = cfg.embed_dim, cfg.mlp_dim
        self.activation = cfg.activation
        self.fc = normal_param(rngs, (d, f), ("embed", "mlp"), d**-0.5, dtype)
        self.fc_bias = zeros_param((f,), ("mlp",), dtype)
        self.proj = normal_param(rngs, (f, d), ("mlp", "embed"), f**-0.5, dtype)
        self.proj_bias = zeros_param((d,), ("embed",), dtype)

    def __call__(self, x: jax.Array) -> jax.Array:
        h = ACTIVATIONS[self.activation](x @ self.fc[...] + self.fc_bias[...])
        return h @ self.proj[...] + self.proj_bias[...]


class Block(nnx.Module):
    def __init__(
        self, cfg: GPT2Config, layer: int, rngs: nnx.Rngs, dtype: jnp.dtype, attention: str = "xla"
    ):
        d = cfg.embed_dim
        self.eps = cfg.norm_eps
        self.attn_norm = ones_param((d,), ("embed",), dtype)
        self.attn_norm_bias = zeros_param((d,), ("embed",), dtype)
        self.attn = Attention(cfg, layer, rngs, dtype, attention)
        self.mlp_norm = ones_param((d,), ("embed",), dtype)
        self.mlp_norm_bias = zeros_param((d,), ("embed",), dtype)
        self.mlp = MLP(cfg, rngs, dtype)

    def __call__(self, x: jax.Array, positions: jax.Array, segment_ids: jax.Array) -> jax.Array:
        h = layer_norm(x, self.attn_norm[...], self.attn_norm_bias[...], self.eps)
        x = x + self.attn(h, positions, segment_ids)
        # Per token, in chunks of `model.token_chunk` tokens where set (long windows).
        return x + per_token(self._mlp_sublayer, x)

    def _mlp_sublayer(self, x: jax.Array) -> jax.Array:
        return self.mlp(layer_norm(x, self.mlp_norm[...], self.mlp_norm_bias[...], self.eps))


class GPT2(nnx.Module):
    """The decoder. `__call__` gives final hidden states; `unembedding()` the output matrix."""

    def __init__(
        self,
        cfg: GPT2Config,
        rngs: nnx.Rngs,
        dtype: jnp.dtype = jnp.float32,
        attention: str = "xla",
    ):
        d = cfg.embed_dim
        self.cfg = cfg
        self.embedding = normal_param(rngs, (cfg.vocab_size, d), ("vocab", "embed"), 0.02, dtype)
        self.position_embedding = normal_param(
            rngs, (cfg.max_positions, d), ("positions", "embed"), 0.01, dtype
        )
        self.layers = nnx.List(
            [Block(cfg, i, rngs, dtype, attention) for i in range(cfg.num_layers)]
        )
        self.final_norm = ones_param((d,), ("embed",), dtype)
        self.final_norm_bias = zeros_param((d,), ("embed",), dtype)
        if not cfg.tie_embeddings:
            self.lm_head = normal_param(
                rngs, (d, cfg.vocab_size), ("embed", "vocab"), d**-0.5, dtype
            )

    def __call__(
        self, tokens: jax.Array, positions: jax.Array, segment_ids: jax.Array
    ) -> jax.Array:
        """Final hidden states.

        Args:
          tokens, positions, segment_ids: `[batch, seq] int32`; positions in
            `[0, max_positions)`.

        Returns:
          `[batch, seq, embed_dim]` in the parameter dtype, after the final LayerNorm.
        """
        x = jnp.take(self.embedding[...], tokens, axis=0)
        x = x + jnp.take(self.position_embedding[...], positions, axis=0)
        x = run_layers(self.layers, x, positions, segment_ids)
        return layer_norm(x, self.final_norm[...], self.final_norm_bias[...], self.cfg.norm_eps)

    def unembedding(self) -> jax.Array:
        """`[embed_dim, vocab_size]`: the tied embedding transposed, or the separate head."""
        if self.cfg.tie_embeddings:
            return self.embedding[...].T
        return self.lm_head[...]


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
    for ours, theirs in (("attn_norm", "ln_1"), ("mlp_norm", "ln_2")):
        out.append({"from": _LAYER + theirs + r"\.weight", "to": "layers/{l}/" + ours})
        out.append({"from": _LAYER + theirs + r"\.bias", "to": "layers/{l}/" + ours + "_bias"})
    return out


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
    for theirs, ours in (("attn_norm", "attn_norm"), ("ffn_norm", "mlp_norm")):
        out.append({"from": layer + theirs + r"\.weight", "to": "layers/{l}/" + ours})
        out.append({"from": layer + theirs + r"\.bias", "to": "layers/{l}/" + ours + "_bias"})
    return out


FAMILY = Family(
    name="gpt2",
    config=GPT2Config,
    module=GPT2,
    hf_readers={"gpt2": read_config},
    hf_rules=rules,
    hf_prefixes=("transformer.",),
    gguf={"gpt2": GGUFArchitecture("gpt2", gguf_rules, gguf_config, llama_like=False)},
)
