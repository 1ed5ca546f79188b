"""`python -m ppl_jax.compare`: kept for this release; the command is `ppl-jax compare`."""

import sys

from ppl_jax.analysis.compare import main

if __name__ == "__main__":
    sys.exit(main())
