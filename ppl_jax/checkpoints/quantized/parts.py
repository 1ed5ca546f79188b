"""Which stored tensors of a Hugging Face checkpoint make which quantized weight, checked before
any tensor is read (`view`).

By the method of `config.json`'s `quantization_config` (`ppl_jax.checkpoints.formats.quantization`),
a quantized weight is found by its parts' names, as the format's writer names them:

- GPTQ: `<m>.qweight`, `<m>.qzeros`, `<m>.scales` and (act-order) `<m>.g_idx`; AWQ: the
  first three -> `<m>.weight [out, in]`;
- compressed-tensors: `<m>.weight_packed`, `<m>.weight_scale`, `<m>.weight_zero_point`,
  `<m>.weight_g_idx`, `<m>.weight_shape` -> `<m>.weight`; `<m>.weight` stored as int8 or
  float8_e4m3fn with `<m>.weight_scale` (and `<m>.weight_zero_point`) -> `<m>.weight`;
- FP8 (DeepSeek-V3): `<x>` stored as float8_e4m3fn with `<x>_scale_inv` -> `<x>`;
- MXFP4 (GPT-OSS): `<x>_blocks` and `<x>_scales` -> `<x>`, `[experts, in, out]`.

Each part's dtype and shape must fit the others' and the configuration's (bits, group size,
block size); a misfit is one sentence naming the stored tensor. Activation scales
(`input_scale`, `activation_scale`, `k_scale`, ...) are dropped: the weights are scored as
dequantized weights, activations in the compute dtype (docs/checkpoints.md).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Any

import re2

from ppl_jax.checkpoints.mapping.storage import Storage
from ppl_jax.checkpoints.quantized.base import Scheme, Weights
from ppl_jax.checkpoints.quantized.dequantizing import Dequantized, Quantized
from ppl_jax.errors import CheckpointError

Stored = dict[str, tuple[tuple[int, ...], Any]]
FLOATS = ("F32", "F16", "BF16")
FLOAT_DTYPES = ("F64", *FLOATS)  # what a float checkpoint may store
INTS = ("I32", "I64")
# Scales of activations, not weights: the release applies them at inference; weight-only
# semantics leave them unread.
ACTIVATION_SCALES = re.compile(
    r".*\.(input_scale|input_zero_point|input_global_scale|output_scale|output_zero_point|"
    r"activation_scale|[kvq]_scale|[kv]_zero_point)"
)
# Stored names only a quantized layout has, for the sentence when config.json names none.
MARKERS = re.compile(r".*(\.qweight|\.weight_packed|_scale_inv|_blocks)")


def view(
    scheme: Scheme | None, storage: Storage, stored: Stored, shown: Callable[[str], str], where: str
) -> tuple[Storage, Stored]:
    """The storage and stored tree the mapping rules read a quantized checkpoint through: each
    quantized weight one float tensor (its Hugging Face name, shape and the dtype its reference
    dequantizes to), read by block through `Dequantized`; its parts and the activation scales
    removed. Unchanged for a checkpoint without quantization.

    Args:
      scheme: `quantization.read` of config.json, or None.
      storage: the checkpoint's storage; stored: its tensors by the rules' names, (shape,
        safetensors dtype name); shown: a rules' name -> the stored name, for sentences.
      where: the checkpoint, for sentences.

    Raises:
      CheckpointError: a part missing or of a dtype or shape that does not fit; a quantized
        layout without quantization_config, or one without any tensor of its layout; a
        weight stored both quantized and not.
    """
    if scheme is None:
        marked = [n for n in stored if MARKERS.fullmatch(n)]
        if marked:
            raise CheckpointError(
                f"{where}: the stored {shown(marked[0])!r} is part of a quantized layout, but "
                f"config.json has no quantization_config; add the quantization_config its "
                f"quantizer wrote (quant_method, bits, group_size, ...)."
            )
        return storage, stored
    found = _Finder(scheme, stored, shown, where)
    tensors = found.run()
    if not tensors:
        raise CheckpointError(
            f"{where}: config.json's quantization_config names {scheme.method}, but no stored "
            f"tensor is in its layout; if the weights were dequantized, remove "
            f"quantization_config from config.json."
        )
    out = {
        n: v
        for n, v in stored.items()
        if n not in found.used and not ACTIVATION_SCALES.fullmatch(n)
    }
    for name, t in tensors.items():
        if name in out:
            raise CheckpointError(
                f"{where} stores {shown(name)!r} both as it is and quantized; keep one of them."
            )
        out[name] = (t.shape, t.dtype)
    return Dequantized(storage, tensors), out


def check_floats(stored: Stored, shown: Callable[[str], str], where: str) -> None:
    """Refuses stored tensors that are neither floats nor part of a quantized weight (in the
    stored tree `view` returns), naming the first.

    Raises:
      CheckpointError: naming the tensor and its dtype.
    """
    other = [n for n, (_, dtype) in stored.items() if dtype not in FLOAT_DTYPES]
    if other:
        raise CheckpointError(
            f"{where} are not all floats: {shown(other[0])!r} is {stored[other[0]][1]}, a tensor "
            f"of no quantized layout of its config.json's quantization_config (the layouts "
            f"ppl_jax reads are in docs/checkpoints.md)."
        )


class _Finder:
    """The quantized weights of one stored tree (`run`), and the stored names they use."""

    def __init__(self, scheme: Scheme, stored: Stored, shown: Callable[[str], str], where: str):
        self.scheme, self.stored, self.shown, self.where = scheme, stored, shown, where
        self.used: set[str] = set()

    def run(self) -> dict[str, Quantized]:
        method = {"gptq": self._gptq, "awq": self._awq, "compressed-tensors": self._compressed,
                  "fp8": self._fp8, "mxfp4": self._mxfp4}[self.scheme.method]  # fmt: skip
        out: dict[str, Quantized] = {}
        for name in sorted(self.stored):
            got = method(name)
            if got is not None:
                out[got[0]] = got[1]
        return out

    # ------------------------------------------------------------------ checks

    def _bad(self, name: str, what: str) -> CheckpointError:
        shape, dtype = self.stored[name]
        return CheckpointError(
            f"{self.where}: the stored {self.shown(name)!r} is {dtype} of shape {list(shape)}, "
            f"but {what}; the checkpoint is damaged or not {self.scheme.method}-quantized as "
            f"its config.json says."
        )

    def _part(self, name: str, needs: str, dtypes: tuple[str, ...], ndim: int | None = None):
        """The shape of the stored part `name`, its dtype and rank checked."""
        if name not in self.stored:
            raise CheckpointError(
                f"{self.where}: the quantized weight {self.shown(needs)!r} lacks its part "
                f"{self.shown(name)!r}; re-download the checkpoint."
            )
        shape, dtype = self.stored[name]
        if dtype not in dtypes or (ndim is not None and len(shape) != ndim):
            rank = f"{ndim}-dimensional " if ndim is not None else ""
            raise self._bad(
                name, f"its part of {self.shown(needs)!r} must be {rank}{'/'.join(dtypes)}"
            )
        self.used.add(name)
        return tuple(shape)

    def _expect(self, name: str, shape: tuple[int, ...], want: tuple[int, ...], what: str):
        if tuple(shape) != tuple(want):
            raise self._bad(name, f"{what} make it {list(want)}")

    # ------------------------------------------------------------------ layouts

    def _gptq(self, name: str):
        if not name.endswith(".qweight"):
            return None
        head, w = name[: -len("qweight")], self.scheme.weights
        bits, target = w.bits, head + "weight"
        words, out = self._part(name, target, ("I32",), 2)
        scales = self._part(head + "scales", target, FLOATS, 2)
        qzeros = self._part(head + "qzeros", target, ("I32",), 2)
        if (words * 32) % bits:
            raise self._bad(name, f"{bits}-bit codes do not fill its {words} words")
        width = words * 32 // bits
        g_idx = head + "g_idx"
        if g_idx in self.stored:
            (width,) = self._part(g_idx, target, INTS, 1)
            self._expect(name, (words, out), (math.ceil(width * bits / 32), out),
                         f"the {width} rows of {self.shown(g_idx)!r} in {bits}-bit codes")  # fmt: skip
        groups = math.ceil(width / w.group_size) if w.group_size else 1  # act-order or not
        self._expect(head + "scales", scales, (groups, out),
                     f"{width} rows in groups of {w.group_size or width}")  # fmt: skip
        self._expect(head + "qzeros", qzeros, (groups, math.ceil(out * bits / 32)),
                     f"{groups} groups of {out} {bits}-bit zero points")  # fmt: skip
        parts = {"qweight": name, "qzeros": head + "qzeros", "scales": head + "scales"}
        if g_idx in self.stored:
            parts["g_idx"] = g_idx
        return target, Quantized(
            "gptq", parts, (out, width), self.stored[head + "scales"][1], bits,
            group=w.group_size or width, groups=groups, v1=self.scheme.format == "gptq",
        )  # fmt: skip

    def _awq(self, name: str):
        if not name.endswith(".qweight"):
            return None
        head, w = name[: -len("qweight")], self.scheme.weights
        target = head + "weight"
        width, words = self._part(name, target, ("I32",), 2)
        scales = self._part(head + "scales", target, FLOATS, 2)
        qzeros = self._part(head + "qzeros", target, ("I32",), 2)
        out = scales[1]
        groups = math.ceil(width / w.group_size) if w.group_size else 1
        self._expect(name, (width, words), (width, math.ceil(out / 8)), f"{out} columns of scales")
        self._expect(head + "scales", scales, (groups, out),
                     f"{width} rows in groups of {w.group_size or width}")  # fmt: skip
        self._expect(head + "qzeros", qzeros, (groups, words), f"{groups} groups of {out} columns")
        parts = {"qweight": name, "qzeros": head + "qzeros", "scales": head + "scales"}
        return target, Quantized("awq", parts, (out, width), self.stored[head + "scales"][1], 4,
                                 group=w.group_size or width, groups=groups)  # fmt: skip

    def _weights_for(self, module: str) -> Weights:
        """The compressed-tensors config group whose targets name `module` (a `re:` pattern
        matching its stored name, or the class `Linear`)."""
        groups = self.scheme.groups
        if len(groups) == 1:
            return groups[0]
        real = self.shown(module).removesuffix(".")
        for w in groups:
            for target in w.targets:
                if target.startswith("re:"):
                    try:
                        if re2.compile(target[3:]).match(real):
                            return w
                    except re2.error:
                        raise CheckpointError(
                            f"{self.where}: quantization_config's target {target[:80]!r} is not a "
                            f"regular expression RE2 accepts."
                        ) from None
                elif target == real:
                    return w
        for w in groups:
            if "Linear" in w.targets:
                return w
        raise CheckpointError(
            f"{self.where}: no config group of quantization_config targets {real!r}, which is "
            f"stored quantized; name it in a group's targets."
        )

    def _compressed(self, name: str):
        if name.endswith(".weight_packed"):
            return self._packed(name)
        if self.stored[name][1] in ("I8", "F8_E4M3") and name + "_scale" in self.stored:
            return self._scaled(name)
        return None

    def _scale_block(self, w: Weights, shape: tuple[int, ...], scale_name: str, target: str):
        """(the block a scale covers, `scalar`) of a weight of `shape` ([..., out, in]) under
        `w`'s strategy, the stored scale's shape checked."""
        scale = self._part(scale_name, target, FLOATS)
        out, width = shape[-2:]
        if w.strategy == "tensor":
            if math.prod(scale) != 1 or len(scale) > 1:
                raise self._bad(scale_name, "a per-tensor scale is one value")
            return (out, width), len(scale)
        block = {"channel": (1, width), "group": (1, w.group_size or 1), "block": w.block}
        bh, bw = block[w.strategy]
        want = shape[:-2] + (math.ceil(out / bh), math.ceil(width / bw))
        self._expect(scale_name, scale, want, f"{w.strategy} scales of a {list(shape)} weight")
        return (bh, bw), -1

    def _packed(self, name: str):
        head = name[: -len("weight_packed")]
        target, w = head + "weight", self._weights_for(name[: -len("weight_packed")])
        out, words = self._part(name, target, ("I32",), 2)
        width = words * 32 // w.bits
        if w.strategy == "group" and w.group_size:
            scale = self.stored.get(head + "weight_scale", ((0, 0), ""))[0]
            width = min(width, scale[-1] * w.group_size) if len(scale) == 2 else width
        if w.strategy == "block":
            raise self._bad(name, "pack-quantized weights have no block scales")
        parts = {"packed": name, "scale": head + "weight_scale"}
        if head + "weight_shape" in self.stored:
            self._part(head + "weight_shape", target, INTS, 1)
        groups = 0
        if head + "weight_g_idx" in self.stored:
            (width,) = self._part(head + "weight_g_idx", target, INTS, 1)
            parts["g_idx"] = head + "weight_g_idx"
            groups = self._part(head + "weight_scale", target, FLOATS, 2)[1]
            self._expect(head + "weight_scale", self.stored[head + "weight_scale"][0],
                         (out, groups), f"{out} rows of weight_packed")  # fmt: skip
            block, scalar = (1, 1), -1
        else:
            block, scalar = self._scale_block(w, (out, width), head + "weight_scale", target)
        self._expect(name, (out, words), (out, math.ceil(width * w.bits / 32)),
                     f"{width} columns of {w.bits}-bit codes")  # fmt: skip
        packed_zero = False
        if not w.symmetric:
            zero, scale = head + "weight_zero_point", self.stored[head + "weight_scale"][0]
            shape = self._part(zero, target, ("I8", "I32", "I64"))
            packed_zero = scalar < 0 and tuple(shape) != tuple(scale)  # else as stored
            if packed_zero:
                self._expect(zero, shape, (math.ceil(out * w.bits / 32), scale[1]),
                             f"{out} rows of {w.bits}-bit zero points packed in words (or the "
                             f"scale's shape)")  # fmt: skip
                self._part(zero, target, ("I32",), 2)
            elif math.prod(shape) != math.prod(scale):
                raise self._bad(
                    zero, f"its scale {self.shown(head + 'weight_scale')!r} is {list(scale)}"
                )
            parts["zero"] = zero
        dtype = self.stored[head + "weight_scale"][1]
        return target, Quantized("packed", parts, (out, width), dtype, w.bits, groups=groups,
                                 block=block, scalar=scalar, packed_zero=packed_zero)  # fmt: skip

    def _scaled(self, name: str):
        w = self._weights_for(name.removesuffix("weight"))
        kind = "F8_E4M3" if w.kind == "float" else "I8"
        shape = self._part(name, name, (kind,))
        if len(shape) < 2:
            raise self._bad(name, "a quantized weight has at least two dimensions")
        block, scalar = self._scale_block(w, shape, name + "_scale", name)
        parts = {"values": name, "scale": name + "_scale"}
        if not w.symmetric:
            zero = name + "_zero_point"
            self._expect(zero, self._part(zero, name, ("I8", "I32", "I64")),
                         self.stored[name + "_scale"][0], "its scale's shape")  # fmt: skip
            parts["zero"] = zero
        dtype = self.stored[name + "_scale"][1]
        return name, Quantized("scaled", parts, shape, dtype, w.bits, block=block, scalar=scalar)

    def _fp8(self, name: str):
        if self.stored[name][1] != "F8_E4M3" or name + "_scale_inv" not in self.stored:
            return None
        shape = self._part(name, name, ("F8_E4M3",))
        if len(shape) < 2:
            raise self._bad(name, "a quantized weight has at least two dimensions")
        scale = self._part(name + "_scale_inv", name, FLOATS)
        block = self.scheme.weights.block
        if block is None:
            if math.prod(scale) != 1 or len(scale) > 1:
                raise self._bad(
                    name + "_scale_inv", "without weight_block_size one scale per tensor"
                )
            return name, Quantized("scaled", {"values": name, "scale": name + "_scale_inv"},
                                   shape, "F32", 8, block=shape[-2:], scalar=len(scale))  # fmt: skip
        want = shape[:-2] + tuple(math.ceil(n / b) for n, b in zip(shape[-2:], block, strict=True))
        self._expect(name + "_scale_inv", scale, want, f"blocks of {block[0]}x{block[1]}")
        parts = {"values": name, "scale": name + "_scale_inv"}
        return name, Quantized("scaled", parts, shape, "F32", 8, block=block)

    def _mxfp4(self, name: str):
        if not name.endswith("_blocks"):
            return None
        target = name[: -len("_blocks")]
        blocks = self._part(name, target, ("U8",), 4)
        scales = self._part(target + "_scales", target, ("U8",), 3)
        if blocks[-1] != 16:
            raise self._bad(name, "MXFP4 blocks hold 16 bytes (32 values)")
        self._expect(target + "_scales", scales, blocks[:-1], "one scale per block of 32")
        experts, rows, count = blocks[:3]
        parts = {"blocks": name, "scales": target + "_scales"}
        return target, Quantized("mxfp4", parts, (experts, count * 32, rows), "F32", 4)
