"""A declarative mapping from another trainer's stored weight names to a model's params.

A mapping is an ordered list of rules (plain data: the presets in
`ppl_jax.checkpoints.presets` and a user's YAML or JSON file have the same form). Each rule is a
dict:

- `from`: a regular expression, matched in full against a stored name (relative to the params
  subtree, a trailing NNX `/value` removed); named groups (`(?P<l>\\d+)`) are captured. The first
  rule that matches a name takes it.
- `to`: the model weight's name, a template over the captured groups and `{layer}`
  (`layers/{l}/attn/q`); a list of names for a fused tensor split in parts; `null` to leave the
  stored weight unused on purpose.
- `layers`: `{axis, stride=1, offset=0}`: the stored tensor stacks layers on `axis` (MaxText's
  scanned layers: axis 1); index `i` of that axis is layer `i * stride + offset` (`offset` an
  integer or a captured group's name: MaxText's Gemma 3 scans blocks of 6 sub-layers).
- `split`: `{axis, sizes=None, squeeze=False}`: the parts of a fused tensor along `axis` (equal
  parts, or `sizes`), in the order of the `to` list; `squeeze` drops the axis (a stack of 2).
- `transpose`: the axes' new order (NumPy's `transpose`). `reshape`: the new shape (integers or
  expressions over the architecture, `num_heads`, `-1` for one inferred dimension).
- `rope: {axis}`: head dimensions stored interleaved (pairs `2i, 2i+1`) permuted to the
  rotate-half layout ppl_jax uses (`i, i + head_dim/2`): `x[..., concat(0::2, 1::2)]`.
- `cut: axis`: a dimension padded past the model's (a vocabulary padded past the tokenizer's)
  cut to the model's size.
- `scale`: a constant factor, a number or an expression over the architecture
  (`head_dim ** 0.5` undoes MaxText's query scaling by `1/sqrt(head_dim)`).
- `plus_one: true`: a norm scale stored in the `x̂·(1+w)` form (gemma) turned into `x̂·w`.

The operations apply in that order, in float32 when a factor or `plus_one` is involved, then the
result is cast to the weight's dtype. Every stored weight must be taken by a rule and every model
weight produced exactly once: `resolve` raises one sentence naming the first unmatched names.

Reads stay sharded (`stored_sharding`): a stored tensor is restored with the sharding its model
weights have (the stacked-layer axis, a cut, a split or a permuted axis replicated), so a process
reads only the chunks of its own shards, also when one layer is sliced out of a stacked tensor.
"""

from __future__ import annotations

import ast
import dataclasses
import math
import operator
import re
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from ppl_jax.errors import CheckpointError

RULE_KEYS = {"from", "to", "layers", "split", "transpose", "reshape", "rope", "cut", "scale",
             "plus_one"}  # fmt: skip
_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
        ast.Div: operator.truediv, ast.FloorDiv: operator.floordiv, ast.Pow: operator.pow}  # fmt: skip


def evaluate(expression: Any, names: dict[str, Any], what: str) -> float:
    """A number, or an arithmetic expression (`+ - * / // **`, `sqrt(...)`, parentheses) over
    `names` (the architecture's fields, captured groups). No other code runs.

    Raises:
      CheckpointError: an unknown name or another construct, naming `what`.
    """
    if isinstance(expression, int | float) and not isinstance(expression, bool):
        return expression

    def value(node: ast.AST) -> float:
        if isinstance(node, ast.Constant) and isinstance(node.value, int | float):
            return node.value
        if isinstance(node, ast.Name) and node.id in names:
            return names[node.id]
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](value(node.left), value(node.right))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -value(node.operand)
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == "sqrt"
            and len(node.args) == 1
        ):
            return math.sqrt(value(node.args[0]))
        raise ValueError(ast.dump(node))

    try:
        return value(ast.parse(str(expression), mode="eval").body)
    except (ValueError, SyntaxError, TypeError, ZeroDivisionError):
        raise CheckpointError(
            f"{what}={expression!r} is not a number or an arithmetic expression over "
            f"{', '.join(sorted(k for k in names if isinstance(names[k], int | float)))}."
        ) from None


@dataclasses.dataclass(frozen=True)
class Source:
    """How one model weight comes from one stored tensor.

    Attributes:
      stored: the stored name (relative to the item, as `read_arrays` takes it).
      layer: the index on the stacked axis (`rule["layers"]["axis"]`), or None.
      part: the part of a split, or None.
      rule: the rule (its operations).
      scale: the factor, evaluated (1.0: none).
    """

    stored: str
    layer: int | None
    part: int | None
    rule: dict[str, Any]
    scale: float


