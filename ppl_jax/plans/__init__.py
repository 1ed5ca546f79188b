"""Plans: which tokens are scored with which context. A `ProtocolSpec` (how a document is
cut into windows) and a `BatchSpec` (rows per step) turn a dataset's documents into a `Dataset`
(`plan_dataset`): `Windows` cut by a protocol into a `Plan`, packed into rows by `plan_layout`
(a `Layout`).
"""

from etils import epy as _epy

with _epy.lazy_api_imports(globals()):
    from ppl_jax.plans.layout import Layout, plan_layout
    from ppl_jax.plans.planner import Dataset, plan_dataset
    from ppl_jax.plans.protocols import Plan
    from ppl_jax.plans.spec import BatchSpec, ProtocolSpec
    from ppl_jax.plans.windows import Windows

__all__ = [
    "BatchSpec",
    "Dataset",
    "Layout",
    "Plan",
    "ProtocolSpec",
    "Windows",
    "plan_dataset",
    "plan_layout",
]
