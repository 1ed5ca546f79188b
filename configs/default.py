"""The default run: the demo checkpoint on held-out CPython standard-library modules.

Identical to the built-in default used when `--config` is omitted.
"""

from ppl_jax.config.defaults import get_config  # noqa: F401
