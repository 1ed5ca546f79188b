"""What every quantization method shares: the parsed `quantization_config` (`Scheme`, its
`Weights`), one quantized weight (`Quantized`), the checks of its stored parts (`Finder`), and
the `Method` each method's module implements (`ppl_jax.checkpoints.quantized.METHODS`).

A method owns its parsing (`Method.parse`, which refuses what its layouts do not have), the
names and shapes of its parts (`Method.parts`), its dequantization of a block on the host
(`Method.read`), and its dequantization on the device from the parts kept packed there
(`Method.device_parts`, `Method.out_axes`, `Method.dequantize_on_device`). The record
results.json keeps of a scheme is `Scheme.record` (docs/outputs.md).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, ClassVar

import jax
import numpy as np

from ppl_jax.checkpoints.mapping.storage import Storage
from ppl_jax.errors import CheckpointError, quoted

Stored = dict[str, tuple[tuple[int, ...], Any]]
FLOATS = ("F32", "F16", "BF16")
INTS = ("I32", "I64")


@dataclasses.dataclass(frozen=True)
class Weights:
    """How one group of modules' weights are quantized (compressed-tensors' `config_groups`
    entry; the single group of the other methods).

    Attributes:
      bits: bits per value; kind: `int` or `float`; symmetric: no zero points.
      strategy: `tensor`, `channel`, `group` or `block` (what a scale covers).
      group_size: values per group along the input axis (`group`), else None.
      block: the `[rows, columns]` a scale covers (`block`), else None.
      format: the stored layout (compressed-tensors' `format`).
      targets: the modules it applies to (`Linear`, or `re:` regular expressions).
      activation_bits: what the release quantizes activations to at inference (not applied).
    """

    bits: int
    kind: str = "int"
    symmetric: bool = True
    strategy: str = "group"
    group_size: int | None = None
    block: tuple[int, int] | None = None
    format: str = ""
    targets: tuple[str, ...] = ("Linear",)
    activation_bits: int | None = None


@dataclasses.dataclass(frozen=True)
class Scheme:
    """A checkpoint's quantization (see the module docstring).

    Attributes:
      method: `quant_method`.
      format: the method's layout (`gptq`/`gptq_v2`, `gemm`, compressed-tensors' format,
        `float8_e4m3fn`, `mxfp4`).
      groups: the weights' quantization, one entry per compressed-tensors config group.
      act_order: GPTQ's `desc_act` (a `g_idx` ordering the groups).
      ignore: modules left unquantized (compressed-tensors' `ignore`).
    """

    method: str
    format: str
    groups: tuple[Weights, ...]
    act_order: bool = False
    ignore: tuple[str, ...] = ()

    @property
    def weights(self) -> Weights:
        """The first (for every method but compressed-tensors, the only) group."""
        return self.groups[0]

    def record(self) -> dict[str, Any]:
        """What results.json keeps (`quantization`, docs/outputs.md): `method`, `format`,
        `bits`, `type`, `group_size`, `block_size`, `symmetric`, `act_order`,
        `activation_bits` (of the first group) and, for several compressed-tensors groups,
        `groups` (each one's bits, type, strategy, group size, block size, symmetry and
        targets)."""
        w = self.weights
        out: dict[str, Any] = {
            "method": self.method,
            "format": self.format,
            "bits": w.bits,
            "type": w.kind,
            "group_size": w.group_size,
            "block_size": list(w.block) if w.block else None,
            "symmetric": w.symmetric,
            "act_order": self.act_order,
            "activation_bits": w.activation_bits,
        }
        if len(self.groups) > 1:
            out["groups"] = [
                {"bits": g.bits, "type": g.kind, "strategy": g.strategy,
                 "group_size": g.group_size, "block_size": list(g.block) if g.block else None,
                 "symmetric": g.symmetric, "targets": list(g.targets)}
                for g in self.groups
            ]  # fmt: skip
        return out

    def describe(self) -> str:
        """One line for `ppl-jax inspect`: `gptq 4-bit, groups of 128, symmetric, act-order
        (gptq)`."""
        w = self.weights
        size = (
            f"groups of {w.group_size}" if w.group_size
            else f"blocks of {w.block[0]}x{w.block[1]}" if w.block
            else f"per {w.strategy}"
        )  # fmt: skip
        parts = [f"{self.method} {w.bits}-bit {w.kind}", size]
        parts.append("symmetric" if w.symmetric else "with zero points")
        if self.act_order:
            parts.append("act-order")
        if len(self.groups) > 1:
            parts.append(f"{len(self.groups)} config groups")
        return ", ".join(parts) + f" ({self.format})"


def fail(where: str, what: str, fix: str = "") -> CheckpointError:
    """The refusal `<where>: quantization_config <what>[; <fix>].`"""
    tail = f"; {fix}" if fix else ""
    return CheckpointError(f"{where}: quantization_config {what}{tail}.")


def whole(q: dict, keys: tuple[str, ...], default: Any, where: str) -> Any:
    """The first of `keys` in `q` as an int (or `default`), refusing another type."""
    value = next((q[k] for k in keys if k in q and q[k] is not None), default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise fail(where, f"has {keys[0]}={quoted(value, 40)}, not a whole number")
    return value


def group_size(q: dict, keys: tuple[str, ...], where: str) -> int | None:
    """The first of `keys` in `q` as a group size (None for none or -1), refusing another."""
    size = whole(q, keys, None, where)
    if size is not None and size != -1 and not 0 < size <= 1 << 20:
        raise fail(where, f"has {keys[0]}={size}, not a size (or -1: one group per column)")
    return None if size in (None, -1) else size


def block_shape(value: Any) -> tuple[int, int] | None:
    """`value` as a block's two sizes (a list of two whole numbers in 1..2^20), or None."""
    if (
        isinstance(value, list)
        and len(value) == 2
        and all(isinstance(b, int) and not isinstance(b, bool) and 0 < b <= 1 << 20 for b in value)
    ):
        return value[0], value[1]
    return None


@dataclasses.dataclass(frozen=True)
class Quantized:
    """One quantized weight, as its method's `parts` found it, and read by its method's `read`.

    Attributes:
      kind: the method's layout of it: `gptq`, `awq`, `packed` (compressed-tensors' int32
        words), `scaled` (int8 or float8 values times scales per block), `mxfp4`.
      parts: role -> stored name (`qweight`, `qzeros`, `scales`, `g_idx`; `values`, `scale`,
        `zero`; `blocks`, `scales`).
      shape: the dequantized weight's shape, Hugging Face's layout.
      dtype: the dtype (safetensors name) its reference computes it in.
      bits: bits per code.
      group: values per group along the input axis (GPTQ without `g_idx`, AWQ).
      groups: the groups the scales hold (the bound of a `g_idx`).
      block: the (rows, columns) a scale covers (`scaled`, `packed`).
      scalar: the dimensions of a scale stored as one value (per tensor: 0 or 1), else -1.
      v1: GPTQ's zero points stored minus one.
      packed_zero: compressed-tensors' zero points packed in int32 words along the output
        axis (its releases from 0.10 on), not stored as they are, the scale's shape.
    """

    kind: str
    parts: dict[str, str]
    shape: tuple[int, ...]
    dtype: str
    bits: int = 0
    group: int = 0
    groups: int = 0
    block: tuple[int, int] = (1, 1)
    scalar: int = -1
    v1: bool = False
    packed_zero: bool = False


class Finder:
    """The quantized weights of one stored tree (`run`, each found by `method.parts`), and the
    stored names they use (`used`).

    Attributes:
      scheme: the checkpoint's `Scheme`; method: its `Method`.
      stored: the stored tensors by the rules' names, (shape, safetensors dtype name).
      shown: a rules' name -> the stored name, for sentences; where: the checkpoint.
    """

    def __init__(
        self,
        scheme: Scheme,
        method: Method,
        stored: Stored,
        shown: Callable[[str], str],
        where: str,
    ):
        self.scheme, self.method, self.stored, self.shown = scheme, method, stored, shown
        self.where = where
        self.used: set[str] = set()

    def run(self) -> dict[str, Quantized]:
        """The quantized weights by the rules' names of the dequantized weights."""
        out: dict[str, Quantized] = {}
        for name in sorted(self.stored):
            got = self.method.parts(self, name)
            if got is not None:
                out[got[0]] = got[1]
        return out

    def bad(self, name: str, what: str) -> CheckpointError:
        """The refusal of the stored `name`: its dtype and shape, and `what` it must be."""
        shape, dtype = self.stored[name]
        return CheckpointError(
            f"{self.where}: the stored {self.shown(name)!r} is {dtype} of shape {list(shape)}, "
            f"but {what}; the checkpoint is damaged or not {self.scheme.method}-quantized as "
            f"its config.json says."
        )

    def part(self, name: str, needs: str, dtypes: tuple[str, ...], ndim: int | None = None):
        """The shape of the stored part `name`, its dtype and rank checked."""
        if name not in self.stored:
            raise CheckpointError(
                f"{self.where}: the quantized weight {self.shown(needs)!r} lacks its part "
                f"{self.shown(name)!r}; re-download the checkpoint."
            )
        shape, dtype = self.stored[name]
        if dtype not in dtypes or (ndim is not None and len(shape) != ndim):
            rank = f"{ndim}-dimensional " if ndim is not None else ""
            raise self.bad(
                name, f"its part of {self.shown(needs)!r} must be {rank}{'/'.join(dtypes)}"
            )
        self.used.add(name)
        return tuple(shape)

    def expect(self, name: str, shape: tuple[int, ...], want: tuple[int, ...], what: str):
        """Refuses the stored `name` unless `shape` is `want` (`what` makes it that)."""
        if tuple(shape) != tuple(want):
            raise self.bad(name, f"{what} make it {list(want)}")


class Method:
    """One quantization method (`quant_method`), one instance per method, in one module each
    (`ppl_jax.checkpoints.quantized.METHODS`).

    Attributes:
      name: its `quant_method`.
    """

    name: ClassVar[str] = ""

    def parse(self, q: dict[str, Any], where: str) -> Scheme:
        """The `Scheme` of the `quantization_config` `q` (its `quant_method` is `name`).

        Raises:
          CheckpointError: a parameter outside the method's layouts, naming it (`fail`).
        """
        raise NotImplementedError

    def parts(self, found: Finder, name: str) -> tuple[str, Quantized] | None:
        """(the dequantized weight's rules' name, its `Quantized`) where the stored `name` is
        the part that marks a quantized weight of this method, else None; its other parts
        checked against it and marked used (`found.part`).

        Raises:
          CheckpointError: a part missing, or of a dtype or shape that does not fit.
        """
        raise NotImplementedError

    def read(self, t: Quantized, storage: Storage, index: tuple[slice, ...]) -> np.ndarray:
        """The block `index` of `t` (a full index, one slice a dimension), dequantized on the
        host in `t.dtype`'s NumPy dtype from the regions of its parts it needs.

        Raises:
          CheckpointError: a part naming what its weight does not hold; as `storage.read`.
        """
        raise NotImplementedError

    def device_parts(self, t: Quantized, storage: Storage) -> dict[str, np.ndarray]:
        """The parts of `t` that a device keeps, role -> array, each read whole from `storage`
        (`storage.read(name, full index)`) and laid out once on the host so that the output
        axis of each (`out_axes`) is a plain axis: a block of output rows is a slice of it and
        a permutation of them a gather. Each method's module says its layout (packed words
        along the output axis unpacked or repacked along the input axis; block scales
        repeated to one row per output row); `g_idx`, where there is one, is checked against
        the scales and given as int32. `dequantize_on_device` takes these arrays.

        Raises:
          CheckpointError: a part naming what its weight does not hold (`g_idx`); as
            `storage.read`.
        """
        raise NotImplementedError(f"{self.name}: no device dequantization")

    def out_axes(self, t: Quantized) -> dict[str, int]:
        """The output axis of each part `device_parts` gives, role -> axis (non-negative); a
        role it does not name (`g_idx`, a scale per tensor) has none and goes whole to every
        block of output rows."""
        raise NotImplementedError(f"{self.name}: no device dequantization")

    def dequantize_on_device(self, t: Quantized, parts: dict[str, jax.Array]) -> jax.Array:
        """The weight `t` dequantized on the device, in Hugging Face's layout `t.shape` and in
        `t.dtype`, bit for bit the host's `read(t, storage, full index)` (but for subnormals
        on CPU: `packing`'s module docstring); pure and jit-able (`t` is static).

        Args:
          t: the weight, as its method's `parts` found it.
          parts: role -> the array `device_parts` gave, or a block of it: sliced or permuted
            along the output axes `out_axes` names, all parts alike, for a block of the
            weight's output rows (the result is then that block; the input axis is whole).
        """
        raise NotImplementedError(f"{self.name}: no device dequantization")
