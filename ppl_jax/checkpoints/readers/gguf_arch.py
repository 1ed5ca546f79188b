"""What a GGUF file's metadata and tensor names mean: the architecture, as the `config.json`
the Hugging Face reader reads (`config`, then `ppl_jax.models.registry.read_hf_config`, so a GGUF
file is described exactly as its original Hugging Face checkpoint would be, where the GGUF
carries the field), and the mapping rules of its tensors (`rules`, in the one mapping language
of `ppl_jax.checkpoints.mapping.language`).

The architectures are `general.architecture`'s names, each read by the family that declares it
(`Family.gguf` in `ppl_jax.models.families`: `registry.for_gguf_architecture`); this module
reads what every architecture's keys share (`{arch}.block_count`, `{arch}.embedding_length`,
`{arch}.attention.head_count`, the rotary keys and Llama 3's rotary factors, the experts'
counts), and the family completes it (`GGUFArchitecture.config`) and maps the tensors
(`GGUFArchitecture.rules`, mostly `ppl_jax.models.gguf_names.llama_rules`). The keys and tensor
names are those llama.cpp's `convert_hf_to_gguf.py` writes and llama.cpp reads
(`src/llama-arch.cpp`); where a GGUF leaves a field out, the value is the one llama.cpp runs the
file with.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ppl_jax.checkpoints.formats.gguf_file import GGUFFile
from ppl_jax.errors import CheckpointError
from ppl_jax.models import registry
from ppl_jax.models.gguf_names import GGUFArchitecture, GGUFHeader


def architecture(file: GGUFFile) -> str:
    """`general.architecture`, if a family of ppl_jax reads it.

    Raises:
      CheckpointError: another architecture, naming it and the supported ones.
    """
    return _architecture(file)[0]


def _architecture(file: GGUFFile) -> tuple[str, GGUFArchitecture]:
    """`general.architecture` and how its family reads it (see `architecture`)."""
    arch = file.metadata.get("general.architecture")
    found = registry.for_gguf_architecture(arch)
    if found is None:
        raise CheckpointError(
            f"{file.path!r} holds the GGUF architecture {str(arch)[:40]!r}, which ppl_jax does "
            f"not read (it reads {', '.join(registry.gguf_architectures())})."
        )
    return arch, found


def _rope(h: GGUFHeader) -> dict[str, Any]:
    """The rotary scaling of the `{arch}.rope.scaling.*` keys, as a `rope_parameters` dict
    (without `rope_theta`); {} for none."""
    kind = h.key("rope.scaling.type", "none")
    factor = h.key("rope.scaling.factor", None)
    original = h.key("rope.scaling.original_context_length", None)
    if kind == "linear" and factor not in (None, 1.0):
        return {"rope_type": "linear", "factor": float(factor)}
    if kind == "yarn":
        out: dict[str, Any] = {"rope_type": "yarn", "factor": float(factor or 1.0)}
        if original:
            out["original_max_position_embeddings"] = int(original)
        for ours, theirs in (("beta_fast", "yarn_beta_fast"), ("beta_slow", "yarn_beta_slow"),
                             ("attention_factor", "yarn_attn_factor")):  # fmt: skip
            if h.key(f"rope.scaling.{theirs}", None) is not None:
                out[ours] = float(h.key(f"rope.scaling.{theirs}"))
        return out
    if kind not in ("none", "linear", "longrope"):
        raise CheckpointError(
            f"{h.path!r} has the rope scaling {str(kind)[:20]!r}, which ppl_jax does not read "
            f"from GGUF (none, linear, yarn, longrope)."
        )
    return {}


def config(file: GGUFFile, tensor_rows: Any) -> dict[str, Any]:
    """The `config.json` of the file's model, as transformers names its fields: what the keys
    every architecture shares give, completed by the architecture's family
    (`GGUFArchitecture.config`).

    Args:
      file: the checked header.
      tensor_rows: `name -> [rows] float32` for the small F32 tensors some architectures keep
        their rotary factors in (`rope_factors_long`, `rope_freqs`).

    Raises:
      CheckpointError: an unsupported architecture or rope scaling, a missing key, sizes per
        layer.
    """
    arch, reader = _architecture(file)
    h = GGUFHeader(file.path, arch, file.metadata, file.tensors.keys(), tensor_rows)
    names = file.tensors
    if "token_embd.weight" not in names:
        raise CheckpointError(f"{file.path!r} has no token_embd.weight; re-convert the model.")
    heads = h.key("attention.head_count")
    for key in ("attention.head_count", "attention.head_count_kv", "feed_forward_length"):
        if isinstance(h.key(key, 0), list):
            raise CheckpointError(
                f"{file.path!r} gives {arch}.{key} per layer, which ppl_jax does not read."
            )
    hidden = h.key("embedding_length")
    c: dict[str, Any] = {
        "model_type": reader.model_type,
        "vocab_size": names["token_embd.weight"].shape[0],
        "hidden_size": hidden,
        "num_hidden_layers": h.key("block_count"),
        "num_attention_heads": heads,
        "num_key_value_heads": h.key("attention.head_count_kv", heads),
        "max_position_embeddings": h.key("context_length"),
        "tie_word_embeddings": "output.weight" not in names,
    }
    for key in ("block_count", "embedding_length", "context_length", "attention.head_count"):
        value = h.key(key)
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
    if reader.llama_like:
        _llama_like(h, c)
    return reader.config(h, c)


def _llama_like(h: GGUFHeader, c: dict[str, Any]) -> None:
    """The Llama-like fields of `c` (`GGUFArchitecture.llama_like`), from the keys every such
    architecture shares: the MLP width, the RMSNorm epsilon, `head_dim` (`attention.key_length`
    or hidden / heads), partial rotary, the rotary scaling (Llama 3's from its factors in
    `rope_freqs`), the experts."""
    c["intermediate_size"] = h.key("feed_forward_length", None)
    c["rms_norm_eps"] = h.key("attention.layer_norm_rms_epsilon", 1e-6)
    hidden, heads = c["hidden_size"], c["num_attention_heads"]
    c["head_dim"] = h.key("attention.key_length", None) or hidden // heads
    rotary = h.key("rope.dimension_count", None)
    if rotary and rotary != c["head_dim"]:
        c["partial_rotary_factor"] = rotary / c["head_dim"]
    rope = _rope(h)
    theta = float(h.key("rope.freq_base", 10000.0))
    if "rope_freqs.weight" in h.tensors:
        rope = _llama3(h, h.rows("rope_freqs.weight"), theta, c["head_dim"])
    c["rope_parameters"] = {"rope_theta": theta, **(rope or {"rope_type": "default"})}
    experts = h.key("expert_count", 0)
    if experts:
        c.update(num_experts=experts, num_local_experts=experts,
                 num_experts_per_tok=h.key("expert_used_count"),
                 moe_intermediate_size=h.key("expert_feed_forward_length"))  # fmt: skip
        c["intermediate_size"] = c["intermediate_size"] or c["moe_intermediate_size"]


def _llama3(h: GGUFHeader, factors: Any, theta: float, head_dim: int) -> dict[str, Any]:
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
        f"{h.path!r} stores rotary factors (rope_freqs.weight) of no Llama 3 scaling ppl_jax "
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


def rules(file: GGUFFile, d: dict[str, Any]) -> list[dict[str, Any]]:
    """The mapping rules from the GGUF file's tensor names to the model's weights, for its
    description `d` (the family's `GGUFArchitecture.rules`).

    Raises:
      CheckpointError: an architecture no family reads (see `architecture`).
    """
    return _architecture(file)[1].rules(d)
