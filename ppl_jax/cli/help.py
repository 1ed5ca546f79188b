"""`ppl-jax --help` and one-line errors for bad flags, config files and overrides."""

from __future__ import annotations

import difflib
import os
import sys
import textwrap

from absl import flags

from ppl_jax.cli.main import SUBCOMMANDS
from ppl_jax.config.defaults import PROTOCOLS, describe_keys, flat_keys, get_config

EXAMPLES = (
    ("ppl-jax", "the demo checkpoint on held-out standard-library modules"),
    (
        "ppl-jax --config.checkpoint.dir=/models/llama-3.2-1b --config.data.path=wiki.test.raw "
        "--config.eval.seq_len=1024 --config.eval.stride=512",
        "a Hugging Face directory on a text file: windows of 1024 tokens every 512",
    ),
    (
        "ppl-jax --config.checkpoint.dir=/models/gpt2 --config.data.path=wiki.test.raw "
        "--config.data.preparation=lm_eval_wikitext --config.eval.protocol=lm_eval_rolling "
        "--config.eval.seq_len=1024 --config.output.per_document=true",
        "lm-evaluation-harness's wikitext task on the raw WikiText-2, with per-document results",
    ),
    (
        "ppl-jax --config=configs/suite_example.py:../shared/data --config.checkpoint.dir=/ckpts/run1 "
        "--config.checkpoint.step=all --config.output.tensorboard=true",
        "a suite of three datasets at every saved step, with TensorBoard scalars",
    ),
)
HELP_FLAGS = ("--help", "-h", "-?", "--helpshort", "--helpfull")


def help_text() -> str:
    """The `--help` page: usage, examples, every config key (default, meaning), the protocols."""

    def wrap(text: str, indent: str) -> str:
        return textwrap.fill(
            text, 100, initial_indent=indent, subsequent_indent=indent, break_on_hyphens=False
        )

    lines = [
        "ppl-jax: the perplexity of a language-model checkpoint on a corpus (exact, sharded JAX).",
        "",
        "usage: ppl-jax [--config=FILE] [--config.KEY=VALUE ...]",
        "",
        wrap(
            "--config names a Python file whose get_config() returns an ml_collections "
            "ConfigDict (default: the built-in ppl_jax/config/defaults.py); --config.KEY=VALUE overrides "
            "one key. Results go to <output.dir>/results.json.",
            "",
        ),
        "",
        "examples:",
    ]
    for command, meaning in EXAMPLES:
        lines += [f"  {command}", wrap(meaning, "      ")]
    lines += ["", "config keys (KEY = default):"]
    for key, default, meaning in describe_keys():
        lines += [f"  {key} = {default}", wrap(meaning, "      ")]
    lines += ["", "tools on an output folder (ppl-jax TOOL --help):"]
    lines += [f"  ppl-jax {name:<8} {meaning}" for name, meaning in SUBCOMMANDS.items()]
    lines += ["", "protocols (eval.protocol):"]
    width = max(len(name) for name in PROTOCOLS)
    lines += [f"  {name:<{width}}  {p.note}" for name, p in PROTOCOLS.items()]
    lines += [
        "",
        "docs/ explains the protocols and outputs; --helpfull also lists absl's flags.",
    ]
    return "\n".join(lines)


def help_if_asked(argv: list[str]) -> None:
    """Prints `help_text()` (and absl's flags for --helpfull) and exits 0 if argv asks for it."""
    if any(arg in HELP_FLAGS for arg in argv[1:]):
        try:
            print(help_text())
            if "--helpfull" in argv[1:]:
                print("\nall flags:\n" + flags.FLAGS.get_help())
            sys.stdout.flush()
        except BrokenPipeError:  # `ppl-jax --help | head`
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(0)


def _innermost(e: BaseException) -> str:
    """The message of `e`, unwrapped (ml_collections raises AttributeError(KeyError(msg)))."""
    text: object = e
    while isinstance(text, BaseException) and text.args:
        text = text.args[0]
    return str(text)


def bad_flags(e: Exception) -> None:
    """Prints one line for a bad flag, config file or override, and exits with status 2."""
    help_if_asked(sys.argv)  # --help wins over a mistake beside it
    what = _unknown_key(e) if isinstance(e, (KeyError, AttributeError, TypeError)) else None
    if what is None:
        what = (
            f"bad flag, config file or config override: {' '.join(_innermost(e).split())}. "
            f"ppl-jax --help lists the config keys; --helpfull all flags."
        )
    print(f"ppl-jax: error: {what}", file=sys.stderr)
    sys.exit(2)


def _unknown_key(e: Exception) -> str | None:
    """`unknown config key a.b; did you mean a.c? ...` for the override that `e` rejected.

    The overrides come from sys.argv; the keys known are the built-in config's.
    """
    rejected = _innermost(e).split("\n")[0].strip("'\" ")  # ml_collections: "'protocl'\nDid..."
    known = list(flat_keys(get_config()))
    unknown = [
        arg[len("--config.") :].split("=", 1)[0]
        for arg in sys.argv[1:]
        if arg.startswith("--config.")
    ]
    unknown = [key for key in unknown if key not in known]
    unknown = [key for key in unknown if rejected in key.split(".")] or unknown
    if not unknown:
        return None
    key = unknown[0]
    close = _same_setting(key, known) or difflib.get_close_matches(key, known, n=1, cutoff=0.6)
    guess = f"; did you mean {close[0]}?" if close else "."
    return f"unknown config key {key}{guess} ppl-jax --help lists the keys."


def _same_setting(key: str, known: list[str]) -> list[str]:
    """The known key of the same name in another section (`checkpoint.dtype` -> `model.dtype`,
    not the look-alike `checkpoint.step`): one under the same first section, else the
    shallowest, the scored model's sections first."""
    leaf = key.rsplit(".", 1)[-1]
    same = [k for k in known if k.rsplit(".", 1)[-1] == leaf]

    def rank(k: str) -> tuple:
        shared = k.split(".")[0] == key.split(".")[0]  # reference.step: reference.checkpoint.step
        main = k.split(".")[0] in _MAIN
        return (not shared, k.count("."), not main, -difflib.SequenceMatcher(None, key, k).ratio())

    return sorted(same, key=rank)[:1]


# The sections that set the scored model's run (before the diagnostics' reference, longppl).
_MAIN = ("checkpoint", "data", "eval", "model", "mesh", "output", "metrics")


def parse_flags(argv: list[str]) -> list[str]:
    """absl's flag parsing, with a one-line error (no traceback) for a bad flag, and our help."""
    help_if_asked(argv)
    try:
        return flags.FLAGS(argv)
    except (flags.Error, AttributeError, KeyError, TypeError, ValueError, OSError) as e:
        bad_flags(e)
