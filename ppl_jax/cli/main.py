"""`ppl-jax`: evaluate a checkpoint's perplexity on a corpus. Wiring only.

    ppl-jax                                   # the demo checkpoint on held-out stdlib modules
    ppl-jax --config=configs/wikitext2.py:/data/wiki.test.tokens --config.eval.seq_len=512

The config file (`--config`, default: the built-in `ppl_jax/config/defaults.py`, which `configs/default.py`
re-exports) returns an `ml_collections.ConfigDict`; `--config.a.b=value` overrides a key.
A user's mistake prints one line and exits with status 2; process 0 writes the results.
`--help` lists every config key with its default and meaning (from `ppl_jax.config.defaults`).
"""

from __future__ import annotations

import difflib
import os
import sys
import textwrap

from absl import app, flags, logging
from ml_collections import config_flags

DEFAULT_CONFIG = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "config", "defaults.py")
_CONFIG = None  # the --config flag, defined by run()


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
    from ppl_jax.runtime import distributed

    distributed.initialize_from_env()

    import jax

    from ppl_jax.config.settings import Settings
    from ppl_jax.errors import Interrupted, PplJaxError
    from ppl_jax.evaluation import diagnostics, summary
    from ppl_jax.evaluation.job import evaluate
    from ppl_jax.metrics import uncertainty
    from ppl_jax.outputs.folder import OutputDir

    logging.set_verbosity(logging.ERROR)  # Orbax's informational warnings are not for users
    is_main = jax.process_index() == 0
    try:
        config = _CONFIG.value
        config.checkpoint  # noqa: B018  (raises the deferred error of a config file that failed)
    except (OSError, AttributeError, KeyError) as e:
        _bad_flags(e)
    out = None
    try:
        settings = Settings.from_config(config)
        # The output folder first: a run that cannot keep its result does not start.
        out = OutputDir.open(settings.output_dir) if is_main else None
        progress = summary.progress_bar(settings.progress and is_main)
        if settings.is_training_run:
            from ppl_jax.evaluation import sweep

            found = sweep.run(settings, config, out, progress, print if is_main else _quiet)
            if out is not None and found is not None:
                print(f"results: {out.write_json('results.json', found)}")
            return
        ev = evaluate(settings, progress, out)
        if out is not None:
            results = summary.results_dict(ev, settings, config)
            print(summary.summary_table(results))
            if ev.documents is not None:
                print(f"documents: {out.write_jsonl('documents.jsonl', ev.documents)}")
            out.write_bytes("units.npz", uncertainty.units_npz(ev))  # for ppl_jax.analysis.compare
            for line in diagnostics.write(out, ev.diagnostics, settings.data.name):
                print(line)
            # results.json last: once it is there, the run's files are all there.
            print(f"results: {out.write_json('results.json', results)}")
            ev.recorder.discard()
    except Interrupted as e:
        if is_main:
            print(f"ppl-jax: {e}", file=sys.stderr)
        sys.exit(e.exit_code)
    except PplJaxError as e:
        print(f"ppl-jax: error: {e}", file=sys.stderr)
        if jax.process_count() > 1:  # the others may wait in a collective: no exit barrier
            distributed.exit_now(2)
        sys.exit(2)
    except KeyboardInterrupt:  # before scoring began (during scoring, the journal is kept)
        print("ppl-jax: interrupted before scoring began; nothing to resume.", file=sys.stderr)
        sys.exit(130)
    finally:
        if out is not None:
            out.close()


def _quiet(line: str) -> None:
    """The other processes print nothing."""


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
    from ppl_jax.config.defaults import PROTOCOL_NOTES, describe_keys

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
    lines += ["", "protocols (eval.protocol):"]
    width = max(len(name) for name in PROTOCOL_NOTES)
    lines += [f"  {name:<{width}}  {note}" for name, note in PROTOCOL_NOTES.items()]
    lines += [
        "",
        "README.md explains the protocols and outputs; --helpfull also lists absl's flags.",
    ]
    return "\n".join(lines)


def _help_if_asked(argv: list[str]) -> None:
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


def _bad_flags(e: Exception) -> None:
    """Prints one line for a bad flag, config file or override, and exits with status 2."""
    _help_if_asked(sys.argv)  # --help wins over a mistake beside it
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
    from ppl_jax.config.defaults import flat_keys, get_config

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
    close = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
    guess = f"; did you mean {close[0]}?" if close else "."
    return f"unknown config key {key}{guess} ppl-jax --help lists the keys."


def _parse_flags(argv: list[str]) -> list[str]:
    """absl's flag parsing, with a one-line error (no traceback) for a bad flag, and our help."""
    _help_if_asked(argv)
    try:
        return flags.FLAGS(argv)
    except (flags.Error, AttributeError, KeyError, TypeError, ValueError, OSError) as e:
        _bad_flags(e)


def run() -> None:
    """Console-script entry point."""
    global _CONFIG
    if _CONFIG is None:
        try:  # config_flags reads the file and the overrides as soon as the flag is defined
            _CONFIG = config_flags.DEFINE_config_file(
                "config",
                DEFAULT_CONFIG,
                "Python config file returning a ConfigDict from get_config().",
                lock_config=True,
            )
        except (flags.Error, AttributeError, KeyError, TypeError, ValueError, OSError) as e:
            _bad_flags(e)
    app.run(main, flags_parser=_parse_flags)


if __name__ == "__main__":
    run()
