"""Mapping rules as data (`ppl_jax.checkpoints.mapping.language` says what each key means): their
form checked before anything is read, their patterns compiled safely, and the stored name a rule
expects, for the sentences.

Patterns are RE2 (`google-re2`): matching takes time linear in the name whatever the pattern, so
a pattern such as `(.*.*)*Z`, which makes Python's backtracking `re` run for hours on a long name,
answers at once; RE2 refuses the constructs that need backtracking (backreferences,
lookarounds), and a pattern longer than `MAX_PATTERN` characters or needing more than
`PATTERN_MEMORY` bytes is refused. A mapping file is data a user may have been sent: a rule whose
values have the wrong type is refused in one sentence naming the rule and the key.
"""

from __future__ import annotations

import functools
from typing import Any

import re2

from ppl_jax.errors import CheckpointError

RULE_KEYS = ("from", "to", "layers", "view", "split", "transpose", "reshape", "rope", "cut",
             "stack", "scale", "plus_one", "offset")  # fmt: skip
MAX_PATTERN = 2000  # characters
PATTERN_MEMORY = 8 << 20  # bytes RE2 may use for one compiled pattern
MAX_RULES = 100_000
_OPTIONS = re2.Options()
_OPTIONS.log_errors = False
_OPTIONS.max_mem = PATTERN_MEMORY


def _int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _size(value: Any) -> bool:
    """An integer or an expression (a string; `mapping.evaluate` checks it when used)."""
    return _int(value) or (isinstance(value, str) and 0 < len(value) <= 200)


def _problem(rule: dict[str, Any]) -> str | None:
    """What is wrong with one rule's values, or None."""
    source, to = rule["from"], rule["to"]
    if not isinstance(source, str) or not source:
        return "'from' must be a regular expression (a non-empty string)"
    if len(source) > MAX_PATTERN:
        return f"'from' is longer than {MAX_PATTERN} characters"
    outs = to if isinstance(to, list) else [to]
    if to is not None and (not outs or not all(isinstance(t, str) and t for t in outs)):
        return "'to' must be a weight name, a list of names, or null"
    if "layers" in rule:
        spec = rule["layers"]
        if (
            not isinstance(spec, dict)
            or set(spec) - {"axis", "stride", "offset"}
            or not _int(spec.get("axis"))
            or not _int(spec.get("stride", 1))
            or spec.get("stride", 1) < 1
            or not (_int(spec.get("offset", 0)) or isinstance(spec.get("offset"), str))
        ):
            return (
                "'layers' must be {axis: integer, stride: integer >= 1, offset: integer or group}"
            )
    if "split" in rule:
        spec = rule["split"]
        sizes = spec.get("sizes") if isinstance(spec, dict) else None
        if (
            not isinstance(spec, dict)
            or set(spec) - {"axis", "sizes", "squeeze"}
            or not _int(spec.get("axis"))
            or not isinstance(spec.get("squeeze", False), bool)
            or not (sizes is None or (isinstance(sizes, list) and all(map(_size, sizes))))
        ):
            return "'split' must be {axis: integer, sizes: [integers], squeeze: true or false}"
        if not isinstance(to, list) or (sizes is not None and len(sizes) != len(to)):
            return "'split' needs 'to' to be a list of names, one per part ('sizes' too)"
    if "transpose" in rule:
        perm = rule["transpose"]
        if not isinstance(perm, list) or sorted(perm) != list(range(len(perm))):
            return "'transpose' must be a permutation of the axes, e.g. [1, 0, 2]"
    for key in ("view", "reshape"):
        shape = rule.get(key, [])
        if not isinstance(shape, list) or not all(map(_size, shape)) or len(shape) > 32:
            return f"'{key}' must be a list of sizes (integers or expressions)"
    if "rope" in rule:
        spec = rule["rope"]
        if not isinstance(spec, dict) or set(spec) != {"axis"} or not _int(spec["axis"]):
            return "'rope' must be {axis: integer}"
    if "cut" in rule and not _int(rule["cut"]):
        return "'cut' must be an axis (an integer)"
    if "stack" in rule:
        spec = rule["stack"]
        if (
            not isinstance(spec, dict)
            or set(spec) != {"axis", "index"}
            or not _int(spec["axis"])
            or not isinstance(spec["index"], str)
        ):
            return "'stack' must be {axis: integer, index: a captured group's name}"
        if isinstance(to, list) or "layers" in rule:
            return "'stack' takes one 'to' name and no 'layers'"
    if "scale" in rule and not (_size(rule["scale"]) or isinstance(rule["scale"], float)):
        return "'scale' must be a number or an expression"
    if "plus_one" in rule and not isinstance(rule["plus_one"], bool):
        return "'plus_one' must be true or false"
    offset = rule.get("offset", 0.0)
    if isinstance(offset, bool) or not isinstance(offset, int | float) or abs(offset) > 1e6:
        return "'offset' must be a number"
    return None


