"""Metrics from sums: `Sums` (NLL in nats, tokens, bytes, words of a dataset, merged
exactly across steps and processes) and `derive` (perplexity, bits per byte, ... as `Metrics`),
beside the modules of the diagnostics: `uncertainty` (bootstrap intervals), `curves` and
`position` (NLL by context length and position), `divergence` (KL to a reference), `longppl`
(LongPPL) and `published` (published protocols' numbers).
"""

from etils import epy as _epy

with _epy.lazy_api_imports(globals()):
    from ppl_jax.metrics.sums import (
        Metrics,
        Sums,
        derive,
        gzip_bits_per_byte,
        perplexity_of_probabilities,
    )

__all__ = [
    "Metrics",
    "Sums",
    "derive",
    "gzip_bits_per_byte",
    "perplexity_of_probabilities",
]
