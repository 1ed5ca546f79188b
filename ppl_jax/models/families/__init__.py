"""The model families, one module each; `ppl_jax.models.registry` finds them (every module here
whose name does not start with `_` holds its `Family` as `FAMILY`), and its docstring says how to
add one. A family whose decoder no other family builds holds it too (GPT-2's `GPT2`, GPT-NeoX's
`GPTNeoX`); the others build on `ppl_jax.models.decoders`.
"""

from etils import epy as _epy

with _epy.lazy_api_imports(globals()):
    from ppl_jax.models.families.gpt2 import GPT2, GPT2Config
    from ppl_jax.models.families.gpt_neox import GPTNeoX, GPTNeoXConfig

__all__ = ["GPT2", "GPT2Config", "GPTNeoX", "GPTNeoXConfig"]
