"""The main job from the command line: the config's run, its summary and its files."""

from __future__ import annotations

import sys

from absl import app, logging

from ppl_jax.cli import help as help_lib
from ppl_jax.runtime import distributed


def main(argv: list[str], config_flag) -> None:
    """Runs `ppl_jax.evaluation.run.run` on the `--config` ConfigDict (which writes the run's
    files, results.json last, on process 0) and prints its summary; a user's mistake prints one
    line and exits with status 2."""
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
    from ppl_jax.errors import PplJaxError

    try:
        distributed.initialize_from_env()
    except PplJaxError as e:  # a PPL_JAX_* value, or a process that did not start
        print(f"ppl-jax: error: {e}", file=sys.stderr)
        sys.exit(2)
    import jax

    from ppl_jax.config.settings import from_config
    from ppl_jax.errors import Interrupted
    from ppl_jax.evaluation.run.job import run
    from ppl_jax.outputs import console
    from ppl_jax.outputs.folder import OutputDir

    logging.set_verbosity(logging.ERROR)  # Orbax's informational warnings are not for users
    is_main = jax.process_index() == 0
    try:
        config = config_flag.value
        config.checkpoint  # noqa: B018  (raises the deferred error of a config file that failed)
    except (OSError, AttributeError, KeyError) as e:
        help_lib.bad_flags(e)
    out = None
    try:
        spec = from_config(config)
        # The output folder first: a run that cannot keep its result does not start.
        out = OutputDir.open(spec.output_dir) if is_main else None
        progress = console.progress_bar(spec.progress and is_main)
        printer = print if is_main else (lambda line: None)
        found = run(spec, out, progress, printer, json_of(config))
        if out is None or found.results is None:
            return
        if not spec.is_training_run:
            print(console.summary_table(found.results))
            for line in found.files:
                print(line)
        print(f"results: {found.results_path}")
    except Interrupted as e:
        if is_main:
            print(f"ppl-jax: {e}", file=sys.stderr)
        sys.exit(e.exit_code)
    except PplJaxError as e:
        print(f"ppl-jax: error: {e}", file=sys.stderr)
        if jax.process_count() > 1:  # the others may wait in a collective: no exit barrier
            distributed.exit_now(2)
        sys.exit(2)
    finally:
        if out is not None:
            out.close()


def json_of(config) -> dict:
    """The ConfigDict as JSON (recorded in results.json)."""
    import json

    return json.loads(config.to_json_best_effort())
