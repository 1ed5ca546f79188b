"""A mapping rule's operations on one stored tensor (`ppl_jax.checkpoints.mapping.language` says
what each means), as a `ReadPlan`: the shape they make, the stored region a block of the model
weight needs, and the operations applied to that region alone.

A block is read as a box: a NumPy array together with the stored (or intermediate) indices where
it starts on each axis. `ReadPlan.region` carries a model weight's block back through the operations
to the smallest box of the stored tensor that holds it (a contiguous range per axis: a transposed
`[out, in]` projection sharded over heads reads only its heads' rows; a split or cut shifts or
clips the range; a `reshape` or `view` that splits an axis keeps it narrow, one that merges axes,
and `rope`, read them whole); `ReadPlan.apply` then runs the operations forward on the box. The same
code makes a whole tensor (a box of everything), so every storage reads through it alike.
"""

from __future__ import annotations

import ast
import dataclasses
import math
import operator
from typing import Any

import numpy as np

from ppl_jax.errors import CheckpointError

_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
        ast.Div: operator.truediv, ast.FloorDiv: operator.floordiv, ast.Pow: operator.pow}  # fmt: skip
_MAX_EXPRESSION = 200  # characters of an expression


def evaluate(expression: Any, names: dict[str, Any], what: str) -> float:
    """A number, or an arithmetic expression (`+ - * / // **`, `sqrt(...)`, parentheses) over
    `names` (the architecture's fields, captured groups). No other code runs.

    Raises:
      CheckpointError: an unknown name, another construct, or a result that is not a finite
        number, naming `what`.
    """
    if isinstance(expression, int | float) and not isinstance(expression, bool):
        return expression

    def value(node: ast.AST) -> float:
        if isinstance(node, ast.Constant) and isinstance(node.value, int | float):
            return node.value
        if isinstance(node, ast.Name) and node.id in names:
            return names[node.id]
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            left, right = value(node.left), value(node.right)
            if isinstance(node.op, ast.Pow) and abs(right) > 64:
                raise ValueError("exponent")  # 10 ** 10 ** 10 would run for hours
            return _OPS[type(node.op)](left, right)
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
        if not isinstance(expression, str) or len(expression) > _MAX_EXPRESSION:
            raise ValueError(expression)
        result = value(ast.parse(expression, mode="eval").body)
        if not math.isfinite(result):
            raise ValueError(result)
        return result
    except (ValueError, SyntaxError, TypeError, ZeroDivisionError, OverflowError, RecursionError):
        raise CheckpointError(
            f"{what}={str(expression)[:60]!r} is not a number or an arithmetic expression over "
            f"{', '.join(sorted(k for k in names if isinstance(names[k], int | float)))}."
        ) from None


Ranges = tuple[range, ...]


def _blocks(old: tuple[int, ...], new: tuple[int, ...]) -> list[tuple[range, range]]:
    """The smallest groups (old axes, new axes) of equal sizes that a reshape maps onto each
    other (the shapes have the same number of elements)."""
    out, i, j = [], 0, 0
    while i < len(old) or j < len(new):
        oi, nj, po, pn = i, j, 1, 1
        if i < len(old):
            po, i = po * old[i], i + 1
        if j < len(new):
            pn, j = pn * new[j], j + 1
        while po != pn:
            if po < pn and i < len(old):
                po, i = po * old[i], i + 1
            elif j < len(new):
                pn, j = pn * new[j], j + 1
            else:
                raise ValueError("sizes")
        out.append((range(oi, i), range(nj, j)))
    return out


def _cut(x: np.ndarray, axis: int, start: int, stop: int) -> np.ndarray:
    return x[(slice(None),) * axis + (slice(start, stop),)]


