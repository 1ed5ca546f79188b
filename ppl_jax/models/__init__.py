"""Models: the interface the scorer calls (`LanguageModel`, returning `Logits` or
`HiddenStates`), the adapters of a user's Flax module (`from_nnx`, `from_linen`, `params_of_nnx`),
and the families ppl_jax builds from an architecture description (`registry`; the Llama-like
decoder `Llama` and its `LlamaConfig`, GPT-2, GPT-NeoX, mixtures of experts).
"""

from etils import epy as _epy

with _epy.lazy_api_imports(globals()):
    from ppl_jax.models.adapters import from_linen, from_nnx, params_of_nnx
    from ppl_jax.models.interface import HiddenStates, LanguageModel, Logits
    from ppl_jax.models.llama import Llama, LlamaConfig

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
