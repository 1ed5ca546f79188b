"""`python -m ppl_jax`: the same as the `ppl-jax` command."""

from ppl_jax.main import run

run()
