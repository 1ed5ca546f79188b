"""What a GGUF file's metadata and tensor names mean: the architecture, as the `config.json`
the Hugging Face reader reads (`config`, then `ppl_jax.models.registry.read_hf_config`, so a GGUF
file is described exactly as its original Hugging Face checkpoint would be, where the GGUF
carries the field), and the mapping rules of its tensors (`rules`, in the one mapping language
of `ppl_jax.checkpoints.mapping`).

The architectures are `general.architecture`'s names (`ARCHITECTURES`); their keys
(`{arch}.block_count`, `{arch}.attention.head_count`, ...) and tensors (`token_embd`,
`blk.{i}.attn_q`, ...) are those llama.cpp's `convert_hf_to_gguf.py` writes and llama.cpp reads
(`src/llama-arch.cpp`). Where a GGUF leaves a field out, the value is the one llama.cpp runs the
file with: the Llama architecture covers Mistral (no window), Qwen3-MoE normalizes its top-k
weights on every layer, Gemma's attention scale is `head_dim ** -0.5` except on the 27B models
(`(hidden / heads) ** -0.5`, by their layer count), Gemma 3 has one global layer in six with
local rotary base 10,000 unless the file says otherwise.

The tensors follow the converter's layouts, undone by the rules as transformers' GGUF loader
undoes them (`modeling_gguf_pytorch_utils`): an `[out, in]` projection is GGML's `[in, out]`
`ne`, i.e. the Hugging Face `nn.Linear` weight; the Llama architecture's q and k rows are
permuted per head into interleaved pairs (`LlamaModel.permute`), which the rule's `rope` turns
back into halves; Gemma's norms are stored as `1 + w` (`offset: -1`); GPT-2's `Conv1D` weights
are stored transposed; experts are stacked `[experts, out, in]`; GPT-OSS's interleaved gate and
up are stored apart.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ppl_jax.checkpoints.gguf_file import GGUFFile
from ppl_jax.errors import CheckpointError
from ppl_jax.models import registry

ARCHITECTURES = ("llama", "qwen2", "qwen2moe", "qwen3", "qwen3moe", "gemma2", "gemma3", "phi3",
                 "gpt2", "olmo2", "gpt-oss")  # fmt: skip
_MODEL_TYPES = {"llama": "llama", "qwen2": "qwen2", "qwen2moe": "qwen2_moe", "qwen3": "qwen3",
                "qwen3moe": "qwen3_moe", "gemma2": "gemma2", "gemma3": "gemma3_text",
                "phi3": "phi3", "gpt2": "gpt2", "olmo2": "olmo2", "gpt-oss": "gpt_oss"}  # fmt: skip
# Gemma's layer counts whose attention scale is (hidden / heads) ** -0.5 (llama.cpp's 27B).
_GEMMA_27B = {"gemma2": 46, "gemma3": 62}
LAYER = r"blk\.(?P<l>\d+)\."
HEADS_IN = {"transpose": [1, 0], "reshape": ["embed_dim", -1, "head_dim"]}


def architecture(file: GGUFFile) -> str:
    """`general.architecture`, if ppl_jax reads it.

    Raises:
      CheckpointError: another architecture, naming it and the supported ones.
    """
    arch = file.metadata.get("general.architecture")
    if arch not in ARCHITECTURES:
        raise CheckpointError(
            f"{file.path!r} holds the GGUF architecture {str(arch)[:40]!r}, which ppl_jax does "
            f"not read (it reads {', '.join(ARCHITECTURES)})."
        )
    return arch


def _key(file: GGUFFile, arch: str, key: str, default: Any = KeyError) -> Any:
    value = file.metadata.get(f"{arch}.{key}", default)
    if value is KeyError:
        raise CheckpointError(
            f"{file.path!r} lacks the metadata key {arch}.{key}, which its {arch} architecture "
            f"needs; re-convert the model."
        )
    return value


def _rope(file: GGUFFile, arch: str) -> dict[str, Any]:
    """The rotary scaling of the `{arch}.rope.scaling.*` keys, as a `rope_parameters` dict
    (without `rope_theta`); {} for none."""
    kind = _key(file, arch, "rope.scaling.type", "none")
    factor = _key(file, arch, "rope.scaling.factor", None)
    original = _key(file, arch, "rope.scaling.original_context_length", None)
    if kind == "linear" and factor not in (None, 1.0):
        return {"rope_type": "linear", "factor": float(factor)}
    if kind == "yarn":
        out: dict[str, Any] = {"rope_type": "yarn", "factor": float(factor or 1.0)}
        if original:
            out["original_max_position_embeddings"] = int(original)
        for ours, theirs in (("beta_fast", "yarn_beta_fast"), ("beta_slow", "yarn_beta_slow"),
                             ("attention_factor", "yarn_attn_factor")):  # fmt: skip
            if _key(file, arch, f"rope.scaling.{theirs}", None) is not None:
                out[ours] = float(_key(file, arch, f"rope.scaling.{theirs}"))
        return out
    if kind not in ("none", "linear", "longrope"):
        raise CheckpointError(
            f"{file.path!r} has the rope scaling {str(kind)[:20]!r}, which ppl_jax does not read "
            f"from GGUF (none, linear, yarn, longrope)."
        )
    return {}


def config(file: GGUFFile, tensor_rows: Any) -> dict[str, Any]:
    """The `config.json` of the file's model, as transformers names its fields.

    Args:
      file: the checked header.
      tensor_rows: `name -> [rows] float32` for the small F32 tensors some architectures keep
        their rotary factors in (`rope_factors_long`, `rope_freqs`).

    Raises:
      CheckpointError: an unsupported architecture or rope scaling, a missing key, sizes per
        layer.
    """
    arch = architecture(file)
    names = file.tensors
    if "token_embd.weight" not in names:
        raise CheckpointError(f"{file.path!r} has no token_embd.weight; re-convert the model.")
    heads = _key(file, arch, "attention.head_count")
    for key in ("attention.head_count", "attention.head_count_kv", "feed_forward_length"):
        if isinstance(_key(file, arch, key, 0), list):
            raise CheckpointError(
                f"{file.path!r} gives {arch}.{key} per layer, which ppl_jax does not read."
            )
    hidden = _key(file, arch, "embedding_length")
    c: dict[str, Any] = {
        "model_type": _MODEL_TYPES[arch],
        "vocab_size": names["token_embd.weight"].shape[0],
        "hidden_size": hidden,
        "num_hidden_layers": _key(file, arch, "block_count"),
        "num_attention_heads": heads,
        "num_key_value_heads": _key(file, arch, "attention.head_count_kv", heads),
        "max_position_embeddings": _key(file, arch, "context_length"),
        "tie_word_embeddings": "output.weight" not in names,
    }
    for key in ("block_count", "embedding_length", "context_length", "attention.head_count"):
        value = _key(file, arch, key)
        if isinstance(value, bool) or not isinstance(value, int):
            raise CheckpointError(
                f"{file.path!r}: {arch}.{key} = {str(value)[:40]} is not a whole number; "
                f"re-convert the model."
            )
    try:  # before anything is built of them (per-layer lists, the description)
        registry.check_sizes({"num_layers": c["num_hidden_layers"], "embed_dim": hidden,
                              "num_heads": heads, "num_kv_heads": c["num_key_value_heads"],
                              "max_positions": c["max_position_embeddings"]})  # fmt: skip
    except CheckpointError as e:
        raise CheckpointError(f"{file.path!r}: {e}") from None
    if arch == "gpt2":
        return {
            "model_type": "gpt2", "vocab_size": c["vocab_size"], "n_embd": hidden,
            "n_layer": c["num_hidden_layers"], "n_head": heads,
            "n_positions": c["max_position_embeddings"],
            "n_inner": _key(file, arch, "feed_forward_length", None),
            "layer_norm_epsilon": _key(file, arch, "attention.layer_norm_epsilon", 1e-5),
            "tie_word_embeddings": c["tie_word_embeddings"],
        }  # fmt: skip
    c["intermediate_size"] = _key(file, arch, "feed_forward_length", None)
    c["rms_norm_eps"] = _key(file, arch, "attention.layer_norm_rms_epsilon", 1e-6)
    c["head_dim"] = _key(file, arch, "attention.key_length", None) or hidden // heads
    rotary = _key(file, arch, "rope.dimension_count", None)
    if rotary and rotary != c["head_dim"]:
        c["partial_rotary_factor"] = rotary / c["head_dim"]
    rope = _rope(file, arch)
    theta = float(_key(file, arch, "rope.freq_base", 10000.0))
    if "rope_freqs.weight" in names:
        rope = _llama3(file, tensor_rows("rope_freqs.weight"), theta, c["head_dim"])
    c["rope_parameters"] = {"rope_theta": theta, **(rope or {"rope_type": "default"})}
    experts = _key(file, arch, "expert_count", 0)
    if experts:
        c.update(num_experts=experts, num_local_experts=experts,
                 num_experts_per_tok=_key(file, arch, "expert_used_count"),
                 moe_intermediate_size=_key(file, arch, "expert_feed_forward_length"))  # fmt: skip
        c["intermediate_size"] = c["intermediate_size"] or c["moe_intermediate_size"]
    window = _key(file, arch, "attention.sliding_window", 0)
    bias = "blk.0.attn_q.bias" in names
    if arch in ("llama", "qwen3", "qwen3moe", "olmo2"):
        c["attention_bias"] = bias
    if arch == "llama":
        c["mlp_bias"] = "blk.0.ffn_down.bias" in names
    if arch in ("qwen2moe", "qwen3moe"):
        dense = [i for i in range(c["num_hidden_layers"]) if f"blk.{i}.ffn_gate_inp.weight"
                 not in names]  # fmt: skip
        c.update(norm_topk_prob=arch == "qwen3moe", decoder_sparse_step=1, mlp_only_layers=dense)
        if arch == "qwen2moe":
            c["shared_expert_intermediate_size"] = _key(
                file, arch, "expert_shared_feed_forward_length", 0
            )
    if arch in ("gemma2", "gemma3"):
        _gemma(file, arch, c, window, theta, rope)
    if arch == "olmo2" and window:
        pattern = _key(file, arch, "attention.sliding_window_pattern", None)
        c.update(model_type="olmo3", sliding_window=window)
        if isinstance(pattern, list):
            c["layer_types"] = _layer_types(pattern)
    if arch == "phi3":
        c.update(sliding_window=window or None)
        if "rope_factors_long.weight" in names:
            c["rope_parameters"] = {
                "rope_type": "longrope", "rope_theta": theta,
                "long_factor": tensor_rows("rope_factors_long.weight").tolist(),
                "short_factor": tensor_rows("rope_factors_short.weight").tolist(),
            }  # fmt: skip
            c["original_max_position_embeddings"] = _key(
                file, arch, "rope.scaling.original_context_length"
            )
    if arch == "gpt-oss":
        c.update(sliding_window=window or 128, attention_bias=bias,
                 intermediate_size=c["moe_intermediate_size"])  # fmt: skip
        if rope.get("rope_type") == "yarn":  # as the original's config (OpenAI's YaRN)
            c["rope_parameters"]["truncate"] = False
    return c


def _layer_types(pattern: list[Any]) -> list[str]:
    return ["sliding_attention" if bool(p) else "full_attention" for p in pattern]


def _gemma(file, arch, c, window, theta, rope) -> None:
    """Gemma 2 and 3's fields llama.cpp fixes or reads apart (see the module docstring)."""
    hidden, heads, layers = c["hidden_size"], c["num_attention_heads"], c["num_hidden_layers"]
    big = layers == _GEMMA_27B[arch]
    c["query_pre_attn_scalar"] = hidden // heads if big else c["head_dim"]
    c["hidden_activation"] = "gelu_pytorch_tanh"
    for key in ("attn_logit_softcapping", "final_logit_softcapping"):
        value = _key(file, arch, key, None)
        if arch == "gemma3" or value is not None:
            c[key] = value
    pattern = _key(file, arch, "attention.sliding_window_pattern", 2 if arch == "gemma2" else 6)
    if isinstance(pattern, list):
        types = _layer_types(pattern)
    else:
        pattern = int(pattern)
        types = ["sliding_attention" if pattern and i % pattern < pattern - 1 else
                 "full_attention" for i in range(layers)]  # fmt: skip
    if not window:
        types = ["full_attention"] * layers
    c.update(sliding_window=window or None, layer_types=types)
    if arch == "gemma3":
        local = float(_key(file, arch, "rope.freq_base_swa", 10000.0))
        full = {"rope_type": "default", "rope_theta": theta, **rope}
        c["rope_parameters"] = {
            "full_attention": full,
            "sliding_attention": {"rope_type": "default", "rope_theta": local},
        }


