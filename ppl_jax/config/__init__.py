"""The command line's config: the default ConfigDict and its key meanings (`get_config`,
`describe_keys`; `defaults`), its conversion into the layers' specs (`from_config`; `settings`, the
only reader of the ConfigDict), and the demo's checkpoint and held-out corpus
(`demo_checkpoint_dir`, `held_out_paths`: the `HELD_OUT_MODULES` of the standard library, shipped).
"""

from etils import epy as _epy

with _epy.lazy_api_imports(globals()):
    from ppl_jax.config.defaults import (
        HELD_OUT_MODULES,
        demo_checkpoint_dir,
        describe_keys,
        get_config,
        held_out_paths,
    )
    from ppl_jax.config.settings import from_config

__all__ = [
    "HELD_OUT_MODULES",
    "demo_checkpoint_dir",
    "describe_keys",
    "from_config",
    "get_config",
    "held_out_paths",
]
