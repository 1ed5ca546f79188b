"""The quantization of a Hugging Face checkpoint, read from `config.json`'s
`quantization_config` (`read`): which method, its parameters, and the record results.json keeps
of it (`Scheme.record`, documented in docs/outputs.md).

ppl_jax reads these methods (`quant_method`), each as transformers 5.24 names it:

- `gptq`: packed `qweight`, `qzeros`, `scales` and `g_idx` (act-order), 2, 3, 4 or 8 bits,
  `checkpoint_format` `gptq` (zero points stored minus one) or `gptq_v2`;
- `awq`: AWQ's GEMM layout (`version` `gemm`), 4 bits;
- `compressed-tensors`: `pack-quantized` (2, 4 or 8-bit integers in int32 words),
  `naive-quantized` and `int-quantized` (int8 values), `float-quantized` (float8_e4m3fn
  values), with scales per tensor, channel, group or block and optional zero points;
- `fp8`: float8_e4m3fn weights with `weight_scale_inv` per block (`weight_block_size`, DeepSeek-V3)
  or per tensor;
- `mxfp4`: GPT-OSS's experts, `*_blocks` (E2M1) and `*_scales` (E8M0) per 32 values.

Any other method (bitsandbytes, HQQ, fbgemm_fp8, ...), or a parameter these layouts do not
have, is refused in one sentence naming it. The weights are dequantized where they are read
(`ppl_jax.checkpoints.formats.dequantizing`); activations are not quantized (weight-only semantics,
docs/checkpoints.md).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from ppl_jax.errors import CheckpointError, quoted

METHODS = ("gptq", "awq", "compressed-tensors", "fp8", "mxfp4")
CT_FORMATS = ("pack-quantized", "naive-quantized", "int-quantized", "float-quantized")
CT_STRATEGIES = ("tensor", "channel", "group", "block")


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


def _fail(where: str, what: str, fix: str = "") -> CheckpointError:
    tail = f"; {fix}" if fix else ""
    return CheckpointError(f"{where}: quantization_config {what}{tail}.")


def _int(q: dict, keys: tuple[str, ...], default: Any, where: str) -> Any:
    """The first of `keys` in `q` as an int (or `default`), refusing another type."""
    value = next((q[k] for k in keys if k in q and q[k] is not None), default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise _fail(where, f"has {keys[0]}={quoted(value, 40)}, not a whole number")
    return value


def _group_size(q: dict, keys: tuple[str, ...], where: str) -> int | None:
    size = _int(q, keys, None, where)
    if size is not None and size != -1 and not 0 < size <= 1 << 20:
        raise _fail(where, f"has {keys[0]}={size}, not a size (or -1: one group per column)")
    return None if size in (None, -1) else size


def _block_shape(value: Any) -> tuple[int, int] | None:
    """`value` as a block's two sizes (a list of two whole numbers in 1..2^20), or None."""
    if (
        isinstance(value, list)
        and len(value) == 2
        and all(isinstance(b, int) and not isinstance(b, bool) and 0 < b <= 1 << 20 for b in value)
    ):
        return value[0], value[1]
    return None


def read(config: dict[str, Any], where: str) -> Scheme | None:
    """The quantization `config` (a `config.json` dict) declares, or None.

    Raises:
      CheckpointError: a method ppl_jax does not read, or a parameter outside its layouts
        (`bits` of GPTQ not in 2, 3, 4, 8; a `checkpoint_format` or AWQ `version` other than
        the ones read; an unknown compressed-tensors format or strategy; ...), naming it.
    """
    q = config.get("quantization_config")
    if q is None and isinstance(config.get("text_config"), dict):
        q = config["text_config"].get("quantization_config")
    if not q:
        return None
    if not isinstance(q, dict):
        raise _fail(where, f"is {quoted(q, 40)}, not an object")
    method = q.get("quant_method")
    if method not in METHODS:
        raise _fail(
            where,
            f"names the method {quoted(method, 40)}, which ppl_jax does not read (it reads "
            f"{', '.join(METHODS)})",
            "give a dequantized (bfloat16 or float32) copy of the model",
        )
    return {"gptq": _gptq, "awq": _awq, "compressed-tensors": _compressed, "fp8": _fp8,
            "mxfp4": _mxfp4}[method](q, where)  # fmt: skip


def _gptq(q: dict, where: str) -> Scheme:
    bits = _int(q, ("bits",), 4, where)
    if bits not in (2, 3, 4, 8):
        raise _fail(where, f"has GPTQ bits={bits}, not one of 2, 3, 4, 8")
    fmt = q.get("checkpoint_format") or q.get("format") or "gptq"
    if fmt not in ("gptq", "gptq_v2"):
        raise _fail(
            where,
            f"has the GPTQ checkpoint_format {quoted(fmt, 40)}, a kernel's layout that ppl_jax does "
            f"not read (it reads gptq and gptq_v2)",
            "save the model in the gptq format",
        )
    if q.get("dynamic"):
        raise _fail(where, "has per-module overrides (dynamic), which ppl_jax does not read")
    if q.get("pack_dtype") not in (None, "int32", "torch.int32"):
        raise _fail(
            where, f"has pack_dtype={quoted(q['pack_dtype'], 40)}; only int32 words are read"
        )
    sym = q.get("sym", True)
    w = Weights(bits, "int", bool(sym), "group", _group_size(q, ("group_size",), where))
    return Scheme("gptq", fmt, (w,), act_order=bool(q.get("desc_act", False)))


