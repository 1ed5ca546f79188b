"""A quantized weight kept on the device as its stored blocks (`Packed`), dequantized inside the
layer that uses it, just before its product.

A `Packed` weight stands where a float weight of `layout.shape` would stand in a params tree: its
one child, `data`, is the weight's blocks laid out along the float weight's own axes, with the
axis `layout.axis` counted in blocks of `layout.block` values and one trailing axis of each
block's bytes: `[..., shape[axis] // block, ..., block_bytes] uint8`. So it is sharded over the
mesh as the float weight is (`mesh.param_shardings`: the same `PartitionSpec`, the bytes axis
whole; a block axis the mesh does not divide is replicated), and dequantizing it is local to
each device's shard: no collective (the format's dequantization keeps the blocks' axes apart:
`ppl_jax.checkpoints.quantized.rows.Rows`). The dequantized weight is then held to the float
weight's own sharding (`Layout.sharding`, which `mesh.param_shardings` sets): where the mesh
does not divide the blocks (a block wider than a device's share of a sharded axis: GPT-OSS's
MXFP4 `down`, one block of the whole `mlp` axis a row; tests/golden's DeepSeek-V3 experts, 16
wide along `mlp` in one 16 x 16 FP8 block, over a model axis of 8), the blocks are whole on
every device, and each device keeps its slice of the float weight, as it would hold a float
weight (XLA may pass a few of the blocks' bytes between devices to dequantize only that slice).
Without the constraint XLA's partitioner is free to split the products otherwise than on the
float weight (there: the experts' products computed whole on every device, where the float
weights' are split along `mlp` and their partial sums added), so the sums come in another order
(results 2e-7 apart in float32, 2e-3 in bfloat16, where a product rounds otherwise).

A layer reads it as it reads a float weight, `param[...]` (`nnx.Variable` indexes its value):
`Packed.__getitem__` dequantizes the whole weight (`layout.dequantize`, the format's own
function, bit for bit the host's dequantization) into `layout.dtype`. Under the decoders' scans
(`ppl_jax.models.decoders.stack`) a step's `lax.switch` copies one layer's blocks, and its
float weights exist only inside that step's body, so at most one layer's float weights exist
at a time. A gather (an embedding) takes the rows it needs first: `take` dequantizes only those.

The format's dequantization comes with the layout (a module-level function of the format's
reader, `ppl_jax.checkpoints.quantized.ggml.dequantize`), so this module imports no reader.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np


@dataclasses.dataclass(frozen=True)
class Layout:
    """How a `Packed` weight's blocks make its float weight (static: equal layouts trace alike).

    Attributes:
      dequantize: `(blocks [..., block_bytes] uint8, kind) -> [..., block] float32`, the
        format's dequantization of each block.
      kind: the block type, as the format names it (`Q4_K`, `Q8_0`, `MXFP4`).
      axis: the float weight's axis that the blocks run along (the first of `span` axes, merged:
        an output projection's `[heads, head_dim]` with blocks wider than a head).
      block: values per block; block_bytes: bytes per block.
      shape: the float weight's shape; dtype: its dtype name (`float32`, `bfloat16`).
      sharding: the float weight's `jax.sharding.NamedSharding` on the mesh the blocks are placed
        on (`mesh.param_shardings`), the dequantized weight's sharding
        (`jax.lax.with_sharding_constraint`); None: left to XLA (no mesh yet).
    """

    dequantize: Callable[[jax.Array, str], jax.Array]
    kind: str
    axis: int
    block: int
    block_bytes: int
    shape: tuple[int, ...]
    dtype: str
    span: int = 1
    sharding: Any = None

    @property
    def packed_shape(self) -> tuple[int, ...]:
        """The shape of `Packed.data`: `shape` with axes `axis .. axis + span - 1` merged and
        counted in blocks, then the block's bytes."""
        a, b = self.axis, self.axis + self.span
        merged = math.prod(self.shape[a:b]) // self.block
        return (*self.shape[:a], merged, *self.shape[b:], self.block_bytes)

    def packed_names(self, names: tuple[Any, ...]) -> tuple[Any, ...]:
        """The logical axis names of `Packed.data` from the float weight's `names`: the merged
        axes take their first one's, the bytes axis none."""
        return (*names[: self.axis + 1], *names[self.axis + self.span :], None)

    @property
    def nbytes(self) -> int:
        """The packed weight's bytes."""
        return math.prod(self.packed_shape)


