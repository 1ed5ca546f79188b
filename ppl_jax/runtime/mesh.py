"""The device mesh, and the mapping of logical axis names to mesh axes.

The mesh has two named axes: `data` (the batch is split over it) and `model` (weights are split
over it by the logical rules). Sharding is data: a table of `(logical name, mesh axis or None)`
pairs from the config, as in flax's lm1b `logical_axis_rules` and jax-llm-examples'
`ShardingRules`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
from jax.experimental import mesh_utils
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

from ppl_jax.errors import ConfigError

AXES = ("data", "model")


# Logical axis name -> mesh axis (or None: replicated). Weights name their dims logically
# (see `ppl_jax.models.llama`); the batch dim is `batch`.
DEFAULT_RULES = (
    ("batch", "data"),
    ("vocab", "model"),
    ("embed", None),
    ("heads", "model"),
    ("kv_heads", "model"),
    ("head_dim", None),
    ("mlp", "model"),
    ("experts", None),  # MoE experts replicated, split along mlp (ppl_jax.models.moe)
)


@dataclasses.dataclass(frozen=True)
class MeshSpec:
    """The device mesh of a run.

    Attributes:
      data: devices along the `data` axis (-1: the devices left over).
      model: devices along the `model` axis (weights sharded).
      rules: (logical axis name, mesh axis or None) pairs sharding the weights.
    """

    data: int = -1
    model: int = 1
    rules: tuple[tuple[str, str | None], ...] = DEFAULT_RULES


def make_mesh(data: int, model: int, devices: Sequence[jax.Device] | None = None) -> Mesh:
    """A `Mesh` of shape `(data, model)` over all (global) devices; `-1` takes what is left.

    Raises:
      ConfigError: a mesh that needs more devices than are present, or does not divide them.
    """
    devices = list(jax.devices() if devices is None else devices)
    n = len(devices)
    if data == -1 and model == -1:
        raise ConfigError("mesh.data and mesh.model cannot both be -1.")
    for name, size in (("mesh.data", data), ("mesh.model", model)):
        if size == 0 or size < -1:
            raise ConfigError(f"{name}={size} must be a positive size or -1.")
    if data == -1 or model == -1:
        known = model if data == -1 else data
        if n % known:
            raise ConfigError(
                f"{'mesh.model' if data == -1 else 'mesh.data'}={known} does not divide the "
                f"{n} devices present."
            )
        data, model = (n // known, model) if data == -1 else (data, n // known)
    if data * model > n:
        raise ConfigError(
            f"the mesh data={data} x model={model} needs {data * model} devices, but only {n} are "
            f"present ({jax.default_backend()}). Make the mesh smaller, or use -1 for one axis."
        )
    if data * model != n:
        raise ConfigError(
            f"the mesh data={data} x model={model} uses {data * model} of the {n} devices; "
            f"use them all (e.g. mesh.data=-1)."
        )
    mesh_devices = mesh_utils.create_device_mesh(
        (data, model), devices=devices, allow_split_physical_axes=True
    )
    return Mesh(mesh_devices, AXES, axis_types=(AxisType.Auto,) * 2)


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
    """A tree of `NamedSharding`, one per weight, from the weights' logical axis names."""
    return jax.tree.map(
        lambda a, names: NamedSharding(mesh, logical_to_spec(names, a.shape, mesh, rules)),
        abstract_params,
        logical_axes,
        is_leaf=lambda x: isinstance(x, tuple),
    )


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
    targets = jax.tree.map(
        lambda a, s: jax.ShapeDtypeStruct(a.shape, dtype or a.dtype, sharding=s),
        abstract_params,
        shardings,
    )
    return targets, shardings


def batch_sharding(mesh: Mesh) -> NamedSharding:
    """Rows split over `data`, the sequence dim whole: `PartitionSpec('data', None)`."""
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
