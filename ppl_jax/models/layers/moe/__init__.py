"""Mixture-of-experts layers, dropless: the grouped experts every mixture shares (`experts`),
the softmax-routed SwiGLU layer of Mixtral, Qwen-MoE and OLMoE (`dropless`: `MoeMLP` of a
`MoeSpec`), and the routed blocks of GPT-OSS, Llama 4 and DeepSeek-V3 (`routing`: `RoutedMLP` of a
`RoutedSpec`).
"""

from etils import epy as _epy

with _epy.lazy_api_imports(globals()):
    from ppl_jax.models.layers.moe.dropless import MoeMLP, MoeSpec
    from ppl_jax.models.layers.moe.routing import RoutedMLP, RoutedSpec

__all__ = ["MoeMLP", "MoeSpec", "RoutedMLP", "RoutedSpec"]
