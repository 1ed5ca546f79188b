"""The model families, one module each. Not a face: `ppl_jax.models.registry` alone imports them
(every module here whose name does not start with `_` holds its `Family` as `FAMILY`, the record
of `ppl_jax.models.family`), and its docstring says how to add one; code elsewhere asks the
registry. A family whose decoder no other family builds holds it too (GPT-2's `GPT2`, GPT-NeoX's
`GPTNeoX`); the others build on `ppl_jax.models.decoders`.
"""
