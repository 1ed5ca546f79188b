"""The one declarative mapping from stored weight names to a model's params.

Every layout ppl_jax reads is a list of these rules (plain data): the Hugging Face layout of each
family (`Family.hf_rules`, `ppl_jax.models.registry`), the presets for other trainers' Orbax trees
(`ppl_jax.checkpoints.mapping.presets`) and a user's YAML or JSON file. Each rule is a dict:

- `from`: a regular expression in RE2 syntax (`re2`: linear-time matching, so no pattern can
  backtrack for long; no backreferences or lookarounds), matched in full against a stored name
  (relative to the params subtree: an Orbax item's params, or a Hugging Face name with its
  family's text prefix removed). Named groups (`(?P<l>\\d+)`) are captured. The first rule that
  matches a name takes it.
- `to`: the model weight's name, a template over the captured groups and `{layer}`
  (`layers/{l}/attn/q`); a list of names for a fused tensor split in parts; `null` to leave the
  stored weight unused on purpose.
- `layers`: `{axis, stride=1, offset=0}`: the stored tensor stacks layers on `axis` (MaxText's
  scanned layers: axis 1); index `i` of that axis is layer `i * stride + offset` (`offset` an
  integer or a captured group's name: MaxText's Gemma 3 scans blocks of 6 sub-layers).
- `view`: a shape (integers or expressions) the stored tensor is seen with before `split`
  (GPT-NeoX's fused `query_key_value` rows `[heads, 3, head_dim]`).
- `split`: `{axis, sizes=None, squeeze=False}`: the parts of a fused tensor along `axis` (equal
  parts, or `sizes`, integers or expressions), in the order of the `to` list; `squeeze` drops the
  axis (a stack of 2).
- `transpose`: the axes' new order (NumPy's `transpose`). `reshape`: the new shape (integers or
  expressions over the architecture, `num_heads`, `-1` for one inferred dimension).
- `rope: {axis}`: head dimensions stored interleaved (pairs `2i, 2i+1`) permuted to the
  rotate-half layout ppl_jax uses (`i, i + head_dim/2`): `x[..., concat(0::2, 1::2)]`.
- `cut: axis`: a dimension padded past the model's (a vocabulary padded past the tokenizer's)
  cut to the model's size.
- `stack: {axis, index}`: the stored tensor is slice `index` (a captured group's name) of the
  model weight's `axis` (transformers' per-expert tensors stacked into `[experts, ...]`).
- `scale`: a constant factor, a number or an expression over the architecture
  (`head_dim ** 0.5` undoes MaxText's query scaling by `1/sqrt(head_dim)`).
- `plus_one: true`: a norm scale stored in the `x̂·(1+w)` form (gemma) turned into `x̂·w`.
- `offset`: a constant added after `scale` (`-1`: GGUF's Gemma norms, stored as `1 + w`).

The operations apply in that order (`stack` last), in float32 when a factor, `plus_one` or
`offset` is involved, then the result is cast to the weight's dtype. Every stored weight must be
taken by a rule and every model weight produced exactly once: `resolve` raises one sentence
naming the unmatched names and the shapes that do not come out. How a model weight is read, block
by block, is `ppl_jax.checkpoints.mapping.blocks`; where the bytes come from,
`ppl_jax.checkpoints.mapping.storage`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from ppl_jax.checkpoints.mapping import operations
from ppl_jax.checkpoints.mapping import rules as rules_lib
from ppl_jax.checkpoints.mapping.operations import evaluate
from ppl_jax.checkpoints.mapping.rules import RULE_KEYS, check_rules, compile_pattern
from ppl_jax.errors import CheckpointError

__all__ = ["RULE_KEYS", "Source", "check_rules", "evaluate", "out_shape", "resolve"]


@dataclasses.dataclass(frozen=True)
class Source:
    """How one model weight comes from the stored tensors.

    Attributes:
      stored: the stored name (relative to the item, as the storage takes it); for a stacked
        weight, its first part's.
      layer: the index on the stacked-layers axis (`rule["layers"]["axis"]`), or None.
      part: the part of a split, or None.
      rule: the rule (its operations).
      scale: the factor, evaluated (1.0: none).
      index: the slice of the model weight's `stack` axis this stored tensor is, or None.
      parts: for a stacked weight (`stack`), the Source of each slice in order; else `()`.
    """

    stored: str
    layer: int | None
    part: int | None
    rule: dict[str, Any]
    scale: float
    index: int | None = None
    parts: tuple[Source, ...] = ()

    @property
    def pieces(self) -> tuple[Source, ...]:
        """The stored tensors' Sources that make the weight (itself, or its stacked parts)."""
        return self.parts or (self,)


