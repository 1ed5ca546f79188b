"""The softmax-attention and MLP blocks of the hybrid families (Qwen3.5 and Qwen3-Next,
Nemotron-H, Falcon-H1, and Mamba2's norms), whose recurrent layers are in
`ppl_jax.models.layers.gated_delta` and `ppl_jax.models.layers.ssd`, and the Hugging Face mapping
rules of these blocks.

- `Attention`: grouped-query attention through `ppl_jax.models.layers.attention.attend`, with the
  variants these families use: Qwen3.5's and Qwen3-Next's output gate (`q_proj` packs each
  head's query and gate; the output is `attn * sigmoid(gate)`) and per-head QK-norm `x̂·(1+w)`,
  partial rotary embeddings (`ppl_jax.models.layers.rope`), Nemotron-H's attention without any
  position embedding, Falcon-H1's `key_multiplier` on the keys.
- `MLP`: the gated MLP `down(act(gate(x) * g) * up(x)) * d` (SwiGLU; Falcon-H1's
  `mlp_multipliers` g and d) or the plain `down(act(up(x)))` (Nemotron-H's squared ReLU).
- `config_to_dict` and `config_from_dict`: the families' flat config dataclasses as JSON-able
  descriptions (tuples as lists, the `rope` pairs as a dict).
"""

from __future__ import annotations

import dataclasses
from typing import Any, TypeVar

import jax
import jax.numpy as jnp
from flax import nnx

from ppl_jax.errors import CheckpointError
from ppl_jax.models.decoders.llama import LlamaConfig
from ppl_jax.models.layers import rope as rope_lib
from ppl_jax.models.layers.attention import attend
from ppl_jax.models.layers.core import normal_param, ones_param, rms_norm, zeros_param

_Spec = TypeVar("_Spec")

ACTIVATIONS = {"silu": jax.nn.silu, "relu2": lambda x: jnp.square(jax.nn.relu(x))}


@dataclasses.dataclass(frozen=True)
class AttentionSpec:
    """One attention layer of a hybrid family.

    Attributes:
      embed_dim, num_heads, num_kv_heads, head_dim: the shapes (`num_heads` a multiple of
        `num_kv_heads`).
      rope: the `rope_*` fields of `ppl_jax.models.decoders.llama.LlamaConfig` as sorted
        `(name, value)` pairs (`rope_type`, `rope_theta`, `rotary_dim`, ...), or `()` for no
        position embedding (Nemotron-H).
      max_positions: `max_position_embeddings` (the rope scalings that need it).
      output_gate: `q_proj` gives each head's query and gate (Qwen3.5, Qwen3-Next).
      qk_norm: per-head RMSNorm `x̂·(1+w)` of q and k before the rotation (Qwen3.5).
      norm_eps: the QK-norm's epsilon.
      key_scale: the keys' factor (Falcon-H1's `key_multiplier`).
      bias: biases on the q, k, v and output projections (`attention_bias`).
    """

    embed_dim: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rope: tuple[tuple[str, Any], ...] = ()
    max_positions: int = 4096
    output_gate: bool = False
    qk_norm: bool = False
    norm_eps: float = 1e-6
    key_scale: float = 1.0
    bias: bool = False

    def __post_init__(self):
        if self.num_heads % self.num_kv_heads:
            raise CheckpointError(
                f"num_attention_heads={self.num_heads} is not a multiple of "
                f"num_key_value_heads={self.num_kv_heads}."
            )

    def rope_config(self) -> LlamaConfig | None:
        """The config `ppl_jax.models.layers.rope.rotary` reads, or None without rotary
        embeddings."""
        if not self.rope:
            return None
        return LlamaConfig(
            vocab_size=1,
            embed_dim=self.embed_dim,
            num_layers=1,
            num_heads=self.num_heads,
            num_kv_heads=self.num_kv_heads,
            head_dim=self.head_dim,
            mlp_dim=1,
            max_positions=self.max_positions,
            **dict(self.rope),
        )


