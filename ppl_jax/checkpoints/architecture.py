"""Where a checkpoint's architecture comes from when the checkpoint does not carry it
(`checkpoint.architecture`).

- a Hugging Face `config.json` (the file, or the directory holding it): read as
  `ppl_jax.checkpoints.hf.read_description` reads a Hugging Face directory;
- a ppl_jax description JSON (`{"family": "llama", ...}`, what `Checkpoint.description()` gives);
- `maxtext:<model name> [key=value ...]`: a MaxText model (`configs/models/<name>.yml`, the
  decoder blocks `llama2`, `mistral` and `qwen3`) with MaxText's own override names
  (`base_num_decoder_layers=2 base_emb_dim=64 ...`), plus `model_vocab_size=N` to score only
  the tokenizer's first N ids of a vocabulary padded past it;
- `module:function`: a Python entry point returning a `LanguageModel` (a model family of the
  user's own), called with `dtype=` when it takes it.

When the checkpoint carries its own architecture (ppl_jax's `metadata` item, a Hugging Face
directory), an explicit `checkpoint.architecture` wins: the user who sets it means it.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import json
import os
from typing import Any

from ppl_jax.checkpoints import hf
from ppl_jax.errors import CheckpointError, ConfigError
from ppl_jax.models import registry
from ppl_jax.models.interface import LanguageModel
from ppl_jax.runtime import paths

# MaxText's base.yml defaults and configs/models/*.yml (maxtext 0.2.5) for the decoder blocks
# ppl_jax reads; every other key keeps its base.yml value.
MAXTEXT_BASE = {
    "base_emb_dim": 2048, "base_num_query_heads": 16, "base_num_kv_heads": 16,
    "base_mlp_dim": 7168, "base_num_decoder_layers": 16, "head_dim": 128, "vocab_size": 32000,
    "normalization_layer_epsilon": 1e-5, "rope_max_timescale": 10000,
    "logits_via_embedding": False, "max_target_length": 2048, "decoder_block": "llama2",
    "use_qk_norm": False, "rope_type": "default", "sliding_window_size": 0,
    "mlp_activations": ["silu", "linear"], "scan_layers": True,
}  # fmt: skip
_LLAMA2 = {"head_dim": 128, "vocab_size": 32000, "decoder_block": "llama2"}
_QWEN3 = {"head_dim": 128, "vocab_size": 151936, "decoder_block": "qwen3", "use_qk_norm": True,
          "normalization_layer_epsilon": 1e-6, "rope_max_timescale": 1000000}  # fmt: skip


def _sizes(emb, heads, kv, mlp, layers, **more):
    return {"base_emb_dim": emb, "base_num_query_heads": heads, "base_num_kv_heads": kv,
            "base_mlp_dim": mlp, "base_num_decoder_layers": layers, **more}  # fmt: skip


MAXTEXT_MODELS = {
    "default": {},
    "llama2-7b": {**_LLAMA2, **_sizes(4096, 32, 32, 11008, 32)},
    "llama2-13b": {**_LLAMA2, **_sizes(5120, 40, 40, 13824, 40)},
    "llama2-70b": {**_LLAMA2, **_sizes(8192, 64, 8, 28672, 80)},
    "mistral-7b": {
        **_LLAMA2,
        **_sizes(4096, 32, 8, 14336, 32),
        "decoder_block": "mistral",
        "rope_max_timescale": 1000000,
    },  # fmt: skip
    "qwen3-0.6b": {**_QWEN3, **_sizes(1024, 16, 8, 3072, 28), "logits_via_embedding": True},
    "qwen3-1.7b": {**_QWEN3, **_sizes(2048, 16, 8, 6144, 28), "logits_via_embedding": True},
    "qwen3-4b": {**_QWEN3, **_sizes(2560, 32, 8, 9728, 36), "logits_via_embedding": True},
    "qwen3-8b": {**_QWEN3, **_sizes(4096, 32, 8, 12288, 36)},
    "qwen3-14b": {**_QWEN3, **_sizes(5120, 40, 8, 17408, 40)},
    "qwen3-32b": {**_QWEN3, **_sizes(5120, 64, 8, 25600, 64)},
}
MAXTEXT_BLOCKS = ("llama2", "mistral", "qwen3")


def maxtext_description(name: str, overrides: dict[str, str]) -> dict[str, Any]:
    """The ppl_jax description of a MaxText model with MaxText-named overrides.

    Raises:
      ConfigError: an unknown model name or override key, a value of the wrong type, or a
        decoder block, RoPE type, activation or window ppl_jax does not read from MaxText.
    """
    if name not in MAXTEXT_MODELS:
        raise ConfigError(
            f"checkpoint.architecture: MaxText model {name!r} is not one ppl_jax knows "
            f"({', '.join(sorted(MAXTEXT_MODELS))}); give 'maxtext:default' with every size as "
            f"an override (base_emb_dim=... base_num_decoder_layers=...)."
        )
    c = {**MAXTEXT_BASE, **MAXTEXT_MODELS[name]}
    model_vocab = None
    for key, raw in overrides.items():
        if key == "model_vocab_size":
            model_vocab = _positive(key, raw)
            continue
        if key not in c:
            raise ConfigError(
                f"checkpoint.architecture: {key!r} is not a MaxText setting ppl_jax reads "
                f"({', '.join(sorted(c))}, model_vocab_size)."
            )
        try:
            c[key] = _typed(raw, c[key])
        except ValueError:
            raise ConfigError(
                f"checkpoint.architecture: {key}={raw[:40]!r} is not "
                f"{_KINDS.get(type(c[key]).__name__, 'a ' + type(c[key]).__name__)}."
            ) from None
        if key in _POSITIVE:
            _positive(key, c[key])
    if model_vocab is not None and model_vocab > int(c["vocab_size"]):
        raise ConfigError(
            f"checkpoint.architecture: model_vocab_size={model_vocab} is more than the stored "
            f"vocabulary (vocab_size={c['vocab_size']}); it scores the tokenizer's first ids of "
            f"a vocabulary padded past them."
        )
    unsupported = [
        (k, c[k], want)
        for k, want in (("decoder_block", MAXTEXT_BLOCKS), ("rope_type", ("default",)))
        if c[k] not in want
    ]
    if c["mlp_activations"] != ["silu", "linear"]:
        unsupported.append(("mlp_activations", c["mlp_activations"], (["silu", "linear"],)))
    if unsupported:
        k, v, want = unsupported[0]
        raise ConfigError(
            f"checkpoint.architecture: MaxText {k}={v!r} is not read by ppl_jax (supported: "
            f"{', '.join(map(str, want))})."
        )
    d = {
        "family": "llama",
        "vocab_size": model_vocab or int(c["vocab_size"]),
        "embed_dim": int(c["base_emb_dim"]),
        "num_layers": int(c["base_num_decoder_layers"]),
        "num_heads": int(c["base_num_query_heads"]),
        "num_kv_heads": int(c["base_num_kv_heads"]),
        "head_dim": int(c["head_dim"]),
        "mlp_dim": int(c["base_mlp_dim"]),
        "max_positions": int(c["max_target_length"]),
        "rope_theta": float(c["rope_max_timescale"]),
        "norm_eps": float(c["normalization_layer_epsilon"]),
        "tie_embeddings": bool(c["logits_via_embedding"]),
    }
    if c["use_qk_norm"]:
        d["qk_norm"] = "head"
    if int(c["sliding_window_size"]):
        d["sliding_window"] = int(c["sliding_window_size"])
        d["sliding_layers"] = list(range(d["num_layers"]))
    return d


_KINDS = {"int": "a whole number", "float": "a number", "bool": "true or false"}
# The MaxText settings that are sizes (and the scales that must be positive).
_POSITIVE = ("base_emb_dim", "base_num_query_heads", "base_num_kv_heads", "base_mlp_dim",
             "base_num_decoder_layers", "head_dim", "vocab_size", "max_target_length",
             "rope_max_timescale", "normalization_layer_epsilon")  # fmt: skip


def _positive(key: str, value: Any) -> Any:
    """`value` (a string is read as a whole number) if it is greater than 0.

    Raises:
      ConfigError: not a number greater than 0, naming the setting.
    """
    try:
        number = int(value.replace("_", "")) if isinstance(value, str) else value
    except ValueError:
        number = None
    if isinstance(number, bool) or not isinstance(number, int | float) or not number > 0:
        raise ConfigError(
            f"checkpoint.architecture: {key}={str(value)[:40]} is not a number greater than 0."
        )
    return number


def _typed(raw: str, like: Any) -> Any:
    if isinstance(like, bool):
        if raw.lower() not in ("true", "false"):
            raise ValueError(raw)
        return raw.lower() == "true"
    if isinstance(like, int):
        return int(raw.replace("_", ""))
    if isinstance(like, float):
        return float(raw)
    if isinstance(like, list):
        return [s.strip() for s in raw.strip("[]").replace('"', "").split(",")]
    return raw


def parse(setting: str) -> tuple[str, Any]:
    """`checkpoint.architecture` as (`kind`, value): `none`, `hf` (a directory), `description`
    (a dict), `maxtext` (a dict), or `entry` (`module:function`).

    Raises:
      ConfigError: a file that is neither a Hugging Face `config.json` nor a description, a
        setting of no recognised form. CheckpointError: as `hf.read_description`.
    """
    setting = str(setting or "").strip()
    if not setting:
        return "none", None
    if setting.startswith("maxtext:"):
        words = setting[len("maxtext:") :].split()
        if not words or "=" in words[0]:
            raise ConfigError(
                f"checkpoint.architecture={setting[:80]!r} names no MaxText model; write "
                f"'maxtext:<model> key=value ...' (models: {', '.join(sorted(MAXTEXT_MODELS))})."
            )
        name, *rest = words
        bad = [r for r in rest if "=" not in r]
        if bad:
            raise ConfigError(
                f"checkpoint.architecture: {bad[0]!r} is not a key=value override of the "
                f"MaxText model {name!r}."
            )
        return "maxtext", maxtext_description(name, dict(r.split("=", 1) for r in rest))
    path = os.path.expanduser(setting)
    if paths.isdir(path) and paths.isfile(paths.join(path, "config.json")):
        return "hf", hf.read_description(path)
    if paths.isfile(path):
        data = paths.read_json_object(path, "checkpoint.architecture")
        if "family" in data:
            try:
                registry.check_sizes(data)  # named by its file: the check repeats at build
            except CheckpointError as e:
                raise CheckpointError(f"{path!r}: {e}") from None
            return "description", data
        if "model_type" in data and os.path.basename(path) == "config.json":
            return "hf", hf.read_description(os.path.dirname(path) or ".")
        raise ConfigError(
            f"checkpoint.architecture {setting!r} is neither a Hugging Face config.json "
            f"(model_type, in a file named config.json) nor a ppl_jax description (family)."
        )
    if ":" in setting and os.sep not in setting:
        return "entry", setting
    raise ConfigError(
        f"checkpoint.architecture={setting!r} is not a config.json, a description JSON, "
        f"'maxtext:<model> key=value ...' or a Python entry point 'module:function'."
    )


def entry_model(entry: str, dtype: Any) -> LanguageModel:
    """The `LanguageModel` a Python entry point `module:function` returns (called with
    `dtype=` when it has that parameter), its `origin` the entry point.

    Raises:
      ConfigError: the module or function cannot be found, or it returns something else.
    """
    module_name, _, function = entry.partition(":")
    try:
        fn = getattr(importlib.import_module(module_name), function)
    except (ImportError, AttributeError) as e:
        raise ConfigError(
            f"checkpoint.architecture: the entry point {entry!r} cannot be loaded ({e})."
        ) from None
    try:
        takes_dtype = "dtype" in inspect.signature(fn).parameters
        model = fn(dtype=dtype) if takes_dtype else fn()
    except (TypeError, ValueError) as e:
        raise ConfigError(
            f"checkpoint.architecture: the entry point {entry!r} cannot be called without "
            f"arguments (or with dtype=) ({e})."
        ) from None
    if not isinstance(model, LanguageModel):
        raise ConfigError(
            f"checkpoint.architecture: {entry!r} returned a {type(model).__name__}, not a "
            f"ppl_jax.LanguageModel (see ppl_jax.from_linen / ppl_jax.from_nnx)."
        )
    return dataclasses.replace(model, origin=entry)


def as_json(description: dict[str, Any]) -> str:
    return json.dumps(description, sort_keys=True)
