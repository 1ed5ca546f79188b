"""`python -m ppl_jax.convert`: kept for this release; the command is `ppl-jax convert`."""

import sys

from ppl_jax.cli.convert import main

if __name__ == "__main__":
    sys.exit(main())