class Attention(nnx.Module):
    """Params: `q [embed, H, Dh]`, `k`, `v [embed, KV, Dh]`, `o [H, Dh, embed]`; with
    `output_gate` `gate [embed, H, Dh]`; with `qk_norm` `q_norm`, `k_norm [Dh]` (stored as w of
    `x̂·(1+w)`); with `bias` `q_bias`, `k_bias`, `v_bias`, `o_bias`."""

    def __init__(
        self, spec: AttentionSpec, rngs: nnx.Rngs, dtype: jnp.dtype, implementation: str = "xla"
    ):
        d, h, kv, hd = spec.embed_dim, spec.num_heads, spec.num_kv_heads, spec.head_dim
        self.spec = spec
        self.implementation = implementation
        self.rope_cfg = spec.rope_config()
        heads, kv_heads = ("embed", "heads", "head_dim"), ("embed", "kv_heads", "head_dim")
        self.q = normal_param(rngs, (d, h, hd), heads, d**-0.5, dtype)
        self.k = normal_param(rngs, (d, kv, hd), kv_heads, d**-0.5, dtype)
        self.v = normal_param(rngs, (d, kv, hd), kv_heads, d**-0.5, dtype)
        self.o = normal_param(
            rngs, (h, hd, d), ("heads", "head_dim", "embed"), (h * hd) ** -0.5, dtype
        )
        if spec.output_gate:
            self.gate = normal_param(rngs, (d, h, hd), heads, d**-0.5, dtype)
        if spec.qk_norm:
            self.q_norm = zeros_param((hd,), ("head_dim",), dtype)
            self.k_norm = zeros_param((hd,), ("head_dim",), dtype)
        if spec.bias:
            self.q_bias = zeros_param((h, hd), heads[1:], dtype)
            self.k_bias = zeros_param((kv, hd), kv_heads[1:], dtype)
            self.v_bias = zeros_param((kv, hd), kv_heads[1:], dtype)
            self.o_bias = zeros_param((d,), ("embed",), dtype)

    def _project(self, x: jax.Array, name: str) -> jax.Array:
        out = jnp.einsum("btd,dhk->bthk", x, getattr(self, name)[...])
        return out + getattr(self, f"{name}_bias")[...] if self.spec.bias else out

    def __call__(self, x: jax.Array, positions: jax.Array, segment_ids: jax.Array) -> jax.Array:
        """`x [B, T, embed]` -> `[B, T, embed]` in `x.dtype`."""
        spec = self.spec
        q, k, v = self._project(x, "q"), self._project(x, "k"), self._project(x, "v")
        if spec.qk_norm:  # after the projection, before the rotation (Qwen3.5)
            q = rms_norm(q, self.q_norm[...], spec.norm_eps, 1.0)
            k = rms_norm(k, self.k_norm[...], spec.norm_eps, 1.0)
        if spec.key_scale != 1.0:
            k = k * jnp.asarray(spec.key_scale, k.dtype)
        if self.rope_cfg is not None:
            q = rope_lib.rotary(q, positions, segment_ids, self.rope_cfg)
            k = rope_lib.rotary(k, positions, segment_ids, self.rope_cfg)
        out = attend(
            q,
            k,
            v,
            segment_ids=segment_ids,
            positions=positions,
            implementation=self.implementation,
        )
        if spec.output_gate:
            gate = jnp.einsum("btd,dhk->bthk", x, self.gate[...])
            out = out * jax.nn.sigmoid(gate.astype(jnp.float32)).astype(out.dtype)
        out = jnp.einsum("bthk,hkd->btd", out, self.o[...])
        return out + self.o_bias[...] if spec.bias else out


@dataclasses.dataclass(frozen=True)
class MLPSpec:
    """A dense MLP: `gated` `down(act(gate(x) * gate_scale) * up(x)) * down_scale`, else
    `down(act(up(x)))`; `activation` a key of `ACTIVATIONS`; `bias` on every projection."""

    embed_dim: int
    mlp_dim: int
    activation: str = "silu"
    gated: bool = True
    bias: bool = False
    gate_scale: float = 1.0
    down_scale: float = 1.0

    def __post_init__(self):
        if self.activation not in ACTIVATIONS:
            raise CheckpointError(
                f"the MLP activation {self.activation!r} is not supported (supported: "
                f"{', '.join(ACTIVATIONS)})."
            )


