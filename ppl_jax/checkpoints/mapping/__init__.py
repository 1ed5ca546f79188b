"""Mapping: the one declarative mapping from stored weight names to a model's params, and its
reading block by block.

The language (`language`: what each key of a rule means; `resolve` matches the stored names and
gives each model weight its `Source`), the rules' form and patterns (`rules`: `check_rules`), a
rule's operations on one stored tensor (`operations`: `evaluate`, and the `ReadPlan` of a
block), the reading of each device's block as the stored region it needs (`blocks`) from a
`Storage` (`storage`), the built-in mappings of other trainers' trees and a user's mapping file
(`presets`; MaxText's model descriptions, `maxtext`, beside its preset), and a reader's stored
tree read through its rules (`apply`: what every `MappedReader` gets).
"""

from etils import epy as _epy

with _epy.lazy_api_imports(globals()):
    from ppl_jax.checkpoints.mapping.apply import MappedReader
    from ppl_jax.checkpoints.mapping.language import Source, out_shape, produced, resolve
    from ppl_jax.checkpoints.mapping.operations import ReadPlan, evaluate
    from ppl_jax.checkpoints.mapping.rules import check_rules
    from ppl_jax.checkpoints.mapping.storage import Storage

__all__ = [
    "MappedReader",
    "ReadPlan",
    "Source",
    "Storage",
    "check_rules",
    "evaluate",
    "out_shape",
    "produced",
    "resolve",
]