def _names_list(names: list[str], limit: int = 5) -> str:
    shown = ", ".join(f"'{n}'" for n in names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


def resolve(
    rules: list[dict[str, Any]],
    stored: dict[str, tuple[tuple[int, ...], Any]],
    target: dict[str, Any],
    architecture: dict[str, Any],
    where: str,
    shown: Any = None,
    remedy: str = "Check the architecture and the mapping.",
) -> dict[str, Source]:
    """Which stored tensor, layer and part each model weight comes from, shapes checked.

    Args:
      rules: as `check_rules` returns.
      stored: stored name (relative to the params subtree) -> (shape, dtype).
      target: model weight name -> leaf with `.shape`.
      architecture: the architecture's fields (names for expressions).
      where: the checkpoint and mapping, for the sentences.
      shown: stored name -> the name the user knows (e.g. with the prefix the rules do not see);
        default the name itself.
      remedy: the sentence's last words.

    Returns:
      model weight name -> `Source`.

    Raises:
      CheckpointError: one sentence naming the stored weights no rule takes, the model weights
        no stored weight gives, the weights given twice and the shapes that do not come out (a
        few of each).
    """
    rules = check_rules(rules, where)
    shown = shown or (lambda n: n)
    names = {k: v for k, v in architecture.items() if isinstance(v, int | float)}
    sources, unused, twice = _match(rules, stored, names, where, shown)
    problems = []
    if unused:
        problems.append(
            f"no mapping rule takes the stored weight{'s' if len(unused) > 1 else ''} "
            f"{_names_list(unused)}; add a rule for them (or `to: null` to leave them unused)"
        )
    missing = [n for n in target if n not in sources]
    extra = [n for n in sources if n not in target]
    if missing:
        examples = rules_lib.examples(rules, missing[:5], shown)
        problems.append(
            f"the model weights {_names_list(missing)}{examples} are given by no stored weight"
        )
    if extra:
        problems.append(f"the mapping gives {_names_list(extra)}, which the model does not have")
    if twice:
        problems.append(
            f"model weights are given twice: {', '.join(twice[:3])}; make the rules' patterns "
            f"exclusive"
        )
    for out, src in sources.items():
        if out not in target or len(problems) > 3:
            continue
        want = tuple(target[out].shape)
        try:
            got = out_shape(src, stored, want, names)
        except CheckpointError as e:
            stored_name = f"'{src.stored}'"
            problems.append(str(e).removesuffix(".").replace(stored_name, f"'{shown(src.stored)}'"))
            continue
        if got != want:
            problems.append(
                f"stored '{shown(src.stored)}' {list(stored[src.stored][0])} gives {list(got)} for "
                f"model weight '{out}', which the architecture makes {list(want)}"
            )
    if problems:
        raise CheckpointError(f"{where}: " + "; ".join(problems) + ". " + remedy)
    return sources


def _match(
    rules: list[dict[str, Any]],
    stored: dict[str, tuple[tuple[int, ...], Any]],
    names: dict[str, Any],
    where: str,
    shown: Any,
) -> tuple[dict[str, Source], list[str], list[str]]:
    """(model weight -> Source, the stored names no rule takes, the weights given twice)."""
    sources: dict[str, Source] = {}
    stacks: dict[str, dict[int, Source]] = {}
    unused: list[str] = []
    twice: list[str] = []
    compiled = [(compile_pattern(r["from"], where, n), r) for n, r in enumerate(rules)]
    for name, (shape, _) in stored.items():
        hit = next(((m, r) for p, r in compiled if (m := p.fullmatch(name))), None)
        if hit is None:
            unused.append(shown(name))
            continue
        match, rule = hit
        if rule["to"] is None:
            continue
        groups = {k: v for k, v in match.groupdict().items() if v is not None}
        where_rule = f"{where}: the rule for {rule['from']!r}"
        scale = float(evaluate(rule.get("scale", 1.0), {**names, **_ints(groups)}, "scale"))
        layers = [None]
        if "layers" in rule:
            spec = rule["layers"]
            if not shape:
                raise CheckpointError(
                    f"{where_rule} stacks layers, but {shown(name)!r} is a scalar."
                )
            if not -len(shape) <= spec["axis"] < len(shape):
                raise CheckpointError(
                    f"{where_rule} stacks layers on axis {spec['axis']}, which "
                    f"{shown(name)!r} of {len(shape)} axes does not have."
                )
            axis = spec["axis"] % len(shape)
            offset = spec.get("offset", 0)
            offset = _group_int(groups, offset, where_rule) if isinstance(offset, str) else offset
            layers = [(i, i * spec.get("stride", 1) + offset) for i in range(shape[axis])]
        index = None
        if "stack" in rule:
            index = _group_int(groups, rule["stack"]["index"], where_rule)
        outs = rule["to"] if isinstance(rule["to"], list) else [rule["to"]]
        for layer in layers:
            fields = dict(groups)
            if layer is not None:
                fields["layer"] = layer[1]
            for part, template in enumerate(outs):
                try:
                    out = template.format(**fields)
                except (KeyError, IndexError, ValueError) as e:
                    raise CheckpointError(
                        f"{where_rule} names {str(e)[:40]} in 'to' ({template[:80]!r}), which its "
                        f"pattern does not capture."
                    ) from None
                src = Source(
                    name,
                    None if layer is None else layer[0],
                    part if isinstance(rule["to"], list) else None,
                    rule,
                    scale,
                    index,
                )
                if index is not None:
                    slot = stacks.setdefault(out, {})
                    if index in slot:
                        twice.append(f"'{out}' [{index}]")
                    slot[index] = src
                elif out in sources:
                    twice.append(f"'{out}' (by '{shown(sources[out].stored)}' and '{shown(name)}')")
                else:
                    sources[out] = src
    for out, slot in stacks.items():
        if out in sources:
            twice.append(f"'{out}'")
            continue
        order = tuple(slot[i] for i in sorted(slot))
        if sorted(slot) != list(range(len(slot))):
            missing = sorted(set(range(max(slot) + 1)) - set(slot))
            twice.append(f"'{out}' (its stacked slices lack {missing[:5]})")
            continue
        sources[out] = dataclasses.replace(order[0], parts=order)
    return sources, unused, twice


def produced(
    rules: list[dict[str, Any]],
    stored: dict[str, tuple[tuple[int, ...], Any]],
    architecture: dict[str, Any],
    where: str,
) -> dict[str, tuple[int, ...]]:
    """The model weights the rules make of the stored tensors, with the shapes they come out
    (before a `cut`), read from the names and shapes alone: what a checkpoint holds, checked
    against a description before any model is built.

    Raises:
      CheckpointError: as `check_rules`, or operations that do not fit a stored shape.
    """
    rules = check_rules(rules, where)
    names = {k: v for k, v in architecture.items() if isinstance(v, int | float)}
    sources, _, _ = _match(rules, stored, names, where, lambda n: n)
    out = {}
    for name, src in sources.items():
        shape = operations.plan(src.pieces[0], stored[src.stored][0], (), names).shape
        if src.parts:
            axis = src.rule["stack"]["axis"] % (len(shape) + 1)
            shape = shape[:axis] + (len(src.parts),) + shape[axis:]
        out[name] = tuple(shape)
    return out


def _ints(groups: dict[str, str]) -> dict[str, int]:
    return {k: int(v) for k, v in groups.items() if v.isdigit() and len(v) < 10}


def _group_int(groups: dict[str, str], name: str, where: str) -> int:
    value = groups.get(name)
    if value is None or not value.isdigit() or len(value) > 9:
        raise CheckpointError(
            f"{where} takes an index from the group {name!r}, which its pattern does not capture "
            f"as a number (got {str(value)[:20]!r})."
        )
    return int(value)


def out_shape(
    src: Source,
    stored: dict[str, tuple[tuple[int, ...], Any]],
    want: tuple[int, ...],
    names: dict[str, Any],
) -> tuple[int, ...]:
    """The shape `src`'s operations make of the stored tensors (`want`: the model weight's, for
    `cut` and `stack`).

    Raises:
      CheckpointError: operations that do not fit the stored shape, naming the rule.
    """
    piece = src.pieces[0]
    inner = want
    if src.parts:
        axis = piece.rule["stack"]["axis"]
        if not -len(want) <= axis < len(want):
            raise CheckpointError(
                f"the rule for '{str(piece.rule['from'])[:80]}' stacks on axis {axis}, which a "
                f"model weight of {len(want)} axes does not have."
            )
        axis %= len(want)
        inner = want[:axis] + want[axis + 1 :]
    shapes = {operations.plan(p, stored[p.stored][0], inner, names).shape for p in src.pieces}
    if len(shapes) > 1:
        raise CheckpointError(
            f"the stacked slices of '{piece.stored}' have different shapes {sorted(shapes)[:3]}."
        )
    shape = shapes.pop()
    if src.parts:
        shape = shape[:axis] + (len(src.parts),) + shape[axis:]
    return tuple(shape)
