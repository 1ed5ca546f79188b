"""Where each ppl_jax weight lies in a Hugging Face checkpoint: the stored names and layouts of
every family `ppl_jax.checkpoints.hf` reads.

A `Source` names the candidate stored tensors of one ppl_jax weight and how to cut it out of
them: the stored tensor is viewed with each axis split into the dims of `groups`; dims listed in
`fixed` are pinned to one index (GPT-NeoX's per-head fused `query_key_value`, `[heads, 3,
head_dim]` rows); `offset` selects, along the stored axis `offset_axis` (default the last),
where the weight starts in a fused tensor (GPT-2's `c_attn`, Phi-3's `qkv_proj` and
`gate_up_proj`). Names follow transformers 5.23's `modeling_*` files (`nn.Linear` stores
`[out, in]`, GPT-2's `Conv1D` `[in, out]`). Llama-like weights are found with or without the
`model.` head, and under the `model.language_model.` or `language_model.model.` prefix of a
multimodal checkpoint (its text tower).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np

# Stored buffers that are not parameters (causal-mask buffers of old GPT-2 and GPT-NeoX
# checkpoints, rotary tables of old Llama checkpoints).
BUFFER_SUFFIXES = (
    ".attn.bias",
    ".attn.masked_bias",
    ".attention.bias",
    ".attention.masked_bias",
    ".rotary_emb.inv_freq",
)
# Heads of a stored name that a tied output (`lm_head.weight`) may carry, unused when tied.
TIED_HEADS = ("lm_head.weight", "language_model.lm_head.weight", "embed_out.weight")
TEXT_PREFIXES = ("model.", "", "model.language_model.", "language_model.model.")


@dataclasses.dataclass(frozen=True)
class Source:
    """Where a ppl_jax weight comes from in the stored tensors (see the module docstring);
    target axis `i` is free view axis `perm[i]` (the view's axes less the `fixed` ones)."""

    names: tuple[str, ...]  # candidate stored names, first present wins
    shape: tuple[int, ...]
    groups: tuple[tuple[int, ...], ...]
    perm: tuple[int, ...]
    offset: int = 0
    offset_axis: int | None = None
    fixed: tuple[tuple[int, int], ...] = ()
    # Per slice of the target's first axis (a mixture's experts), its own candidate names; the
    # fields above then describe each slice's stored tensor.
    stack: tuple[tuple[str, ...], ...] = ()


def stacked(per_expert: list[Source]) -> Source:
    """The `[experts, ...]` weight whose slice `e` is `per_expert[e]` (transformers' per-expert
    `experts.{e}.*_proj` tensors)."""
    return dataclasses.replace(per_expert[0], stack=tuple(s.names for s in per_expert))


def direct(names, groups, shape=None, offset=0, offset_axis=None, fixed=()) -> Source:
    groups = tuple(tuple(g) for g in groups)
    shape = shape or tuple(math.prod(g) for g in groups)
    ndim = sum(len(g) for g in groups) - len(fixed)
    return Source(
        tuple(names), tuple(shape), groups, tuple(range(ndim)), offset, offset_axis, fixed
    )


def linear(names, out_dims, in_dims, shape=None, offset=0, fixed=()) -> Source:
    """A torch `nn.Linear` weight `[out, in]`, as a ppl_jax `[*in_dims, *out_dims]` weight (an
    `offset` along the out axis for a fused projection)."""
    src = direct(names, (out_dims, in_dims), shape, offset, 0, fixed)
    n_out, n_in = len(out_dims) - len(fixed), len(in_dims)
    perm = tuple(range(n_out, n_out + n_in)) + tuple(range(n_out))
    return dataclasses.replace(src, perm=perm)


def read_block(
    sl: Any, src: Source, index: tuple[slice, ...], shape: tuple[int, ...]
) -> np.ndarray:
    """The target block at `index` (one device's shard), reading the fewest stored rows.

    Each stored axis is read as the contiguous range spanned by the block's first dim in that
    axis's group; the other dims of the group are cut out afterwards (they are whole in every
    layout that the default rules produce, so nothing extra is read there), and the `fixed` ones
    are pinned to their index.
    """
    ranges = [range(*s.indices(n)) for s, n in zip(index, shape, strict=True)]
    fixed = dict(src.fixed)
    free = [a for a in range(sum(len(g) for g in src.groups)) if a not in fixed]
    view: dict[int, range] = {a: range(j, j + 1) for a, j in fixed.items()}
    for i, v in enumerate(src.perm):
        view[free[v]] = ranges[i]
    offset_axis = len(src.groups) - 1 if src.offset_axis is None else src.offset_axis
    stored, post, block_shape, axis = [], [], [], 0
    for g, group in enumerate(src.groups):
        inner = math.prod(group[1:])
        off = src.offset if g == offset_axis else 0
        first = view[axis]
        stored.append(slice(off + first.start * inner, off + first.stop * inner))
        post.append(slice(None))
        block_shape.append(len(first))
        for j in range(1, len(group)):
            post.append(slice(view[axis + j].start, view[axis + j].stop))
            block_shape.append(group[j])
        axis += len(group)
    block = np.asarray(sl[tuple(stored)]).reshape(block_shape)[tuple(post)]
    if fixed:
        block = np.squeeze(block, axis=tuple(fixed))
    return np.transpose(block, src.perm)


def sources(desc: dict[str, Any]) -> dict[str, Source]:
    """ppl_jax weight path (`layers/0/attn/q`) -> its `Source`, for a `read_description`."""
    if desc["family"] == "gpt2":
        return _gpt2(desc)
    if desc["family"] == "gpt_neox":
        return _gpt_neox(desc)
    return _llama(desc)


# Stored norm names per `norm_layout`: ppl_jax name -> Hugging Face module.
_NORMS = {
    "pre": {"attn_norm": "input_layernorm", "mlp_norm": "post_attention_layernorm"},
    "post": {
        "post_attn_norm": "post_attention_layernorm",
        "post_mlp_norm": "post_feedforward_layernorm",
    },
    "sandwich": {
        "attn_norm": "input_layernorm",
        "post_attn_norm": "post_attention_layernorm",
        "mlp_norm": "pre_feedforward_layernorm",
        "post_mlp_norm": "post_feedforward_layernorm",
    },
}


def _llama(c: dict[str, Any]) -> dict[str, Source]:
    d, h, kv, hd = c["embed_dim"], c["num_heads"], c["num_kv_heads"], c["head_dim"]
    f, v = c["mlp_dim"], c["vocab_size"]
    fused = c.get("model_type") == "phi3"
    m = lambda name: tuple(p + name for p in TEXT_PREFIXES)  # noqa: E731
    out = {
        "embedding": direct(m("embed_tokens.weight"), ((v,), (d,))),
        "final_norm": direct(m("norm.weight"), ((d,),)),
    }
    if not c["tie_embeddings"]:
        out["lm_head"] = linear(("lm_head.weight", "language_model.lm_head.weight"), (v,), (d,))
    for i in range(c["num_layers"]):
        p, s = f"layers/{i}/", f"layers.{i}."
        for ours, theirs in _NORMS[c.get("norm_layout", "pre")].items():
            out[p + ours] = direct(m(f"{s}{theirs}.weight"), ((d,),))
        qkv_rows = (h + 2 * kv) * hd
        for j, (name, heads) in enumerate((("q", h), ("k", kv), ("v", kv))):
            proj = f"{s}self_attn.{name}_proj"
            if fused:
                out[f"{p}attn/{name}"] = linear(
                    m(s + "self_attn.qkv_proj.weight"),
                    (heads, hd),
                    (d,),
                    shape=(qkv_rows, d),
                    offset=(0, h * hd, (h + kv) * hd)[j],
                )
            else:
                out[f"{p}attn/{name}"] = linear(m(proj + ".weight"), (heads, hd), (d,))
            if c.get("qkv_bias"):
                out[f"{p}attn/{name}_bias"] = direct(m(proj + ".bias"), ((heads, hd),))
        if c.get("qk_norm") == "head":
            for name in ("q", "k"):
                out[f"{p}attn/{name}_norm"] = direct(
                    m(f"{s}self_attn.{name}_norm.weight"), ((hd,),)
                )
        elif c.get("qk_norm") == "projection":
            for name, heads in (("q", h), ("k", kv)):
                out[f"{p}attn/{name}_norm"] = direct(
                    m(f"{s}self_attn.{name}_norm.weight"), ((heads, hd),)
                )
        out[p + "attn/o"] = linear(m(s + "self_attn.o_proj.weight"), (d,), (h, hd))
        if c.get("o_bias"):
            out[p + "attn/o_bias"] = direct(m(s + "self_attn.o_proj.bias"), ((d,),))
        for j, (name, (o_dim, i_dim)) in enumerate((("gate", (f, d)), ("up", (f, d)))):
            if fused:
                out[f"{p}mlp/{name}"] = linear(
                    m(s + "mlp.gate_up_proj.weight"), (f,), (d,), shape=(2 * f, d), offset=j * f
                )
            else:
                out[f"{p}mlp/{name}"] = linear(m(f"{s}mlp.{name}_proj.weight"), (o_dim,), (i_dim,))
        out[f"{p}mlp/down"] = linear(m(f"{s}mlp.down_proj.weight"), (d,), (f,))
        if i in c.get("moe_layers", ()):
            for k in [k for k in out if k.startswith(f"{p}mlp/")]:
                del out[k]
            out.update(_moe(c, p, s, m))
        elif c.get("mlp_bias"):
            for name, o_dim in (("gate", f), ("up", f), ("down", d)):
                out[f"{p}mlp/{name}_bias"] = direct(m(f"{s}mlp.{name}_proj.bias"), ((o_dim,),))
    return out


def _moe(c: dict[str, Any], p: str, s: str, m) -> dict[str, Source]:
    """A mixture layer's weights (`ppl_jax.models.moe.MoeMLP`): Mixtral's
    `block_sparse_moe.{gate, experts.{e}.w1/w3/w2}`, the others' `mlp.{gate,
    experts.{e}.gate_proj/up_proj/down_proj}`, Qwen2-MoE's `shared_expert` and its gate."""
    d, f, e, sh = c["embed_dim"], c["moe_mlp_dim"], c["moe_experts"], c["moe_shared_mlp_dim"]
    mixtral = c.get("model_type") == "mixtral"
    block = f"{s}block_sparse_moe." if mixtral else f"{s}mlp."
    names = ("w1", "w3", "w2") if mixtral else ("gate_proj", "up_proj", "down_proj")
    out = {f"{p}mlp/router": linear(m(block + "gate.weight"), (e,), (d,))}
    for ours, theirs, dims in zip(
        ("gate", "up", "down"), names, ((f, d), (f, d), (d, f)), strict=True
    ):
        out[f"{p}mlp/{ours}"] = stacked(
            [
                linear(m(f"{block}experts.{j}.{theirs}.weight"), *((x,) for x in dims))
                for j in range(e)
            ]
        )
    if sh:
        shared = f"{s}mlp.shared_expert."
        for ours, theirs, dims in (
            ("shared_gate_proj", "gate_proj", (sh, d)),
            ("shared_up", "up_proj", (sh, d)),
            ("shared_down", "down_proj", (d, sh)),
        ):
            out[f"{p}mlp/{ours}"] = linear(m(f"{shared}{theirs}.weight"), (dims[0],), (dims[1],))
        out[f"{p}mlp/shared_scale"] = direct(
            m(f"{s}mlp.shared_expert_gate.weight"), ((1,), (d,)), fixed=((0, 0),)
        )
    return out


def _gpt2(c: dict[str, Any]) -> dict[str, Source]:
    d, h, f, v = c["embed_dim"], c["num_heads"], c["mlp_dim"], c["vocab_size"]
    hd = d // h
    m = lambda name: (f"transformer.{name}", name)  # noqa: E731
    out = {
        "embedding": direct(m("wte.weight"), ((v,), (d,))),
        "position_embedding": direct(m("wpe.weight"), ((c["max_positions"],), (d,))),
        "final_norm": direct(m("ln_f.weight"), ((d,),)),
        "final_norm_bias": direct(m("ln_f.bias"), ((d,),)),
    }
    if not c["tie_embeddings"]:
        out["lm_head"] = linear(("lm_head.weight",), (v,), (d,))
    for i in range(c["num_layers"]):
        p, s = f"layers/{i}/", f"h.{i}."
        for ours, theirs in (("attn_norm", "ln_1"), ("mlp_norm", "ln_2")):
            out[p + ours] = direct(m(f"{s}{theirs}.weight"), ((d,),))
            out[p + ours + "_bias"] = direct(m(f"{s}{theirs}.bias"), ((d,),))
        for j, name in enumerate(("q", "k", "v")):  # Conv1D c_attn: [in, 3 * embed]
            out[f"{p}attn/{name}"] = direct(
                m(s + "attn.c_attn.weight"), ((d,), (h, hd)), shape=(d, 3 * d), offset=j * d
            )
            out[f"{p}attn/{name}_bias"] = direct(
                m(s + "attn.c_attn.bias"), ((h, hd),), shape=(3 * d,), offset=j * d
            )
        out[p + "attn/o"] = direct(m(s + "attn.c_proj.weight"), ((h, hd), (d,)))
        out[p + "attn/o_bias"] = direct(m(s + "attn.c_proj.bias"), ((d,),))
        out[p + "mlp/fc"] = direct(m(s + "mlp.c_fc.weight"), ((d,), (f,)))
        out[p + "mlp/fc_bias"] = direct(m(s + "mlp.c_fc.bias"), ((f,),))
        out[p + "mlp/proj"] = direct(m(s + "mlp.c_proj.weight"), ((f,), (d,)))
        out[p + "mlp/proj_bias"] = direct(m(s + "mlp.c_proj.bias"), ((d,),))
    return out


def _gpt_neox(c: dict[str, Any]) -> dict[str, Source]:
    d, h, f, v = c["embed_dim"], c["num_heads"], c["mlp_dim"], c["vocab_size"]
    hd = d // h
    m = lambda name: (f"gpt_neox.{name}", name)  # noqa: E731
    out = {
        "embedding": direct(m("embed_in.weight"), ((v,), (d,))),
        "final_norm": direct(m("final_layer_norm.weight"), ((d,),)),
        "final_norm_bias": direct(m("final_layer_norm.bias"), ((d,),)),
    }
    if not c["tie_embeddings"]:
        out["lm_head"] = linear(("embed_out.weight",), (v,), (d,))
    for i in range(c["num_layers"]):
        p, s = f"layers/{i}/", f"layers.{i}."
        for ours, theirs in (
            ("attn_norm", "input_layernorm"),
            ("mlp_norm", "post_attention_layernorm"),
        ):
            out[p + ours] = direct(m(f"{s}{theirs}.weight"), ((d,),))
            out[p + ours + "_bias"] = direct(m(f"{s}{theirs}.bias"), ((d,),))
        qkv = s + "attention.query_key_value"
        for j, name in enumerate(("q", "k", "v")):  # rows [heads, 3, head_dim]
            out[f"{p}attn/{name}"] = linear(
                m(qkv + ".weight"), (h, 3, hd), (d,), shape=(3 * d, d), fixed=((1, j),)
            )
            if c["bias"]:
                out[f"{p}attn/{name}_bias"] = direct(
                    m(qkv + ".bias"), ((h, 3, hd),), shape=(3 * d,), fixed=((1, j),)
                )
        out[p + "attn/o"] = linear(m(s + "attention.dense.weight"), (d,), (h, hd))
        if c["bias"]:
            out[p + "attn/o_bias"] = direct(m(s + "attention.dense.bias"), ((d,),))
        out[p + "fc"] = linear(m(s + "mlp.dense_h_to_4h.weight"), (f,), (d,))
        out[p + "fc_bias"] = direct(m(s + "mlp.dense_h_to_4h.bias"), ((f,),))
        out[p + "proj"] = linear(m(s + "mlp.dense_4h_to_h.weight"), (d,), (f,))
        out[p + "proj_bias"] = direct(m(s + "mlp.dense_4h_to_h.bias"), ((d,),))
    return out
