"""Pathways on Cloud: one controller for every host of one or more TPU slices.

Under Pathways (`JAX_PLATFORMS` names `proxy`, and `JAX_BACKEND_TARGET` the proxy's gRPC
address), this program runs once, in a CPU container (the controller), and drives every device
of every slice through the IFRT proxy; the TPU hosts run Pathways' workers, not ppl_jax. So:

- there is one process: `jax.distributed.initialize` must not be called and no roll call is held
  (`start`); `jax.process_count()` is 1 and `jax.process_index()` 0, so process 0's reading of the
  data and its writing of `output.dir` are the only ones, and every device is addressable from it;
- the `proxy` backend is registered by `pathwaysutils.initialize()` (Google's `pathwaysutils`
  package, which the Pathways images carry), before any JAX call touches a device;
- a device's `memory_stats()` may be missing: read it through `memory_stats`.

Detection is by `JAX_PLATFORMS` alone, the test `pathwaysutils.is_pathways_backend_used` makes
(jax.config's `jax_platforms` starts from that variable). Untested on a real Pathways cluster: the
tests simulate it (`tests/unit/runtime/test_pathways.py`).
"""

from __future__ import annotations

import os
from typing import Any

from ppl_jax.errors import ConfigError

PLATFORM = "proxy"  # JAX's platform name for the IFRT proxy that Pathways serves


def in_use(platforms: str | None = None) -> bool:
    """Whether JAX runs under Pathways: `platforms` (default: `JAX_PLATFORMS`, a comma-separated
    list such as `proxy` or `proxy,cpu`) names `proxy`."""
    value = os.environ.get("JAX_PLATFORMS", "") if platforms is None else platforms
    return PLATFORM in (name.strip().lower() for name in value.split(","))


def start(num_processes: int) -> None:
    """Prepares this process to be Pathways' controller: registers the `proxy` backend
    (`pathwaysutils.initialize()`), and nothing else (one process: no `jax.distributed`).
    `PPL_JAX_DISTRIBUTED=1` has nothing to join here and is ignored.

    Raises:
      ConfigError: `num_processes` (`PPL_JAX_NUM_PROCESSES`) above 1, which asks for several
        controllers; or `pathwaysutils` is not installed.
    """
    platforms = os.environ.get("JAX_PLATFORMS", "")
    if num_processes > 1:
        raise ConfigError(
            f"PPL_JAX_NUM_PROCESSES={num_processes} asks for several processes, but "
            f"JAX_PLATFORMS={platforms} runs one controller for every host (Pathways); unset "
            f"PPL_JAX_NUM_PROCESSES and start one process."
        )
    try:
        import pathwaysutils
    except ImportError:
        raise ConfigError(
            f"JAX_PLATFORMS={platforms} asks for Pathways, whose proxy backend the pathwaysutils "
            f"package registers, and it is not installed; run `pip install pathwaysutils` in the "
            f"controller's image, or set JAX_PLATFORMS to tpu, gpu or cpu."
        ) from None
    pathwaysutils.initialize()


def memory_stats(device: Any) -> dict[str, int]:
    """`device.memory_stats()` (bytes: `bytes_in_use`, `peak_bytes_in_use`, `bytes_limit`, ...),
    or `{}` where the backend gives none: it returns None (CPU), or raises (a backend that does
    not implement it, such as a proxy's device may; a device object without the method)."""
    try:
        stats = device.memory_stats()
    except (AttributeError, NotImplementedError, RuntimeError, ValueError):
        return {}
    return dict(stats) if stats else {}