class MLP(nnx.Module):
    """Params: `up [embed, mlp]`, `down [mlp, embed]`, with `gated` `gate [embed, mlp]`; with
    `bias` `up_bias`, `down_bias` (and `gate_bias`)."""

    def __init__(self, spec: MLPSpec, rngs: nnx.Rngs, dtype: jnp.dtype):
        d, f = spec.embed_dim, spec.mlp_dim
        self.spec = spec
        names = ("gate", "up") if spec.gated else ("up",)
        for name in names:
            setattr(self, name, normal_param(rngs, (d, f), ("embed", "mlp"), d**-0.5, dtype))
            if spec.bias:
                setattr(self, f"{name}_bias", zeros_param((f,), ("mlp",), dtype))
        self.down = normal_param(rngs, (f, d), ("mlp", "embed"), f**-0.5, dtype)
        if spec.bias:
            self.down_bias = zeros_param((d,), ("embed",), dtype)

    def _linear(self, x: jax.Array, name: str) -> jax.Array:
        out = x @ getattr(self, name)[...]
        return out + getattr(self, f"{name}_bias")[...] if self.spec.bias else out

    def __call__(self, x: jax.Array) -> jax.Array:
        spec = self.spec
        act = ACTIVATIONS[spec.activation]
        h = self._linear(x, "up")
        if spec.gated:
            gate = self._linear(x, "gate")
            if spec.gate_scale != 1.0:
                gate = gate * jnp.asarray(spec.gate_scale, gate.dtype)
            h = act(gate) * h
        else:
            h = act(h)
        out = self._linear(h, "down")
        return out if spec.down_scale == 1.0 else out * jnp.asarray(spec.down_scale, out.dtype)


def norm_param(dim: int, dtype: jnp.dtype, offset: float) -> nnx.Param:
    """An RMSNorm weight `[dim]`: ones for `x̂·w`, zeros for `x̂·(1+w)` (offset 1)."""
    return (zeros_param if offset else ones_param)((dim,), ("embed",), dtype)


class DescribedConfig:
    """The description methods of a family's flat config dataclass (`config_to_dict` and its
    inverse), for the hybrids' configs to inherit rather than repeat."""

    def to_dict(self) -> dict[str, Any]:
        return config_to_dict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Any:
        return config_from_dict(cls, d)


def spec_of(spec_class: type[_Spec], cfg: Any, prefix: str = "", **given: Any) -> _Spec:
    """A layer's spec (`AttentionSpec`, `MLPSpec`, `GatedDeltaSpec`, `MoeSpec`, ...) from a
    family's config: each field of `spec_class` that `cfg` has under its name with `prefix`
    (`prefix="moe_"`: `mlp_dim` from `moe_mlp_dim`), else under the same name (`embed_dim`,
    `num_heads`, ...), then the `given` fields (the config's own names for the rest:
    `bias=cfg.attention_bias`, or values)."""
    found = {}
    for f in dataclasses.fields(spec_class):
        for name in (prefix + f.name, f.name):
            if hasattr(cfg, name):
                found[f.name] = getattr(cfg, name)
                break
    return spec_class(**{**found, **given})


def config_to_dict(cfg: Any) -> dict[str, Any]:
    """A family's flat config dataclass as its JSON-able description: `family` (the class's
    `FAMILY`) and every field, tuples as lists and the `rope` pairs as a dict."""
    out: dict[str, Any] = {"family": cfg.FAMILY}
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        if f.name == "rope":
            value = {k: list(v) if isinstance(v, tuple) else v for k, v in value}
        elif isinstance(value, tuple):
            value = list(value)
        out[f.name] = value
    return out