def _llama3(file: GGUFFile, factors: Any, theta: float, head_dim: int) -> dict[str, Any]:
    """The `llama3` rope parameters whose per-frequency factors llama.cpp's converter stored in
    `rope_freqs.weight`, found among Llama 3.1-3.3's (factor 8 or 32, low 1, high 4, original
    8,192 positions).

    Raises:
      CheckpointError: factors of no such parameters.
    """
    freqs = 1.0 / (theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim))
    for factor in (8.0, 16.0, 32.0, 4.0, 2.0):
        low, high, old = 1.0, 4.0, 8192
        wavelen = 2 * math.pi / freqs
        smooth = (old / wavelen - low) / (high - low)
        want = np.where(
            wavelen < old / high, 1.0,
            np.where(wavelen > old / low, factor, 1 / ((1 - smooth) / factor + smooth)),
        )  # fmt: skip
        if factors.shape == want.shape and np.allclose(factors, want, rtol=1e-5):
            return {"rope_type": "llama3", "factor": factor, "low_freq_factor": low,
                    "high_freq_factor": high, "original_max_position_embeddings": old}  # fmt: skip
    raise CheckpointError(
        f"{file.path!r} stores rotary factors (rope_freqs.weight) of no Llama 3 scaling ppl_jax "
        f"knows; re-convert the model from its Hugging Face checkpoint."
    )


