"""The device mesh, and the mapping of logical axis names to mesh axes.

The mesh has three named axes: `data` (the batch's rows are split over it), `context` (each
row's tokens are split over it: `ppl_jax.models.layers.context`; size 1 unless `mesh.context` asks)
and `model` (weights are split over it by the logical rules). Sharding is data: a table of
`(logical name, mesh axis or None)` pairs from the config, as in flax's lm1b `logical_axis_rules`
and jax-llm-examples' `ShardingRules`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
from jax.experimental import mesh_utils
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

from ppl_jax.errors import ConfigError

AXES = ("data", "context", "model")
CONTEXT_ATTENTION = ("all_gather", "ring")


# Logical axis name -> mesh axis (or None: replicated). Weights name their dims logically
# (see `ppl_jax.models.decoders.llama`); the batch dim is `batch`.
DEFAULT_RULES = (
    ("batch", "data"),
    ("vocab", "model"),
    ("embed", None),
    ("heads", "model"),
    ("kv_heads", "model"),
    ("head_dim", None),
    ("mlp", "model"),
    (
        "experts",
        None,
    ),  # MoE experts replicated, split along mlp (ppl_jax.models.layers.moe.dropless)
)


@dataclasses.dataclass(frozen=True)
class MeshSpec:
    """The device mesh of a run, and how one window's work is laid out on it.

    Attributes:
      data: devices along the `data` axis (-1: the devices left over).
      model: devices along the `model` axis (weights sharded).
      rules: (logical axis name, mesh axis or None) pairs sharding the weights.
      context: devices along the `context` axis, over which each window's tokens are split
        (-1: the devices left over; 1: none).
      context_attention: how attention crosses the context axis, `all_gather` or `ring`
        (`model.context_attention`; `ppl_jax.models.layers.context.Settings`).
      token_chunk: tokens per chunk of the per-token layers on each device (`model.token_chunk`);
        0: the MLP all at once and the NLL in its own bounded chunks
        (`ppl_jax.scoring.step.nll_chunk`).

    Raises:
      ConfigError: a `context_attention` or `token_chunk` out of range.
    """

    data: int = -1
    model: int = 1
    rules: tuple[tuple[str, str | None], ...] = DEFAULT_RULES
    context: int = 1
    context_attention: str = "all_gather"
    token_chunk: int = 0

    def __post_init__(self):
        if self.context_attention not in CONTEXT_ATTENTION:
            raise ConfigError(
                f"model.context_attention={self.context_attention!r} is not one of "
                f"{', '.join(CONTEXT_ATTENTION)}."
            )
        if self.token_chunk < 0:
            raise ConfigError(
                f"model.token_chunk={self.token_chunk} must be 0 (all tokens at once) or a "
                f"number of tokens."
            )


def make_mesh(
    data: int = -1,
    model: int = 1,
    devices: Sequence[jax.Device] | None = None,
    *,
    context: int = 1,
) -> Mesh:
    """A `Mesh` of shape `(data, context, model)` over all (global) devices; `-1` takes what is
    left (for one axis at most).

    Raises:
      ConfigError: a mesh that needs more devices than are present, or does not divide them.
    """
    devices = list(jax.devices() if devices is None else devices)
    n = len(devices)
    sizes = {"mesh.data": data, "mesh.context": context, "mesh.model": model}
    for name, size in sizes.items():
        if size == 0 or size < -1:
            raise ConfigError(f"{name}={size} must be a positive size or -1.")
    free = [name for name, size in sizes.items() if size == -1]
    if len(free) > 1:
        raise ConfigError(f"{' and '.join(free)} cannot both be -1.")
    if free:
        known = math.prod(size for size in sizes.values() if size != -1)
        if n % known:
            others = " x ".join(f"{k}={v}" for k, v in sizes.items() if v != -1)
            raise ConfigError(f"{others} does not divide the {n} devices present.")
        sizes[free[0]] = n // known
    data, context, model = sizes.values()
    shape = f"data={data} x " + (f"context={context} x " if context > 1 else "") + f"model={model}"
    if data * context * model > n:
        raise ConfigError(
            f"the mesh {shape} needs {data * context * model} devices, but only {n} are present "
            f"({jax.default_backend()}). Make the mesh smaller, or use -1 for one axis."
        )
    if data * context * model != n:
        raise ConfigError(
            f"the mesh {shape} uses {data * context * model} of the {n} devices; use them all "
            f"(e.g. mesh.data=-1)."
        )
    mesh_devices = mesh_utils.create_device_mesh(
        (data, context, model), devices=devices, allow_split_physical_axes=True
    )
    return Mesh(mesh_devices, AXES, axis_types=(AxisType.Auto,) * 3)


def logical_to_spec(
    logical: Sequence[str | None],
    shape: Sequence[int],
    mesh: Mesh,
    rules: Sequence[tuple[str, str | None]],
) -> PartitionSpec:
    """The `PartitionSpec` of an array whose dims carry these logical names.

    A logical name absent from the rules is replicated. A dim that the mesh axis does not divide
    evenly is replicated (e.g. 2 KV heads on a 4-way `model` axis).

    Raises:
      ConfigError: two dims of one array mapped to the same mesh axis.
    """
    table = dict(rules)
    spec: list[str | None] = []
    for name, size in zip(logical, shape, strict=True):
        axis = table.get(name) if name is not None else None
        if axis is not None and axis not in mesh.shape:
            raise ConfigError(f"mesh.rules maps {name!r} to {axis!r}, which is not a mesh axis.")
        if axis is not None and axis in spec:
            raise ConfigError(
                f"mesh.rules map two dims of one weight ({tuple(logical)}) to mesh axis "
                f"{axis!r}; map one of them elsewhere."
            )
        if axis is not None and size % mesh.shape[axis]:
            axis = None
        spec.append(axis)
    return PartitionSpec(*spec)


def param_shardings(
    abstract_params: Any, logical_axes: Any, mesh: Mesh, rules: Sequence[tuple[str, str | None]]
) -> Any:
    """A tree of `NamedSharding`, one per weight, from the weights' logical axis names. A packed
    quantized weight (`ppl_jax.models.layers.packed.Packed`: a leaf with a `layout`) is sharded as
    its float weight, its blocks' bytes axis whole (a block axis the mesh does not divide
    replicated), and carries its float weight's sharding, which its dequantized weight takes
    (`Layout.sharding`)."""

    def sharding(a, names):
        floats = NamedSharding(mesh, logical_to_spec(names, a.shape, mesh, rules))
        if _packed(a):
            shape = a.layout.packed_shape
            spec = logical_to_spec(a.layout.packed_names(tuple(names)), shape, mesh, rules)
            return a.with_data(NamedSharding(mesh, spec)).with_sharding(floats)
        return floats

    return jax.tree.map(
        sharding,
        abstract_params,
        logical_axes,
        is_leaf=lambda x: isinstance(x, tuple) or _packed(x),
    )


def _packed(x: Any) -> bool:
    """A packed quantized weight (`ppl_jax.models.layers.packed.Packed`, known by its `layout`:
    this layer sits below the models)."""
    return hasattr(x, "layout") and hasattr(x, "with_data")


def placed(abstract_params: Any, shardings: Any, dtype: Any = None) -> Any:
    """`abstract_params` as a tree of `jax.ShapeDtypeStruct(shape, dtype, sharding=...)` with
    `shardings` (a tree `param_shardings` made), `dtype` replacing each param's own dtype when
    given. A packed weight's blocks keep their bytes (`dtype` is the model's, as its layout
    says), and its layout is the one in `shardings` (with the float weight's sharding)."""

    def target(a, s):
        if _packed(a):
            return s.with_data(jax.ShapeDtypeStruct(a.data.shape, a.data.dtype, sharding=s.data))
        return jax.ShapeDtypeStruct(a.shape, dtype or a.dtype, sharding=s)

    return jax.tree.map(target, abstract_params, shardings, is_leaf=_packed)


def param_targets(
    abstract_params: Any,
    logical_axes: Any,
    mesh: Mesh,
    rules: Sequence[tuple[str, str | None]],
    dtype: Any = None,
) -> tuple[Any, Any]:
    """Restore targets for a model's params on `mesh`.

    Returns:
      (a tree of `jax.ShapeDtypeStruct(shape, dtype, sharding=...)`, the tree of shardings), with
      `dtype` replacing each param's own dtype when given.
    """
    shardings = param_shardings(abstract_params, logical_axes, mesh, rules)
    return placed(abstract_params, shardings, dtype), shardings


def batch_sharding(mesh: Mesh) -> NamedSharding:
    """Rows split over `data`, the sequence dim whole: `PartitionSpec('data', None)` (the
    scorer splits the tokens over `context` itself, after reordering them)."""
    return NamedSharding(mesh, PartitionSpec("data", None))


def replicated(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, PartitionSpec())


def local_rows(sharding: NamedSharding, global_shape: tuple[int, ...]) -> np.ndarray:
    """The global batch rows whose data this process must supply for `sharding`.

    Returns:
      A sorted `[rows] int` array; it is one contiguous block on meshes made by `make_mesh`.
    """
    rows: set[int] = set()
    for index in sharding.addressable_devices_indices_map(global_shape).values():
        rows.update(range(global_shape[0])[index[0]])
    return np.array(sorted(rows), dtype=np.int64)
