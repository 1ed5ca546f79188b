"""ppl_jax as a model of lm-evaluation-harness (``lm_eval --model ppl_jax``); lm_eval is optional.

Nothing outside ``ppl_jax.harness`` imports this subpackage, so lm_eval stays an optional extra
(``pip install 'ppl_jax[harness]'``).
"""