def check_rules(rules: Any, where: str) -> list[dict[str, Any]]:
    """The rules, checked for form (keys, compilable patterns).

    Raises:
      CheckpointError: naming `where` and the first faulty rule.
    """
    if not isinstance(rules, list) or not all(isinstance(r, dict) for r in rules):
        raise CheckpointError(f"{where}: 'rules' must be a list of rules (each a mapping).")
    for n, rule in enumerate(rules):
        unknown = set(rule) - RULE_KEYS
        if "from" not in rule or "to" not in rule or unknown:
            raise CheckpointError(
                f"{where}: rule {n + 1} ({rule.get('from')!r}) needs 'from' and 'to'"
                + (f" and has unknown keys {sorted(unknown)}" if unknown else "")
                + f" (keys: {', '.join(sorted(RULE_KEYS))})."
            )
        try:
            re.compile(rule["from"])
        except re.error as e:
            raise CheckpointError(
                f"{where}: rule {n + 1}'s pattern {rule['from']!r} is not a regular expression "
                f"({e})."
            ) from None
    return rules


def _names_list(names: list[str], limit: int = 5) -> str:
    shown = ", ".join(f"'{n}'" for n in names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


def resolve(
    rules: list[dict[str, Any]],
    stored: dict[str, tuple[tuple[int, ...], Any]],
    target: dict[str, Any],
    architecture: dict[str, Any],
    where: str,
) -> dict[str, Source]:
    """Which stored tensor, layer and part each model weight comes from, shapes checked.

    Args:
      rules: as `check_rules` returns.
      stored: stored name (relative to the params subtree, `/value` removed) -> (shape, dtype).
      target: model weight name -> leaf with `.shape`.
      architecture: the architecture's fields (names for expressions).
      where: the checkpoint and mapping, for the sentences.

    Returns:
      model weight name -> `Source`.

    Raises:
      CheckpointError: one sentence naming the first stored weights no rule takes, the model
        weights no stored weight gives, a weight given twice, or a shape that does not come out.
    """
    names = {k: v for k, v in architecture.items() if isinstance(v, int | float)}
    sources: dict[str, Source] = {}
    unused: list[str] = []
    compiled = [(re.compile(r["from"]), r) for r in rules]
    for name, (shape, _) in stored.items():
        hit = next(((m, r) for p, r in compiled if (m := p.fullmatch(name))), None)
        if hit is None:
            unused.append(name)
            continue
        match, rule = hit
        if rule["to"] is None:
            continue
        groups = {k: v for k, v in match.groupdict().items() if v is not None}
        scale = float(evaluate(rule.get("scale", 1.0), {**names, **_ints(groups)}, "scale"))
        layers = [None]
        if "layers" in rule:
            spec = rule["layers"]
            axis = spec["axis"] % max(len(shape), 1)
            offset = spec.get("offset", 0)
            offset = int(groups[offset]) if isinstance(offset, str) else int(offset)
            stride = int(spec.get("stride", 1))
            layers = [(i, i * stride + offset) for i in range(shape[axis])]
        outs = rule["to"] if isinstance(rule["to"], list) else [rule["to"]]
        for layer in layers:
            fields = dict(groups)
            if layer is not None:
                fields["layer"] = layer[1]
            for part, template in enumerate(outs):
                try:
                    out = template.format(**fields)
                except (KeyError, IndexError) as e:
                    raise CheckpointError(
                        f"{where}: the rule for {rule['from']!r} names {e} in 'to' "
                        f"({template!r}), which its pattern does not capture."
                    ) from None
                if out in sources:
                    raise CheckpointError(
                        f"{where}: model weight '{out}' is given twice, by stored "
                        f"'{sources[out].stored}' and '{name}'; make the rules' patterns exclusive."
                    )
                sources[out] = Source(
                    name,
                    None if layer is None else layer[0],
                    part if isinstance(rule["to"], list) else None,
                    rule,
                    scale,
                )
    if unused:
        raise CheckpointError(
            f"{where}: no mapping rule takes the stored weight{'s' if len(unused) > 1 else ''} "
            f"{_names_list(unused)}; add a rule for them (or `to: null` to leave them unused)."
        )
    missing = [n for n in target if n not in sources]
    extra = [n for n in sources if n not in target]
    if missing or extra:
        parts = []
        if missing:
            parts.append(f"the model weights {_names_list(missing)} are given by no stored weight")
        if extra:
            parts.append(f"the mapping gives {_names_list(extra)}, which the model does not have")
        raise CheckpointError(
            f"{where}: " + "; ".join(parts) + ". Check the architecture and the mapping's 'to'."
        )
    for out, src in sources.items():
        got = out_shape(src, stored[src.stored][0], target[out].shape, names)
        if tuple(got) != tuple(target[out].shape):
            raise CheckpointError(
                f"{where}: stored '{src.stored}' {list(stored[src.stored][0])} gives "
                f"{list(got)} for model weight '{out}', which the architecture makes "
                f"{list(target[out].shape)}. Check the architecture (or the rule's operations)."
            )
    return sources


def _ints(groups: dict[str, str]) -> dict[str, int]:
    return {k: int(v) for k, v in groups.items() if v.isdigit()}


def _split_bounds(src: Source, shape: tuple[int, ...]) -> tuple[int, int, int]:
    spec = src.rule["split"]
    axis = spec["axis"] % len(shape)
    n = len(src.rule["to"])
    sizes = spec.get("sizes") or [shape[axis] // n] * n
    start = sum(sizes[: src.part])
    return axis, start, start + sizes[src.part]


def out_shape(
    src: Source, shape: tuple[int, ...], want: tuple[int, ...], names: dict[str, Any]
) -> tuple[int, ...]:
    """The shape `src`'s operations make of a stored `shape` (`want`: the model's, for `cut`)."""
    shape = list(shape)
    rule = src.rule
    if "layers" in rule:
        del shape[rule["layers"]["axis"] % len(shape)]
    if "split" in rule:
        axis, start, stop = _split_bounds(src, tuple(shape))
        shape[axis] = stop - start
        if rule["split"].get("squeeze") and shape[axis] == 1:
            del shape[axis]
    if "transpose" in rule:
        shape = [shape[a] for a in rule["transpose"]]
    if "reshape" in rule:
        new = [int(evaluate(d, names, "reshape")) for d in rule["reshape"]]
        if -1 in new:
            known = math.prod(d for d in new if d != -1)
            new[new.index(-1)] = math.prod(shape) // max(known, 1)
        shape = new
    if "cut" in rule and len(want) == len(shape):
        axis = rule["cut"] % len(shape)
        shape[axis] = min(shape[axis], want[axis])
    return tuple(shape)


def stored_sharding(src: Source, stored_shape: tuple[int, ...], sharding: Any) -> Any:
    """The sharding to restore the stored tensor with, so that each process reads only what its
    shards of the model weight need: the weight's own partition, carried back through the
    operations (a transpose permutes it; the stacked-layer, split, cut, permuted or reshaped
    axes are replicated). A sharding other than `NamedSharding` is kept as is when no axis moves.
    """
    rule = src.rule
    if not isinstance(sharding, NamedSharding):
        return sharding
    spec = list(sharding.spec) + [None] * (len(stored_shape) - len(sharding.spec))
    if "reshape" in rule:
        return NamedSharding(sharding.mesh, PartitionSpec())
    for key in ("cut",):
        if key in rule:
            spec[rule[key] % len(spec)] = None
    if "rope" in rule:
        spec[rule["rope"]["axis"] % len(spec)] = None
    if "transpose" in rule:
        back = [None] * len(rule["transpose"])
        for new, old in enumerate(rule["transpose"]):
            back[old] = spec[new]
        spec = back
    if "split" in rule:
        axis = rule["split"]["axis"] % (len(stored_shape) - ("layers" in rule))
        if rule["split"].get("squeeze"):
            spec.insert(axis, None)
        spec[axis] = None
    if "layers" in rule:
        spec.insert(rule["layers"]["axis"] % len(stored_shape), None)
    return NamedSharding(sharding.mesh, PartitionSpec(*spec[: len(stored_shape)]))


def transform(src: Source, stored: jax.Array, leaf: Any, names: dict[str, Any]) -> jax.Array:
    """The model weight `leaf` (shape, dtype, sharding) made from the restored stored tensor."""
    key = (
        repr(sorted((k, repr(v)) for k, v in src.rule.items() if k not in ("from", "to"))),
        src.part,
        src.scale,
        stored.shape,
        str(stored.dtype),
        tuple(leaf.shape),
        str(leaf.dtype),
        leaf.sharding,
    )
    fn = _compiled.get(key)
    if fn is None:
        fn = jax.jit(
            lambda x, i: _apply(src, x, i, tuple(leaf.shape), leaf.dtype, names),
            out_shardings=leaf.sharding,
        )
        _compiled[key] = fn
    return fn(stored, jnp.int32(src.layer or 0))


_compiled: dict[Any, Any] = {}


def _apply(src: Source, x: jax.Array, i: jax.Array, want: tuple[int, ...], dtype: Any, names):
    rule = src.rule
    if "layers" in rule:
        x = jax.lax.dynamic_index_in_dim(x, i, rule["layers"]["axis"] % x.ndim, keepdims=False)
    if "split" in rule:
        axis, start, stop = _split_bounds(src, x.shape)
        x = jax.lax.slice_in_dim(x, start, stop, axis=axis)
        if rule["split"].get("squeeze") and x.shape[axis] == 1:
            x = jnp.squeeze(x, axis)
    if "transpose" in rule:
        x = jnp.transpose(x, rule["transpose"])
    if "reshape" in rule:
        x = x.reshape(out_shape(dataclasses.replace(src, rule={"reshape": rule["reshape"]}),
                                x.shape, want, names))  # fmt: skip
    if "rope" in rule:
        axis = rule["rope"]["axis"] % x.ndim
        order = np.concatenate([np.arange(0, x.shape[axis], 2), np.arange(1, x.shape[axis], 2)])
        x = jnp.take(x, order, axis=axis)
    if "cut" in rule:
        axis = rule["cut"] % x.ndim
        x = jax.lax.slice_in_dim(x, 0, want[axis], axis=axis)
    if src.scale != 1.0 or rule.get("plus_one"):
        x = x.astype(jnp.float32)
        if src.scale != 1.0:
            x = x * np.float32(src.scale)
        if rule.get("plus_one"):
            x = x + 1.0
    return x.astype(dtype)
