"""The command line's config: the default ConfigDict and its key meanings (`defaults`), and its
conversion into the layers' specs (`settings.from_config`), the only reader of the ConfigDict."""

from ppl_jax.config.defaults import describe_keys, get_config

__all__ = ["describe_keys", "get_config"]
