"""`python -m ppl_jax.convert`: kept for this release; the command is `ppl-jax convert`."""

from absl import app

from ppl_jax.cli.convert import _parse_flags, main

if __name__ == "__main__":
    app.run(main, flags_parser=_parse_flags)
