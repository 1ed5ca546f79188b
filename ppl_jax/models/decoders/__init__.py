"""Decoders: the Llama-like decoder that most families build (`llama`: `Llama`, its description
`LlamaConfig` in `llama_config`, its Hugging Face `config.json` fields and mapping rules in
`llama_hf`), the same decoder with mixture-of-experts MLPs (`llama_moe`: `MixtureLlama`), the
attention and MLP blocks of the hybrid families (`hybrid`), the LayerNorm decoder that GPT-2 and
GPT-NeoX configure (`layernorm`: `LayerNormDecoder`), and the scans that run a decoder's layers
(`stack`: `run_layers`). The families' own decoders are in `ppl_jax.models.families`.
"""

from etils import epy as _epy

with _epy.lazy_api_imports(globals()):
    from ppl_jax.models.decoders.llama import Llama, LlamaConfig
    from ppl_jax.models.decoders.llama_moe import MixtureLlama
    from ppl_jax.models.decoders.stack import run_layers

__all__ = ["Llama", "LlamaConfig", "MixtureLlama", "run_layers"]
