"""The house rules that a reader can check: one-way layers (import-linter's contract in
pyproject.toml), no ppl_jax import hidden inside a function outside `cli/` and the optional
packages, modules of at most 450 lines, and a scorer that does not import Flax."""

from __future__ import annotations

import ast
import os
import subprocess
import sys

import helpers

PACKAGE = os.path.join(helpers.REPO, "ppl_jax")
MAX_LINES = 450
# Modules still past MAX_LINES, each held to its present length until it is split where its nouns
# are (a ratchet: none may grow, and none may join the list).
LONG = {}
# Imports inside functions that stay: the command line's start-up time, and what a module needs
# only on one path (optional packages are not ppl_jax imports and are not counted).
ALLOWED_INNER = {
    "cli",  # start-up time of `ppl-jax --help`
}
# Modules that wrap an optional package (pyarrow, tensorboardX): imported where they are used.
OPTIONAL = {"ppl_jax.outputs.tokens", "ppl_jax.outputs.tensorboard"}
KNOWN: set[str] = set()  # none left
TYPE_ONLY_CIRCLE = {"ppl_jax.evaluation.evaluator", "ppl_jax.evaluation.hooks"}


def modules():
    for folder, _, names in os.walk(PACKAGE):
        for name in names:
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                yield os.path.relpath(path, PACKAGE), path


def test_import_linter_layers_are_kept():
    r = subprocess.run(
        [os.path.join(os.path.dirname(sys.executable), "lint-imports")],
        capture_output=True,
        text=True,
        cwd=helpers.REPO,
        env={**os.environ, "PYTHONPATH": helpers.REPO},
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    with open(os.path.join(helpers.REPO, "pyproject.toml"), encoding="utf-8") as f:
        contracts = f.read().count("[[tool.importlinter.contracts]]")
    assert f"{contracts} kept, 0 broken" in r.stdout


def circles(imports: dict[str, set[str]]) -> list[set[str]]:
    """The groups of modules that import each other round a circle (the strongly connected
    components of more than one module of the graph `module -> modules it imports`)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[set[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in imports.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = {stack.pop()}
            while v not in group:
                group.add(stack.pop())
            if len(group) > 1:
                found.append(group)

    for v in sorted(imports):
        if v not in index:
            visit(v)
    return found


def test_no_two_modules_import_each_other_round_a_circle():
    """A module imports only what sits below it (the registry its families, never a family the
    registry; the protocol `checkpoint` never `architecture` above it), type-checking imports
    included: a circle is two rooms that are one."""
    import grimp

    graph = grimp.build_graph("ppl_jax", cache_dir=None)
    found = circles({m: graph.find_modules_directly_imported_by(m) for m in graph.modules})
    # The evaluator's hooks name the `Evaluator` they are given, for type checkers only.
    assert [sorted(g) for g in found if g != TYPE_ONLY_CIRCLE] == []


def test_a_circle_is_found():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert circles(graph) == [{"a", "b", "c"}]
    assert circles({"a": {"b"}, "b": set()}) == []


def test_no_module_is_longer_than_450_lines():
    long = {
        rel: n
        for rel, path in modules()
        if (n := len(open(path).readlines())) > LONG.get(rel, MAX_LINES)
    }
    assert not long, long


def test_importing_the_scorer_does_not_import_flax():
    code = "import sys, ppl_jax.scoring.scorer; print('flax' in sys.modules)"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert r.stdout.strip() == "False"


def test_no_ppl_jax_import_inside_a_function():
    hidden = []
    for rel, path in modules():
        if rel.split(os.sep)[0] in ALLOWED_INNER or rel in KNOWN:
            continue
        tree = ast.parse(open(path, encoding="utf-8").read())
        for fn in ast.walk(tree):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(fn):
                if not isinstance(node, (ast.Import, ast.ImportFrom)):
                    continue  # `global` and `nonlocal` hold names too
                module = node.module if isinstance(node, ast.ImportFrom) else None
                names = {f"{module}.{a.name}" for a in getattr(node, "names", [])}
                if (module or "").startswith("ppl_jax") and not names & OPTIONAL:
                    hidden.append(f"{rel}:{node.lineno} {node.module}")
    assert not hidden, hidden
