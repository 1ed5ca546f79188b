"""The `ppl-jax` command line: `run` is its entry point (`pyproject.toml`'s script), and
`SUBCOMMANDS` its tools (`ppl-jax help`; docs/command-line.md). Its modules import the layers
below inside the functions that need them, so that `ppl-jax --help` starts fast.
"""

from etils import epy as _epy

with _epy.lazy_api_imports(globals()):
    from ppl_jax.cli.main import SUBCOMMANDS, run

__all__ = [
    "SUBCOMMANDS",
    "run",
]
