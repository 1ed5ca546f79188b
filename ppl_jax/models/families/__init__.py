"""The model families, one module each. Not a face: `ppl_jax.models.registry` alone imports them
(every module here whose name does not start with `_` holds its `Family` as `FAMILY`, the record
of `ppl_jax.models.family`), and its docstring says how to add one; code elsewhere asks the
registry. The families build on `ppl_jax.models.decoders` (the Llama decoder, the hybrids'
blocks, the LayerNorm decoder of GPT-2 and GPT-NeoX).
"""