def check_rules(rules: Any, where: str) -> list[dict[str, Any]]:
    """The rules, checked for form: known keys, values of the right type, patterns that compile.

    Raises:
      CheckpointError: naming `where`, the first faulty rule and its key.
    """
    if not isinstance(rules, list) or not all(isinstance(r, dict) for r in rules):
        raise CheckpointError(f"{where}: 'rules' must be a list of rules (each a mapping).")
    if len(rules) > MAX_RULES:
        raise CheckpointError(f"{where}: {len(rules)} rules are more than {MAX_RULES}.")
    for n, rule in enumerate(rules):
        unknown = set(rule) - set(RULE_KEYS)
        shown = str(rule.get("from"))[:80]
        if "from" not in rule or "to" not in rule or unknown:
            raise CheckpointError(
                f"{where}: rule {n + 1} ({shown!r}) needs 'from' and 'to'"
                + (f" and has unknown keys {sorted(map(str, unknown))[:5]}" if unknown else "")
                + f" (keys: {', '.join(RULE_KEYS)})."
            )
        problem = _problem(rule)
        if problem:
            raise CheckpointError(f"{where}: rule {n + 1} ({shown!r}): {problem}.")
        compile_pattern(rule["from"], where, n)
    return rules


@functools.lru_cache(maxsize=4096)
def _compiled(pattern: str):
    return re2.compile(pattern, _OPTIONS)


def compile_pattern(pattern: str, where: str, n: int):
    """The RE2 pattern of rule `n` (0-based).

    Raises:
      CheckpointError: not an RE2 regular expression (or too large), naming the rule.
    """
    try:
        return _compiled(pattern)
    except re2.error as e:
        why = e.args[0].decode() if e.args and isinstance(e.args[0], bytes) else str(e)
        raise CheckpointError(
            f"{where}: rule {n + 1}'s pattern {pattern[:80]!r} is not a regular expression "
            f"RE2 accepts ({why[:80]}; backreferences and lookarounds are not supported)."
        ) from None


def _literal(pattern: str) -> str | None:
    """The one name a pattern without metacharacters matches (escapes undone), or None."""
    out, i = [], 0
    while i < len(pattern):
        c = pattern[i]
        if c == "\\":
            if i + 1 >= len(pattern) or pattern[i + 1].isalnum():
                return None  # \d, \w, ...: a class, not a character
            out.append(pattern[i + 1])
            i += 2
            continue
        if c in ".^$*+?{}[]|()":
            return None
        out.append(c)
        i += 1
    return "".join(out)


def _substituted(pattern: str, values: dict[str, str]) -> str | None:
    """`pattern` with each named group `(?P<g>...)` replaced by `values[g]`, or None."""
    out, i = [], 0
    while i < len(pattern):
        if pattern.startswith("(?P<", i):
            name_end = pattern.find(">", i)
            name = pattern[i + 4 : name_end]
            depth, j = 0, i
            while j < len(pattern):
                if pattern[j] == "\\":
                    j += 2
                    continue
                depth += {"(": 1, ")": -1}.get(pattern[j], 0)
                j += 1
                if depth == 0:
                    break
            if name not in values or depth:
                return None
            out.append(values[name].replace(".", "\\."))
            i = j
            continue
        out.append(pattern[i])
        i += 1
    return "".join(out)


def examples(rules: list[dict[str, Any]], missing: list[str], shown) -> str:
    """` (stored as 'a', 'b')`: the stored names that the rules would turn into the `missing`
    model weights, where a rule's pattern is a plain name but for its groups; '' if none."""
    found = []
    for weight in missing:
        for rule in rules:
            outs = rule["to"] if isinstance(rule["to"], list) else [rule["to"]]
            if rule["to"] is None or "layers" in rule:
                continue
            for template in outs:
                values = _template_match(template, weight)
                if values is None:
                    continue
                literal = _substituted(rule["from"], values)
                name = _literal(literal) if literal is not None else None
                if name is not None:
                    found.append(shown(name))
                    break
            else:
                continue
            break
    return f" (stored as {', '.join(repr(n) for n in found)})" if found else ""


def _template_match(template: str, name: str) -> dict[str, str] | None:
    """The values of `{group}`s that make `template` the weight `name`, or None."""
    parts, groups, i = [], [], 0
    while i < len(template):
        j = template.find("{", i)
        k = template.find("}", j) if j >= 0 else -1
        if j < 0 or k < 0:
            parts.append(re2.escape(template[i:]))
            break
        parts.append(re2.escape(template[i:j]))
        group = template[j + 1 : k]
        if not group.isidentifier() or group in groups:
            return None
        groups.append(group)
        parts.append(f"(?P<{group}>[^/]+)")
        i = k + 1
    try:
        match = _compiled("".join(parts)).fullmatch(name)
    except re2.error:
        return None
    return match.groupdict() if match else None
