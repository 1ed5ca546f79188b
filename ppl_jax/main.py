"""`ppl-jax`: evaluate a checkpoint's perplexity on a corpus. Wiring only.

    ppl-jax                                   # the demo checkpoint on held-out stdlib modules
    ppl-jax --config=configs/wikitext2.py --config.eval.seq_len=512

The config file (`--config`, default: the built-in `ppl_jax/config.py`, which `configs/default.py`
re-exports) returns an `ml_collections.ConfigDict`; `--config.a.b=value` overrides a key.
A user's mistake prints one paragraph and exits with status 2; process 0 writes the results.
"""

from __future__ import annotations

import os
import sys

from absl import app, flags, logging
from ml_collections import config_flags

DEFAULT_CONFIG = os.path.join(os.path.dirname(os.path.abspath(__file__)), "config.py")
_CONFIG = None  # the --config flag, defined by run()


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
    from ppl_jax import distributed

    distributed.initialize_from_env()

    import jax

    from ppl_jax import report
    from ppl_jax.config import Settings
    from ppl_jax.errors import Interrupted, PplJaxError
    from ppl_jax.evaluate import evaluate
    from ppl_jax.outputs import OutputDir

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
        ev = evaluate(settings, report.progress_bar(settings.progress and is_main), out)
        if out is not None:
            results = report.results_dict(ev, settings, config)
            print(report.summary_table(results))
            print(f"results: {out.write_json('results.json', results)}")
            if ev.documents is not None:
                print(f"documents: {out.write_jsonl('documents.jsonl', ev.documents)}")
            ev.recorder.discard()
    except Interrupted as e:
        if is_main:
            print(f"ppl-jax: {e}", file=sys.stderr)
        sys.exit(e.exit_code)
    except PplJaxError as e:
        print(f"ppl-jax: error: {e}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:  # before scoring began (during scoring, the journal is kept)
        print("ppl-jax: interrupted before scoring began; nothing to resume.", file=sys.stderr)
        sys.exit(130)
    finally:
        if out is not None:
            out.close()


def _bad_flags(e: Exception) -> None:
    what = (
        f"unknown config key {e}"
        if isinstance(e, (KeyError, AttributeError))
        else str(e).replace("\n", " ")
    )
    print(
        f"ppl-jax: error: bad flag, config file or config override: {what}. The config keys are "
        f"listed in README.md; --helpfull lists the flags.",
        file=sys.stderr,
    )
    sys.exit(2)


def _parse_flags(argv: list[str]) -> list[str]:
    """absl's flag parsing, with a one-paragraph error (no traceback) for a bad flag."""
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
