"""`python -m ppl_jax`: the same as the `ppl-jax` command."""

from ppl_jax.cli.main import run

run()
