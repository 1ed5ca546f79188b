"""Models: the interface the scorer calls (`LanguageModel`, returning `Logits` or
`HiddenStates`), the adapters of a user's Flax module (`from_nnx`, `from_linen`, `params_of_nnx`),
and the families ppl_jax builds from an architecture description (`registry`).

Three rooms hold what the families are built of: `layers` (attention, rotary embeddings, the
state-carrying layers, the mixtures of experts in `layers.moe`, norms), `decoders` (the
Llama-like decoder `Llama` and its `LlamaConfig`, its mixture-of-experts form, the hybrid blocks,
the layer scans) and `families` (one module per family, found by the registry).
"""

from etils import epy as _epy

with _epy.lazy_api_imports(globals()):
    from ppl_jax.models.adapters import from_linen, from_nnx, params_of_nnx
    from ppl_jax.models.decoders import Llama, LlamaConfig
    from ppl_jax.models.interface import HiddenStates, LanguageModel, Logits

__all__ = [
    "HiddenStates",
    "LanguageModel",
    "Llama",
    "LlamaConfig",
    "Logits",
    "from_linen",
    "from_nnx",
    "params_of_nnx",
]
