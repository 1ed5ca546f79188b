"""What a checkpoint is opened with (`Options`, the `checkpoint.*` settings), the dtypes its
params are read in (`DTYPES`, `dtype_of`), and the shape of a stored tree as readers give it
(`Stored`); used by every reader (`ppl_jax.checkpoints.checkpoint`)."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax.numpy as jnp

from ppl_jax.errors import ConfigError

DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}

# name -> (shape, dtype): a stored tree, as `stored` gives it and `mapping.resolve` takes it.
Stored = dict[str, tuple[tuple[int, ...], Any]]


@dataclasses.dataclass(frozen=True)
class Options:
    """The `checkpoint.*` settings a checkpoint is opened with (`open_checkpoint`'s keywords):
    `architecture`, `mapping` (a preset or a YAML/JSON file), `item` and `params` (where the
    params are inside another trainer's tree), `allow_download` (a hub id may be downloaded),
    `dequantize` (where quantized weights are dequantized: `ppl_jax.checkpoints.architecture
    .packed`)."""

    architecture: str = ""
    mapping: str = ""
    item: str = ""
    params: str = ""
    allow_download: bool = False
    dequantize: str = "auto"

    @property
    def names_a_tree(self) -> bool:
        """A mapping, item or params path was given: the tree is another trainer's."""
        return bool(self.mapping or self.item or self.params)


def dtype_of(name: str) -> Any:
    """The JAX dtype of `model.dtype` (`float32`, `bfloat16`).

    Raises:
      ConfigError: another name.
    """
    if name not in DTYPES:
        raise ConfigError(f"model.dtype={name!r} is not one of {', '.join(DTYPES)}.")
    return DTYPES[name]
