"""Starting JAX's multi-process runtime (`jax.distributed`) when a run spans processes.

`launch/local.sh` sets `PPL_JAX_COORDINATOR` (host:port), `PPL_JAX_NUM_PROCESSES` and
`PPL_JAX_PROCESS_ID` for each local process. On a TPU pod or a SLURM/Open MPI GPU cluster, set
`PPL_JAX_DISTRIBUTED=1` instead and JAX discovers the cluster itself.
"""

from __future__ import annotations

import os

import jax


def initialize_from_env() -> bool:
    """Calls `jax.distributed.initialize` if the environment asks for several processes.

    Must run before any other JAX call that touches devices. Returns whether it initialized.
    """
    num = int(os.environ.get("PPL_JAX_NUM_PROCESSES", "1"))
    if num > 1:
        # CPU collectives across processes (real multi-process tests run on CPU).
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
        jax.distributed.initialize(
            coordinator_address=os.environ["PPL_JAX_COORDINATOR"],
            num_processes=num,
            process_id=int(os.environ["PPL_JAX_PROCESS_ID"]),
        )
        return True
    if os.environ.get("PPL_JAX_DISTRIBUTED") == "1":
        jax.distributed.initialize()
        return True
    return False