@jax.tree_util.register_pytree_with_keys_class
class Packed:
    """A quantized weight as its blocks (see the module docstring).

    Attributes:
      data: `layout.packed_shape` uint8 (a `jax.Array`; in an abstract tree a
        `jax.ShapeDtypeStruct`, in a tree of shardings a `NamedSharding`).
      layout: the `Layout`.
    """

    def __init__(self, data: Any, layout: Layout):
        self.data, self.layout = data, layout

    def tree_flatten_with_keys(self):
        return ((jax.tree_util.GetAttrKey("data"), self.data),), self.layout

    @classmethod
    def tree_unflatten(cls, layout: Layout, children: Any) -> Packed:
        return cls(children[0], layout)

    def with_data(self, data: Any) -> Packed:
        """The same layout over other `data` (its abstract value, its sharding)."""
        return Packed(data, self.layout)

    def with_sharding(self, sharding: Any) -> Packed:
        """The same blocks, dequantized into `sharding`: the float weight's `NamedSharding`
        (`Layout.sharding`)."""
        return Packed(self.data, dataclasses.replace(self.layout, sharding=sharding))

    def __repr__(self) -> str:
        lay = self.layout
        return f"Packed({lay.kind}, shape={list(lay.shape)}, dtype={lay.dtype}, axis={lay.axis})"

    @property
    def shape(self) -> tuple[int, ...]:
        return self.layout.shape

    @property
    def dtype(self) -> np.dtype:
        return jnp.dtype(self.layout.dtype)

    @property
    def ndim(self) -> int:
        return len(self.layout.shape)

    def _float(self, data: jax.Array, shape: tuple[int, ...]) -> jax.Array:
        lay = self.layout
        values = lay.dequantize(data, lay.kind)  # [..., blocks along axis, ..., block] float32
        values = jnp.moveaxis(values, -1, lay.axis + 1).reshape(shape).astype(lay.dtype)
        # The weight as the host would have placed it: rounded to `dtype`, sharded as the float
        # weight (so the products are split as on it: the module docstring) and held there.
        # Without the barrier XLA may fuse the cast into the product and keep float32 (excess
        # precision, `xla_allow_excess_precision`): a bfloat16 model would score other numbers.
        if lay.sharding is not None:
            values = jax.lax.with_sharding_constraint(values, lay.sharding)
        return jax.lax.optimization_barrier(values)

    def value(self) -> jax.Array:
        """The float weight: `layout.shape` in `layout.dtype`."""
        return self._float(self.data, self.layout.shape)

    def __getitem__(self, key: Any) -> jax.Array:
        return self.value()[key]

    def take(self, indices: jax.Array, axis: int = 0) -> jax.Array:
        """`jnp.take(self.value(), indices, axis)`, dequantizing only the taken slices.

        Raises:
          ValueError: `axis` is the axis the blocks run along.
        """
        lay = self.layout
        axis = axis % len(lay.shape)
        if lay.axis <= axis < lay.axis + lay.span:
            raise ValueError(f"a {lay.kind} weight's blocks run along axis {axis}: take rows")
        data_axis = axis if axis < lay.axis else axis - lay.span + 1
        data = jnp.take(self.data, indices, axis=data_axis)
        shape = (*lay.shape[:axis], *jnp.shape(indices), *lay.shape[axis + 1 :])
        out_axis = lay.axis + jnp.ndim(indices) - 1 if axis < lay.axis else lay.axis
        moved = dataclasses.replace(lay, axis=out_axis, shape=shape, sharding=None)
        return Packed(data, moved).value()


def is_packed(x: Any) -> bool:
    return isinstance(x, Packed)


def take(weight: Any, indices: jax.Array, axis: int = 0) -> jax.Array:
    """`jnp.take(weight, indices, axis)` of a float weight or a `Packed` one (an `nnx.Param`'s
    value or the param itself), dequantizing only the rows taken."""
    value = weight.get_value() if hasattr(weight, "get_value") else weight
    if isinstance(value, Packed):
        return value.take(indices, axis)
    return jnp.take(value, indices, axis=axis)


def leaves(tree: Any) -> list[Any]:
    """The leaves of a params tree, a `Packed` weight as one leaf (its float `shape` and `dtype`):
    what counts parameters and dtypes."""
    return jax.tree.leaves(tree, is_leaf=is_packed)


def packed_bytes(tree: Any) -> int:
    """The bytes of the `Packed` weights of a params tree."""
    return sum(x.layout.nbytes for x in leaves(tree) if isinstance(x, Packed))
