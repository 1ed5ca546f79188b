"""`ppl-jax`: evaluate a checkpoint's perplexity on a corpus, or run a tool on a run's folder.
Wiring only.

    ppl-jax                                   # the demo checkpoint on held-out stdlib modules
    ppl-jax --config=configs/wikitext2.py:/data/wiki.test.tokens --config.eval.seq_len=512
    ppl-jax report|compare|view|convert|inspect ...   # the tools (`ppl-jax TOOL --help`)

The config file (`--config`, default: the built-in `ppl_jax/config/defaults.py`, which
`configs/default.py` re-exports) returns an `ml_collections.ConfigDict`; `--config.a.b=value`
overrides a key. `--help` lists every config key with its default and meaning.

A reader that stops early (`ppl-jax report DIR | head -3`) ends the output quietly: a write to a
closed pipe is dropped (`PipeSafe`), so no BrokenPipeError traceback is printed and the run still
writes its files (results.json last). A word that is neither a flag nor a tool
(`ppl-jax some/dir`) is one sentence saying what ppl-jax takes.
"""

from __future__ import annotations

import difflib
import os
import sys
from typing import Any, TextIO

from ppl_jax.cli.tools import SUBCOMMANDS  # imports nothing: a tool starts without JAX
from ppl_jax.runtime import preemption

DEFAULT_CONFIG = os.path.join(os.path.dirname(os.path.dirname(__file__)), "config", "defaults.py")
_CONFIG = None  # the --config flag, defined by run()


def __getattr__(name: str) -> Any:
    # `EXAMPLES` is help's: imported on first use, so that this module (the entry point) is
    # light and installs its signal handlers before anything that takes seconds is imported.
    if name == "EXAMPLES":
        from ppl_jax.cli import help as help_lib

        return help_lib.EXAMPLES
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _tool(name: str, argv: list[str]) -> None:
    """`ppl-jax report|compare|view|convert|inspect ARGS`: each tool's `main(argv) -> exit status`."""
    from importlib import import_module

    cli = ("convert", "inspect")
    module = f"ppl_jax.cli.{name}" if name in cli else f"ppl_jax.analysis.{name}"
    sys.exit(import_module(module).main(argv))


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        unexpected(argv[1:])
    from ppl_jax.cli import job

    job.main(argv, _CONFIG)


def unexpected(words: list[str]) -> None:
    """One sentence for words on the command line that are neither flags nor a tool (absl printed
    its usage text), and exit status 2."""
    word = words[0]
    close = difflib.get_close_matches(word, list(SUBCOMMANDS), n=1, cutoff=0.7)
    if close:
        hint = f"did you mean ppl-jax {close[0]}?"
    elif os.path.isdir(word) and os.path.exists(os.path.join(word, "results.jsonl")):
        hint = f"to read that run's results: ppl-jax report {word}"
    elif os.path.isdir(word):
        hint = f"to score a checkpoint there: ppl-jax --config.checkpoint.dir={word}"
    else:
        hint = "ppl-jax --help lists the config keys and the tools"
    print(
        f"ppl-jax: error: unexpected argument {word!r}: ppl-jax takes --config=FILE and "
        f"--config.KEY=VALUE, or a tool first ({', '.join(SUBCOMMANDS)}); {hint}"
        + ("" if hint.endswith("?") else "."),
        file=sys.stderr,
    )
    sys.exit(2)


class PipeSafe:
    """A text stream whose writes to a closed pipe are dropped instead of raising
    BrokenPipeError: the first such write points the file descriptor at /dev/null (so the
    interpreter's last flush is quiet too) and later writes go nowhere. Everything else is the
    wrapped stream's."""

    def __init__(self, stream: TextIO):
        self._stream = stream
        self._closed_pipe = False

    def _dropped(self) -> None:
        self._closed_pipe = True
        try:
            os.dup2(os.open(os.devnull, os.O_WRONLY), self._stream.fileno())
        except (OSError, ValueError, AttributeError):  # no descriptor (a test's capture)
            pass

    def write(self, text: str) -> int:
        if not self._closed_pipe:
            try:
                return self._stream.write(text)
            except BrokenPipeError:
                self._dropped()
        return len(text)

    def flush(self) -> None:
        if not self._closed_pipe:
            try:
                self._stream.flush()
            except BrokenPipeError:
                self._dropped()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def run() -> None:
    """Console-script entry point. Its first instruction answers SIGTERM and SIGINT
    (`preemption.answer_at_once`: one sentence and the exit status 128 + the signal, until a
    run installs its own handlers), before anything that takes time is imported or read."""
    global _CONFIG
    preemption.answer_at_once()
    if not isinstance(sys.stdout, PipeSafe):
        sys.stdout, sys.stderr = PipeSafe(sys.stdout), PipeSafe(sys.stderr)
    if len(sys.argv) > 1 and sys.argv[1] in SUBCOMMANDS:
        _tool(sys.argv[1], sys.argv[2:])  # without help's imports (the config, the layers)
    from absl import app, flags
    from ml_collections import config_flags

    from ppl_jax.cli import help as help_lib

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
