"""`ppl-jax`: evaluate a checkpoint's perplexity on a corpus, or run a tool on a run's folder.
Wiring only.

    ppl-jax                                   # the demo checkpoint on held-out stdlib modules
    ppl-jax --config=configs/wikitext2.py:/data/wiki.test.tokens --config.eval.seq_len=512
    ppl-jax report|compare|view|convert|inspect ...   # the tools (`ppl-jax TOOL --help`)

The config file (`--config`, default: the built-in `ppl_jax/config/defaults.py`, which
`configs/default.py` re-exports) returns an `ml_collections.ConfigDict`; `--config.a.b=value`
overrides a key. `--help` lists every config key with its default and meaning.
"""

from __future__ import annotations

import os
import sys

from absl import app, flags
from ml_collections import config_flags

from ppl_jax.cli import help as help_lib

DEFAULT_CONFIG = os.path.join(os.path.dirname(os.path.dirname(__file__)), "config", "defaults.py")
EXAMPLES = help_lib.EXAMPLES
_CONFIG = None  # the --config flag, defined by run()


def _tool(name: str, argv: list[str]) -> None:
    """`ppl-jax report|compare|view|convert|inspect ARGS`: each tool's `main(argv) -> exit status`."""
    from importlib import import_module

    cli = ("convert", "inspect")
    module = f"ppl_jax.cli.{name}" if name in cli else f"ppl_jax.analysis.{name}"
    sys.exit(import_module(module).main(argv))


def main(argv: list[str]) -> None:
    from ppl_jax.cli import job

    job.main(argv, _CONFIG)


def run() -> None:
    """Console-script entry point."""
    global _CONFIG
    if len(sys.argv) > 1 and sys.argv[1] in help_lib.SUBCOMMANDS:
        _tool(sys.argv[1], sys.argv[2:])
    if _CONFIG is None:
        try:  # config_flags reads the file and the overrides as soon as the flag is defined
            _CONFIG = config_flags.DEFINE_config_file(
                "config",
                DEFAULT_CONFIG,
                "Python config file returning a ConfigDict from get_config().",
                lock_config=True,
            )
        except (flags.Error, AttributeError, KeyError, TypeError, ValueError, OSError) as e:
            help_lib.bad_flags(e)
    app.run(main, flags_parser=help_lib.parse_flags)


if __name__ == "__main__":
    run()
