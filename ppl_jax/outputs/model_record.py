"""What results.json keeps of the model scored (`model`), and its line in the summary.

A model is recorded from what its `LanguageModel` offers, whoever built it: its `description`
(a family's config, or an adapter's `{"family": "linen", "module": ...}`), plus

- `vocab_size` and `max_positions` (the model's own, where the description does not say them);
- `num_params`: the elements of every params leaf (`abstract_params`), whatever the dtype;
- `packed_on_device`: where quantized weights stay packed on the device
  (`checkpoint.dequantize`), how many, of which block types, and their bytes;
- `entry_point`: how it was built, where the description does not say it: the model's
  `LanguageModel.origin` (the `checkpoint.architecture` entry point `module:function` it was
  made by, or for a model made by `ppl_jax.from_linen` / `from_nnx` the adapter and the user's
  module class, `ppl_jax.from_linen(mylm.MyLM)`), else None: a family's model is named by its
  description (`family:<name>` is not an entry point). A model may name it itself with
  `description["entry_point"]`.

So a user's own model is not `linen ?L d? vocab ?` in the summary, nor only a module name in
results.json.
"""

from __future__ import annotations

import math
from typing import Any

from ppl_jax.models.layers import packed

FAMILY = "family:"  # `LanguageModel.origin` of ppl_jax's own families


def num_params(abstract_params: Any) -> int:
    """The elements of every leaf of a params tree (arrays or `jax.ShapeDtypeStruct`s; a packed
    quantized weight, `ppl_jax.models.layers.packed.Packed`, by its float shape)."""
    return int(sum(math.prod(getattr(x, "shape", ())) for x in packed.leaves(abstract_params)))


def packed_record(abstract_params: Any) -> dict[str, Any] | None:
    """The quantized weights kept packed on the device (`ppl_jax.models.layers.packed`), or
    None: `{"weights": count, "types": {block type: count}, "bytes": their packed bytes}`."""
    found = [x for x in packed.leaves(abstract_params) if packed.is_packed(x)]
    if not found:
        return None
    types: dict[str, int] = {}
    for x in found:
        types[x.layout.kind] = types.get(x.layout.kind, 0) + 1
    return {
        "weights": len(found),
        "types": dict(sorted(types.items())),
        "bytes": packed.packed_bytes(abstract_params),
    }


def model_record(model: Any) -> dict[str, Any]:
    """The `model` of results.json (see the module docstring) of `model`, a
    `ppl_jax.LanguageModel`: its description, with `vocab_size`, `max_positions`, `num_params`
    and `entry_point` added where it does not hold them (JSON-able)."""
    record = dict(model.description or {})
    record.setdefault("vocab_size", int(model.vocab_size))
    record.setdefault("max_positions", int(model.max_positions))
    record["num_params"] = num_params(model.abstract_params)
    on_device = packed_record(model.abstract_params)
    if on_device:
        record["packed_on_device"] = on_device
    if record.get("entry_point") is None:
        origin = model.origin
        record["entry_point"] = origin if origin and not origin.startswith(FAMILY) else None
    return record


def _count(n: int) -> str:
    for scale, suffix in ((1e9, "B"), (1e6, "M"), (1e3, "k")):
        if n >= scale:
            return f"{n / scale:.3g}{suffix}"
    return str(n)


def describe(record: dict[str, Any]) -> str:
    """The model in one line: `llama 16L d2048 vocab 128,256, 1.24B params` for a family, or
    `linen module MyLM(...), vocab 512, 256 positions, 98.3k params (mylm:model)` for a model
    whose description has no layers and width (an adapter's); keys it lacks are left out."""
    family = record.get("family") or "model"
    parts = []
    if "num_layers" in record and "embed_dim" in record:
        head = f"{family} {record['num_layers']}L d{record['embed_dim']}"
        if "vocab_size" in record:
            head += f" vocab {record['vocab_size']:,}"
        parts.append(head)
    else:
        module = str(record.get("module") or "")
        module = module if len(module) <= 60 else module[:57] + "..."
        parts.append(f"{family} module {module}" if module else family)
        if "vocab_size" in record:
            parts.append(f"vocab {record['vocab_size']:,}")
        if "max_positions" in record:
            parts.append(f"{record['max_positions']:,} positions")
    if record.get("num_params"):
        parts.append(f"{_count(record['num_params'])} params")
    text = ", ".join(parts)
    return text + (f" ({record['entry_point']})" if record.get("entry_point") else "")