def config_from_dict(cls: type, d: dict[str, Any]) -> Any:
    """The inverse of `config_to_dict` for the config class `cls`.

    Raises:
      CheckpointError: another family, or keys the class does not have (one sentence naming
        them).
    """
    fields = {f.name for f in dataclasses.fields(cls)}
    unknown = set(d) - fields - {"family"}
    if d.get("family") != cls.FAMILY or unknown:
        raise CheckpointError(
            f"the stored architecture (family {str(d.get('family'))[:40]!r}) is not a "
            f"{cls.FAMILY} description (unknown keys: {sorted(unknown)[:5]})."
        )
    kwargs = {}
    for name, value in d.items():
        if name == "family":
            continue
        if name == "rope":
            value = tuple(
                sorted((k, tuple(v) if isinstance(v, list) else v) for k, v in value.items())
            )
        elif isinstance(value, list):
            value = tuple(value)
        kwargs[name] = value
    return cls(**kwargs)


def norm_then_cast(x: jax.Array, weight: jax.Array, eps: float) -> jax.Array:
    """transformers' `Mamba2RMSNorm`/`FalconH1RMSNorm`: `w * x̂` with x̂ (float32) cast to `x`'s
    dtype first, in the weight's dtype."""
    x32 = x.astype(jnp.float32)
    y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
    return weight * y.astype(x.dtype)


def attention_rules(layer: str, to: str, output_gate: bool = False) -> list[dict[str, Any]]:
    """The mapping rules (`ppl_jax.checkpoints.mapping.language`) of a transformers attention layer
    whose stored names start with the pattern `layer` (capturing `l`), into the `Attention` params
    under `to` (`layers/{l}/attn/`): `nn.Linear`'s `[out, in]` transposed and cut in heads; with
    `output_gate`, `q_proj` `[H, (query, gate), Dh, embed]` (Qwen3.5, Qwen3-Next)."""
    heads, kv = ["num_heads", "head_dim"], ["num_kv_heads", "head_dim"]
    if output_gate:
        q = {"from": layer + r"q_proj\.weight", "to": [to + "q", to + "gate"],
             "view": ["num_heads", 2, "head_dim", "embed_dim"],
             "split": {"axis": 1, "squeeze": True}, "transpose": [2, 0, 1]}  # fmt: skip
    else:
        q = {"from": layer + r"q_proj\.weight", "to": to + "q", "transpose": [1, 0],
             "reshape": ["embed_dim", *heads]}  # fmt: skip
    return [
        q,
        {"from": layer + r"(?P<p>[kv])_proj\.weight", "to": to + "{p}", "transpose": [1, 0],
         "reshape": ["embed_dim", *kv]},
        {"from": layer + r"o_proj\.weight", "to": to + "o", "transpose": [1, 0],
         "reshape": [*heads, "embed_dim"]},
        {"from": layer + r"q_proj\.bias", "to": to + "q_bias", "reshape": heads},
        {"from": layer + r"(?P<p>[kv])_proj\.bias", "to": to + "{p}_bias", "reshape": kv},
        {"from": layer + r"o_proj\.bias", "to": to + "o_bias"},
        {"from": layer + r"(?P<p>[qk])_norm\.weight", "to": to + "{p}_norm"},
    ]  # fmt: skip


def mlp_rules(layer: str, to: str) -> list[dict[str, Any]]:
    """The mapping rules of a transformers MLP (`gate_proj`, `up_proj`, `down_proj`, their
    biases) whose stored names start with the pattern `layer`, into the `MLP` params under `to`."""
    return [
        {"from": layer + r"(?P<p>gate|up|down)_proj\.weight", "to": to + "{p}",
         "transpose": [1, 0]},
        {"from": layer + r"(?P<p>gate|up|down)_proj\.bias", "to": to + "{p}_bias"},
    ]  # fmt: skip


def embedding_rules(d: dict[str, Any], embedding: str, final_norm: str) -> list[dict[str, Any]]:
    """Rules of the stored embedding `embedding`, the final norm `final_norm` (patterns) and
    `lm_head.weight` (unused when the description ties the embeddings)."""
    lm_head = {"from": r"lm_head\.weight", "to": "lm_head", "transpose": [1, 0]}
    if d["tie_embeddings"]:
        lm_head = {"from": r"lm_head\.weight", "to": None}
    return [
        {"from": embedding, "to": "embedding"},
        {"from": final_norm, "to": "final_norm"},
        lm_head,
    ]
