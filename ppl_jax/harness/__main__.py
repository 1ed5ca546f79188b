"""`python -m ppl_jax.harness [lm_eval's arguments]`: lm-evaluation-harness's own command line
with the `ppl_jax` model registered, for harness versions that do not discover installed models.

    python -m ppl_jax.harness --model ppl_jax --model_args checkpoint=DIR,seq_len=2048 \\
        --tasks lambada_openai,hellaswag --batch_size 16

lm-evaluation-harness releases up to 0.4.13 find a model only in their own registry (nothing an
installed package declares is read: no entry point, and `--include_path` holds tasks only); later
ones (upstream pull request 4013) also read the `lm_eval.models` entry points of installed
packages, where ppl_jax declares `ppl_jax = ppl_jax.harness.model:PplJaxLM` (pyproject.toml), so
that plain `lm_eval --model ppl_jax` works there. Either way the arguments are the harness's;
`--model_args` are checked first (`ppl_jax.harness.arguments.check_command_line`: no weight is
read), so that a mistake is one line within seconds, not after the tasks are indexed. Several processes
(`PPL_JAX_NUM_PROCESSES` or `PPL_JAX_DISTRIBUTED=1`, as for `ppl-jax`) each run this command:
process 0 runs the harness, the others score its requests with it and exit when it ends. A
ppl_jax error prints one line and exits with status 2.
"""

from __future__ import annotations

import os
import sys

from lm_eval.__main__ import cli_evaluate

from ppl_jax.errors import PplJaxError
from ppl_jax.harness import arguments, model  # registers the model `ppl_jax`
from ppl_jax.runtime import distributed


def main(argv: list[str] | None = None) -> None:
    # lm_eval's bootstrap forks a pool, unsafe beside JAX's threads: one loop, same draws.
    os.environ.setdefault("DISABLE_MULTIPROC", "1")
    try:
        distributed.initialize_from_env()  # before any JAX call that touches devices
        sys.argv = ["lm_eval", *(sys.argv[1:] if argv is None else argv)]
        arguments.check_command_line(sys.argv[1:])  # before the harness indexes its tasks
        cli_evaluate()
    except PplJaxError as e:
        print(f"ppl-jax: error: {e}", file=sys.stderr)
        if model.COMMAND_LINE_MODELS:
            for lm in model.COMMAND_LINE_MODELS:  # the other processes stop serving and exit
                lm.close()
            sys.exit(2)  # JAX's shutdown at exit, which the others reach too
        distributed.exit_now(2)


if __name__ == "__main__":
    main()
