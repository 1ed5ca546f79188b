"""The runtime beneath every layer: meshes and shardings (`MeshSpec`, `make_mesh`,
`param_targets`, the logical-axis `DEFAULT_RULES`), several processes (`distributed`), a run's
fingerprint (`run_fingerprint`), preemption, paths (local or `gs://`) and temporary files.
"""

from etils import epy as _epy

with _epy.lazy_api_imports(globals()):
    from ppl_jax.runtime.fingerprint import run_fingerprint
    from ppl_jax.runtime.mesh import DEFAULT_RULES, MeshSpec, make_mesh, param_targets

__all__ = [
    "DEFAULT_RULES",
    "MeshSpec",
    "make_mesh",
    "param_targets",
    "run_fingerprint",
]