def description(file: GGUFFile, tensor_rows: Any) -> dict[str, Any]:
    """The architecture description of a GGUF file (`registry.read_hf_config` of `config`),
    its sizes checked before anything is built.

    Raises:
      CheckpointError: as `config` and the family's reader, in one sentence naming the file.
    """
    c = config(file, tensor_rows)
    try:
        return registry.read_hf_config(c)
    except CheckpointError as e:
        raise CheckpointError(f"{file.path!r}: {str(e)[:600]}") from None
    except (KeyError, TypeError, ValueError, OverflowError, AttributeError) as e:
        raise CheckpointError(
            f"{file.path!r}: a metadata value has the wrong type or is missing "
            f"({type(e).__name__}: {str(e)[:120]})."
        ) from None


def rules(arch: str, d: dict[str, Any]) -> list[dict[str, Any]]:
    """The mapping rules from a GGUF file's tensor names to the model's weights (see the module
    docstring), for the description `d` of architecture `arch`."""
    if arch == "gpt2":
        return _gpt2_rules()
    gemma = arch in ("gemma2", "gemma3")
    norm = {"offset": -1.0} if gemma else {}
    permute = {"rope": {"axis": 2}} if arch == "llama" else {}
    out: list[dict[str, Any]] = [
        {"from": r"token_embd\.weight", "to": "embedding"},
        {"from": r"output_norm\.weight", "to": "final_norm", **norm},
        {"from": r"output\.weight", "to": "lm_head", "transpose": [1, 0]},
        {"from": r"rope_freqs\.weight|rope_factors_(?:long|short)\.weight", "to": None},
    ]
    layout = {
        "pre": {"attn_norm": "attn_norm", "ffn_norm": "mlp_norm"},
        "sandwich": {"attn_norm": "attn_norm", "post_attention_norm": "post_attn_norm",
                     "ffn_norm": "mlp_norm", "post_ffw_norm": "post_mlp_norm"},
        "post": {"post_attention_norm": "post_attn_norm", "post_ffw_norm": "post_mlp_norm"},
    }[d.get("norm_layout", "pre")]  # fmt: skip
    if arch == "gpt-oss":
        layout = {"attn_norm": "attn_norm", "post_attention_norm": "mlp_norm"}
    for theirs, ours in layout.items():
        out.append({"from": LAYER + theirs + r"\.weight", "to": "layers/{l}/" + ours, **norm})
    attn = "layers/{l}/attn/"
    out += [
        {"from": LAYER + r"attn_(?P<p>[qk])\.weight", "to": attn + "{p}", **HEADS_IN, **permute},
        {"from": LAYER + r"attn_v\.weight", "to": attn + "v", **HEADS_IN},
        {"from": LAYER + r"attn_(?P<p>[qk])\.bias", "to": attn + "{p}_bias",
         "reshape": [-1, "head_dim"], **({"rope": {"axis": 1}} if permute else {})},
        {"from": LAYER + r"attn_v\.bias", "to": attn + "v_bias", "reshape": [-1, "head_dim"]},
        {"from": LAYER + r"attn_output\.weight", "to": attn + "o", "transpose": [1, 0],
         "reshape": ["num_heads", "head_dim", "embed_dim"]},
        {"from": LAYER + r"attn_output\.bias", "to": attn + "o_bias"},
        {"from": LAYER + r"attn_sinks\.weight", "to": attn + "sinks"},
    ]  # fmt: skip
    if not permute:  # q, k and v fused by the converter (Phi-3), rows q, then k, then v
        q, kv = d["num_heads"] * d["head_dim"], d["num_kv_heads"] * d["head_dim"]
        out.append({"from": LAYER + r"attn_qkv\.weight", "to": [attn + p for p in "qkv"],
                    "split": {"axis": 0, "sizes": [q, kv, kv]}, **HEADS_IN})  # fmt: skip
    qk_norm = {"from": LAYER + r"attn_(?P<p>[qk])_norm\.weight", "to": attn + "{p}_norm", **norm}
    if d.get("qk_norm") == "projection":
        qk_norm["reshape"] = [-1, "head_dim"]
    out.append(qk_norm)
    mlp = "layers/{l}/mlp/"
    linear = {"transpose": [1, 0]}
    if arch == "phi3":  # gate and up fused in ffn_up, gate first
        out.append({"from": LAYER + r"ffn_up\.weight", "to": [mlp + "gate", mlp + "up"],
                    "split": {"axis": 0}, **linear})  # fmt: skip
    stacked = {"transpose": [0, 2, 1]}
    out += [
        {"from": LAYER + r"ffn_(?P<p>gate|up|down)\.weight", "to": mlp + "{p}", **linear},
        {"from": LAYER + r"ffn_gate_inp\.weight", "to": mlp + "router", **linear},
        {"from": LAYER + r"ffn_gate_inp\.bias", "to": mlp + "router_bias"},
        {"from": LAYER + r"ffn_(?P<p>gate|up|down)_exps\.weight", "to": mlp + "{p}", **stacked},
        {"from": LAYER + r"ffn_(?P<p>gate|up|down)_exps\.bias", "to": mlp + "{p}_bias"},
        {"from": LAYER + r"ffn_gate_up_exps\.weight", "to": [mlp + "gate", mlp + "up"],
         "split": {"axis": 1}, **stacked},
        {"from": LAYER + r"ffn_gate_shexp\.weight", "to": mlp + "shared_gate_proj", **linear},
        {"from": LAYER + r"ffn_(?P<p>up|down)_shexp\.weight", "to": mlp + "shared_{p}", **linear},
        {"from": LAYER + r"ffn_gate_inp_shexp\.weight", "to": mlp + "shared_scale",
         "reshape": ["embed_dim"]},
    ]  # fmt: skip
    return out


