"""Layers: what the decoders and families are built from, each module one kind of layer.

Attention within segments on every backend (`attention.attend`: XLA, the plain-JAX flash
attention of `flash`, the fused cuDNN and splash kernels of `fused`, blocks merged by
log-sum-exp in `split_merge`, the context axis in `context`), rotary embeddings and their scalings
(`rope`, and `qk`'s other query and key transforms), multi-head latent attention (`mla`), the
state-carrying layers (Mamba2's `ssd`, Gated DeltaNet's `gated_delta`, what they share in
`recurrence`), the mixtures of experts (`moe`), and the initialisers, norms and activations every
layer uses (`core`).
"""

from etils import epy as _epy

with _epy.lazy_api_imports(globals()):
    from ppl_jax.models.layers.attention import attend
    from ppl_jax.models.layers.core import ACTIVATIONS, layer_norm, rms_norm
    from ppl_jax.models.layers.flash import flash_attention
    from ppl_jax.models.layers.gated_delta import GatedDeltaNet
    from ppl_jax.models.layers.mla import LatentAttention
    from ppl_jax.models.layers.rope import rotary
    from ppl_jax.models.layers.ssd import Mamba2Mixer

__all__ = [
    "ACTIVATIONS",
    "GatedDeltaNet",
    "LatentAttention",
    "Mamba2Mixer",
    "attend",
    "flash_attention",
    "layer_norm",
    "rms_norm",
    "rotary",
]
