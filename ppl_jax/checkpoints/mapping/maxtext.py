"""MaxText models as ppl_jax descriptions: `checkpoint.architecture=maxtext:<model> [key=value ...]`.

A MaxText model is named as in MaxText's `configs/models/<name>.yml` (the decoder blocks
`llama2`, `mistral` and `qwen3`), with MaxText's own override names (`base_num_decoder_layers=2
base_emb_dim=64 ...`), plus `model_vocab_size=N` to score only the tokenizer's first N ids of a
vocabulary padded past it (`ppl_jax.checkpoints.given.parse` reads the setting).
"""

from __future__ import annotations

from typing import Any

from ppl_jax.errors import ConfigError

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


def description(name: str, overrides: dict[str, str]) -> dict[str, Any]:
    """The ppl_jax description of a MaxText model with MaxText-named overrides.

    Raises:
      ConfigError: an unknown model name or override key, a value of the wrong type, or a
        decoder block, RoPE type, activation or window ppl_jax does not read from MaxText.
    """
    c, model_vocab = settings(name, overrides)
    _check_read(c)
    return _llama(c, model_vocab)


def settings(name: str, overrides: dict[str, str]) -> tuple[dict[str, Any], int | None]:
    """MaxText's settings of the model `name` with the `overrides` applied (each checked for
    its type and, for a size, that it is positive), and `model_vocab_size` (None: unset).

    Raises:
      ConfigError: an unknown model name or override key, a value of the wrong type, a size
        that is not positive, a `model_vocab_size` above the stored vocabulary.
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
    return c, model_vocab


def _check_read(c: dict[str, Any]) -> None:
    """Refuses a decoder block, RoPE type or activation ppl_jax does not read from MaxText."""
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


def _llama(c: dict[str, Any], model_vocab: int | None) -> dict[str, Any]:
    """The `llama` description of MaxText's settings `c` (the three decoder blocks read are
    Llama's layers, Qwen 3's with QK norm, Mistral's with a sliding window)."""
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
