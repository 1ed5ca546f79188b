"""The model families, one module each; `ppl_jax.models.registry` finds them (every module here
whose name does not start with `_` holds its `Family` as `FAMILY`), and its docstring says how to
add one."""
