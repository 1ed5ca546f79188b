"""`python -m ppl_jax.report`: kept for this release; the command is `ppl-jax report`."""

import sys

from ppl_jax.analysis.report import main

if __name__ == "__main__":
    sys.exit(main())