def _gpt2_rules() -> list[dict[str, Any]]:
    """GPT-2: the converter stores `Conv1D` weights transposed (`[out, in]`) and keeps the fused
    `c_attn` (`attn_qkv`: rows q, then k, then v)."""
    qkv = [f"layers/{{l}}/attn/{p}" for p in "qkv"]
    out = [
        {"from": r"token_embd\.weight", "to": "embedding"},
        {"from": r"position_embd\.weight", "to": "position_embedding"},
        {"from": r"output_norm\.weight", "to": "final_norm"},
        {"from": r"output_norm\.bias", "to": "final_norm_bias"},
        {"from": r"output\.weight", "to": "lm_head", "transpose": [1, 0]},
        {"from": LAYER + r"attn_qkv\.weight", "to": qkv, "split": {"axis": 0},
         "transpose": [1, 0], "reshape": ["embed_dim", "num_heads", -1]},
        {"from": LAYER + r"attn_qkv\.bias", "to": [n + "_bias" for n in qkv],
         "split": {"axis": 0}, "reshape": ["num_heads", -1]},
        {"from": LAYER + r"attn_output\.weight", "to": "layers/{l}/attn/o", "transpose": [1, 0],
         "reshape": ["num_heads", -1, "embed_dim"]},
        {"from": LAYER + r"attn_output\.bias", "to": "layers/{l}/attn/o_bias"},
        {"from": LAYER + r"ffn_up\.weight", "to": "layers/{l}/mlp/fc", "transpose": [1, 0]},
        {"from": LAYER + r"ffn_up\.bias", "to": "layers/{l}/mlp/fc_bias"},
        {"from": LAYER + r"ffn_down\.weight", "to": "layers/{l}/mlp/proj", "transpose": [1, 0]},
        {"from": LAYER + r"ffn_down\.bias", "to": "layers/{l}/mlp/proj_bias"},
    ]  # fmt: skip
    for theirs, ours in (("attn_norm", "attn_norm"), ("ffn_norm", "mlp_norm")):
        out.append({"from": LAYER + theirs + r"\.weight", "to": "layers/{l}/" + ours})
        out.append({"from": LAYER + theirs + r"\.bias", "to": "layers/{l}/" + ours + "_bias"})
    return out