@dataclasses.dataclass(frozen=True)
class _Step:
    kind: str  # take, reshape, split, transpose, rope, cut
    before: tuple[int, ...]  # the shape the step takes
    after: tuple[int, ...]  # the shape it makes
    arg: Any = None

    def back(self, r: Ranges) -> Ranges:
        """The ranges of `before` that make the ranges `r` of `after`."""
        k, a = self.kind, self.arg
        if k == "take":
            return r[: a[0]] + (range(a[1], a[1] + 1),) + r[a[0] :]
        if k == "split":
            axis, start, _, squeeze = a
            got = (
                range(start, start + 1)
                if squeeze
                else range(start + r[axis].start, start + r[axis].stop)
            )
            return r[:axis] + (got,) + r[axis + (0 if squeeze else 1) :]
        if k == "transpose":
            out = [None] * len(a)
            for new, old in enumerate(a):
                out[old] = r[new]
            return tuple(out)
        if k == "rope":
            return r[:a] + (range(self.before[a]),) + r[a + 1 :]
        if k == "cut":
            return r
        out = [range(n) for n in self.before]  # reshape
        for olds, news in _blocks(self.before, self.after):
            if len(olds) == 1 and news:  # a split axis: the rows of its first new dim's range
                inner = math.prod(self.after[n] for n in news[1:])
                first = r[news[0]]
                out[olds[0]] = range(first.start * inner, first.stop * inner)
            elif len(news) == 1 and len(olds) > 1:  # merged axes: whole rows of the first one
                inner = math.prod(self.before[o] for o in olds[1:])
                got = r[news[0]]
                if got.start % inner == 0 and got.stop % inner == 0:
                    out[olds[0]] = range(got.start // inner, got.stop // inner)
        return tuple(out)

    def forward(self, x: np.ndarray, origin: tuple[int, ...]) -> tuple[np.ndarray, tuple[int, ...]]:
        """The box `x` (at `origin` of `before`) as a box of `after`."""
        k, a = self.kind, self.arg
        if k == "take":
            axis, i = a
            index = (slice(None),) * axis + (i - origin[axis],)
            return x[index], origin[:axis] + origin[axis + 1 :]
        if k == "split":
            axis, start, stop, squeeze = a
            lo, hi = max(start, origin[axis]), min(stop, origin[axis] + x.shape[axis])
            x = _cut(x, axis, lo - origin[axis], hi - origin[axis])
            if squeeze:
                return np.squeeze(x, axis), origin[:axis] + origin[axis + 1 :]
            return x, origin[:axis] + (lo - start,) + origin[axis + 1 :]
        if k == "transpose":
            return np.transpose(x, a), tuple(origin[i] for i in a)
        if k == "rope":
            order = np.concatenate([np.arange(0, x.shape[a], 2), np.arange(1, x.shape[a], 2)])
            return np.take(x, order, axis=a), origin
        if k == "cut":
            axis, n = a
            keep = max(0, min(n, origin[axis] + x.shape[axis]) - origin[axis])
            return _cut(x, axis, 0, keep), origin
        shape, new_origin = list(self.after), [0] * len(self.after)  # reshape
        for olds, news in _blocks(self.before, self.after):
            if all(x.shape[o] == self.before[o] for o in olds):
                continue
            if len(olds) == 1:
                inner = math.prod(self.after[n] for n in news[1:])
                shape[news[0]] = x.shape[olds[0]] // inner
                new_origin[news[0]] = origin[olds[0]] // inner
            else:
                inner = math.prod(self.before[o] for o in olds[1:])
                shape[news[0]] = x.shape[olds[0]] * inner
                new_origin[news[0]] = origin[olds[0]] * inner
        return x.reshape(shape), tuple(new_origin)


@dataclasses.dataclass(frozen=True)
class ReadPlan:
    """The operations of one stored tensor's rule (see the module docstring).

    Attributes:
      stored: the stored tensor's shape.
      shape: the shape the operations make.
    """

    stored: tuple[int, ...]
    shape: tuple[int, ...]
    steps: tuple[_Step, ...]

    def region(self, block: Ranges) -> Ranges:
        """The stored ranges that hold the ranges `block` of the result."""
        for step in reversed(self.steps):
            block = step.back(block)
        return block

    def apply(self, x: np.ndarray, origin: tuple[int, ...], block: Ranges) -> np.ndarray:
        """The block `block` of the result, from the stored box `x` at `origin` (which holds
        `region(block)`)."""
        for step in self.steps:
            x, origin = step.forward(x, origin)
        index = tuple(slice(r.start - o, r.stop - o) for r, o in zip(block, origin, strict=True))
        return x[index]


def _axis(axis: int, shape: tuple[int, ...], key: str) -> int:
    """`axis` of `shape` (negative from the end), or ValueError."""
    if not -len(shape) <= axis < len(shape):
        raise ValueError(f"{key} axis {axis} of {len(shape)} axes")
    return axis % len(shape)


def plan(src: Any, stored_shape: tuple[int, ...], want: tuple[int, ...], names: dict) -> ReadPlan:
    """The `ReadPlan` of a `mapping.Source` (one stored tensor, its layer and part) for a stored
    tensor of `stored_shape` (`want`: the model weight's shape without a `stack` axis, for `cut`).

    Raises:
      CheckpointError: operations that do not fit the stored shape, naming the rule.
    """
    rule, shape, steps = src.rule, tuple(int(n) for n in stored_shape), []

    def add(kind, after, arg=None):
        nonlocal shape
        steps.append(_Step(kind, shape, tuple(after), arg))
        shape = tuple(after)

    def sizes(key):
        out = [int(evaluate(d, names, key)) for d in rule[key]]
        known = math.prod(d for d in out if d != -1)
        if (
            out.count(-1) > 1
            or any(d < -1 or d == 0 for d in out)
            or (-1 in out and math.prod(shape) % known)
            or (-1 not in out and known != math.prod(shape))
        ):
            raise ValueError(f"{key} {out} cannot hold {list(shape)}")
        if -1 in out:
            out[out.index(-1)] = math.prod(shape) // known
        return out

    try:
        if "layers" in rule:
            axis = _axis(rule["layers"]["axis"], shape, "layers")
            add("take", shape[:axis] + shape[axis + 1 :], (axis, src.layer))
        if "view" in rule:
            add("reshape", sizes("view"))
        if "split" in rule:
            spec = rule["split"]
            axis, n = _axis(spec["axis"], shape, "split"), len(rule["to"])
            parts = [int(evaluate(s, names, "sizes")) for s in spec.get("sizes") or []]
            parts = parts or [shape[axis] // n] * n
            if sum(parts) != shape[axis] or min(parts) < 1:
                raise ValueError(f"split {parts} of {shape[axis]}")
            start = sum(parts[: src.part])
            size = parts[src.part]
            squeeze = bool(spec.get("squeeze")) and size == 1
            after = list(shape)
            if squeeze:
                del after[axis]
            else:
                after[axis] = size
            add("split", after, (axis, start, start + size, squeeze))
        if "transpose" in rule:
            perm = tuple(rule["transpose"])
            if len(perm) != len(shape):
                raise ValueError(f"transpose {list(perm)} of {len(shape)} axes")
            add("transpose", [shape[a] for a in perm], perm)
        if "reshape" in rule:
            add("reshape", sizes("reshape"))
        if "rope" in rule:
            axis = _axis(rule["rope"]["axis"], shape, "rope")
            if shape[axis] % 2:
                raise ValueError(f"rope on an odd axis of {shape[axis]}")
            add("rope", shape, axis)
        if "cut" in rule and len(want) == len(shape):
            axis = _axis(rule["cut"], shape, "cut")
            after = list(shape)
            after[axis] = min(shape[axis], want[axis])
            add("cut", after, (axis, after[axis]))
    except (ValueError, IndexError, ZeroDivisionError) as e:
        raise CheckpointError(
            f"the rule for '{str(rule['from'])[:80]}' does not fit the stored '{src.stored}' of "
            f"shape {list(stored_shape)}: {str(e)[:80]}."
        ) from None
    return ReadPlan(tuple(stored_shape), shape, tuple(steps))


def finish(x: np.ndarray, src: Any, dtype: Any) -> np.ndarray:
    """`scale`, `plus_one` and `offset` (in float32) and the cast to the model weight's dtype."""
    offset = float(src.rule.get("offset", 0.0)) + (1.0 if src.rule.get("plus_one") else 0.0)
    if src.scale != 1.0 or offset:
        x = x.astype(np.float32)
        if src.scale != 1.0:
            x = x * np.float32(src.scale)
        if offset:
            x = x + np.float32(offset)
    return np.asarray(x).astype(dtype, copy=False)


def block_plan(plan: ReadPlan, block: int, axis: int = -1) -> tuple[ReadPlan, int, int] | None:
    """`plan` for a stored tensor whose axis `axis` (the last by default) is kept in blocks of
    `block` values (a quantized tensor's rows of blocks, each block one element; a Hugging Face
    quantized weight's output rows, the input axis one block), and the axis of the result that
    the blocks run along; None where an operation would cut a block (a `take`, `split` or `cut`
    of that axis off a block's bounds, a `reshape` that splits it into pieces smaller than a
    block or merges it under another axis) or `rope` would reorder within it. A last `reshape`
    that splits the blocks' axis into axes whose inner ones are narrower than a block (an output
    projection's `[heads * head_dim]` into `[heads, head_dim]` with head_dim 128 and blocks of
    256) leaves them merged: the blocks span `span` axes from `axis`.

    Returns:
      (the block plan, whose result is `plan.shape` with axes `axis .. axis + span - 1` merged
      and divided by `block`; `axis`; `span`), or None.
    """

    def div(shape: tuple[int, ...], axis: int) -> tuple[int, ...] | None:
        if shape[axis] % block:
            return None
        return (*shape[:axis], shape[axis] // block, *shape[axis + 1 :])

    axis, span = axis % len(plan.stored), 1
    stored = div(plan.stored, axis)
    if stored is None:
        return None
    steps = []
    for index, step in enumerate(plan.steps):
        k, a = step.kind, step.arg
        before, after = div(step.before, axis), None
        if k == "take":
            if a[0] == axis:
                return None
            new_axis = axis - (a[0] < axis)
        elif k == "split":
            at, start, stop, squeeze = a
            if at == axis:
                if start % block or stop % block or squeeze:
                    return None
                a = (at, start // block, stop // block, squeeze)
            new_axis = axis - (squeeze and at < axis)
        elif k == "transpose":
            new_axis = a.index(axis)
        elif k == "rope":
            if a == axis:
                return None
            new_axis = axis
        elif k == "cut":
            if a[0] == axis:
                if a[1] % block:
                    return None
                a = (axis, a[1] // block)
            new_axis = axis
        else:  # reshape: the block axis must end its group, and end one of the same size
            group = next(g for g in _blocks(step.before, step.after) if axis in g[0])
            olds, news = group
            if not news or axis != olds[-1]:
                return None
            new_axis = news[-1]
            count = 1
            while math.prod(step.after[n] for n in news[-count:]) % block and count < len(news):
                count += 1
            if count > 1 and index == len(plan.steps) - 1:  # the blocks span `count` new axes
                first = news[-count]
                merged = math.prod(step.after[n] for n in news[-count:])
                after = div((*step.after[:first], merged, *step.after[news[-1] + 1 :]), first)
                if before is None or after is None:
                    return None
                steps.append(_Step("reshape", before, after, a))
                axis, span = first, count
                break
        after = div(step.after, new_axis)
        if before is None or after is None:
            return None
        steps.append(_Step(k, before, after, a))
        axis = new_axis
    merged = math.prod(plan.shape[axis : axis + span])
    if merged % block:
        return None
    shape = (*plan.shape[:axis], merged // block, *plan.shape[axis + span :])
    return ReadPlan(stored, shape, tuple(steps)), axis, span
