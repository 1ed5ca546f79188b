"""ppl_jax: exact, sharded language-model perplexity in JAX.

Library entry points: `ppl_jax.evaluate.evaluate` (the whole job from settings) and
`ppl_jax.evaluate.score_plan` (for a training loop holding its own params on a mesh).
"""

__version__ = "0.1.0"
