"""`python -m ppl_jax.view`: kept for this release; the command is `ppl-jax view`."""

import sys

from ppl_jax.analysis.view import main

if __name__ == "__main__":
    sys.exit(main())