def _awq(q: dict, where: str) -> Scheme:
    bits = _int(q, ("bits", "w_bit"), 4, where)
    if bits != 4:
        raise _fail(where, f"has AWQ bits={bits}; ppl_jax reads 4-bit AWQ (autoawq's GEMM layout)")
    version = str(q.get("version") or "gemm").lower()
    if version != "gemm":
        raise _fail(
            where,
            f"has the AWQ version {quoted(q.get('version'), 40)}, a kernel's layout that ppl_jax does "
            f"not read (it reads gemm)",
        )
    size = _group_size(q, ("group_size", "q_group_size"), where)
    w = Weights(4, "int", not q.get("zero_point", True), "group", size)
    return Scheme("awq", "gemm", (w,))


def _compressed(q: dict, where: str) -> Scheme:
    status = q.get("quantization_status", "compressed")
    if status != "compressed":
        raise _fail(
            where,
            f"has quantization_status {quoted(status, 40)}: the weights are stored in full precision "
            f"with their quantization parameters beside them, which ppl_jax does not apply",
            "save the model compressed (llm-compressor's save_compressed=True)",
        )
    for key in ("sparsity_config", "transform_config"):
        if q.get(key):
            raise _fail(where, f"has a {key}, which ppl_jax does not apply")
    top = q.get("format") or "dense"
    groups = q.get("config_groups")
    if not isinstance(groups, dict) or not groups:
        raise _fail(where, "has no config_groups")
    out = []
    for name, group in groups.items():
        if not isinstance(group, dict) or not isinstance(group.get("weights"), dict):
            raise _fail(where, f"group {quoted(name, 40)} quantizes no weights")
        fmt = group.get("format") or top
        if fmt not in CT_FORMATS:
            raise _fail(
                where,
                f"has the compressed-tensors format {quoted(fmt, 40)}, which ppl_jax does not read "
                f"(it reads {', '.join(CT_FORMATS)})",
                "give a dequantized (bfloat16 or float32) copy of the model",
            )
        out.append(_ct_weights(group, fmt, f"{where}: config group {quoted(name, 40)}"))
    ignore = q.get("ignore") or ()
    if not isinstance(ignore, list | tuple) or not all(isinstance(i, str) for i in ignore):
        raise _fail(where, f"has ignore={quoted(ignore, 40)}, not a list of module names")
    formats = {g.format for g in out}
    return Scheme(
        "compressed-tensors", top if len(formats) > 1 else formats.pop(), tuple(out),
        ignore=tuple(ignore),
    )  # fmt: skip


def _ct_weights(group: dict, fmt: str, where: str) -> Weights:
    w = group["weights"]
    bits = _int(w, ("num_bits",), 8, where)
    kind = w.get("type", "int")
    strategy = w.get("strategy") or "tensor"
    if strategy not in CT_STRATEGIES:
        raise _fail(
            where, f"has the strategy {quoted(strategy, 40)} (ppl_jax reads {CT_STRATEGIES})"
        )
    good = {
        "pack-quantized": kind == "int" and bits in (2, 4, 8),
        "naive-quantized": kind == "int" and bits <= 8 or kind == "float" and bits == 8,
        "int-quantized": kind == "int" and bits <= 8,
        "float-quantized": kind == "float" and bits == 8,
    }[fmt]
    if not good or bits < 2:
        raise _fail(where, f"has {bits}-bit {quoted(kind, 40)} weights in {fmt}, a layout ppl_jax "
                           f"does not read (pack-quantized: 2, 4 or 8-bit int; float-quantized: "
                           f"8-bit float)")  # fmt: skip
    if w.get("actorder") not in (None, "weight", "static", "group", False):
        raise _fail(where, f"has actorder={quoted(w.get('actorder'), 40)}")
    size = block = None
    if strategy == "group":
        size = _int(w, ("group_size",), None, where)
        if size is None or not 0 < size <= 1 << 20:
            raise _fail(where, f"has the group strategy with group_size={quoted(size, 40)}")
    if strategy == "block":
        given = w.get("block_structure")
        block = _block_shape(given)
        if block is None:
            raise _fail(where, f"has the block strategy with block_structure={quoted(given, 40)}")
    targets = group.get("targets") or ["Linear"]
    if not isinstance(targets, list) or not all(isinstance(t, str) for t in targets):
        raise _fail(where, f"has targets={quoted(targets, 40)}, not a list of names")
    act = group.get("input_activations")
    act_bits = _int(act, ("num_bits",), None, where) if isinstance(act, dict) else None
    return Weights(bits, kind, bool(w.get("symmetric", True)), strategy, size, block, fmt,
                   tuple(targets), act_bits)  # fmt: skip


def _fp8(q: dict, where: str) -> Scheme:
    fmt = q.get("fmt", "e4m3")
    if fmt != "e4m3":
        raise _fail(where, f"has fmt={quoted(fmt, 40)}; ppl_jax reads float8_e4m3fn weights (e4m3)")
    given = q.get("weight_block_size")
    block = None if given is None else _block_shape(given)
    if given is not None and block is None:
        raise _fail(where, f"has weight_block_size={quoted(given, 40)}, not two sizes")
    w = Weights(8, "float", True, "block" if block else "tensor", None, block, "float8_e4m3fn",
                activation_bits=8)  # fmt: skip
    return Scheme("fp8", "float8_e4m3fn", (w,))


def _mxfp4(q: dict, where: str) -> Scheme:
    w = Weights(4, "float", True, "group", 32, None, "mxfp4")
    return Scheme("mxfp4", "mxfp4", (w,))
