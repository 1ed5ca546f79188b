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
