"""The subpackages' faces (REVIEW defect 9): each `ppl_jax/<sub>/__init__.py` says what its room
holds and re-exports its public names (`__all__`), which resolve; importing the faces imports none
of their modules; the rooms inside a subpackage (`models.layers`, `checkpoints.mapping`, ...) have
lazy faces too, none exporting a name one of its modules takes; and code outside the package
(`launch/`, `benchmarks/`, `examples/`, the docs' Python blocks) imports a name a face exports from
the face, not from the module below it."""

from __future__ import annotations

import ast
import glob
import importlib
import os
import re
import subprocess
import sys

import helpers

PACKAGE = os.path.join(helpers.REPO, "ppl_jax")
SUBPACKAGES = sorted(
    name
    for name in os.listdir(PACKAGE)
    if os.path.isfile(os.path.join(PACKAGE, name, "__init__.py"))
)
# The rooms inside a subpackage (`models.layers`, `checkpoints.readers`, ...): each has a face of
# its own. `plans.protocols` is the protocols' registry, and `models.families` the modules the
# family registry alone imports (`ppl_jax.models.registry`), not faces.
ROOMS = sorted(
    os.path.relpath(folder, PACKAGE).replace(os.sep, ".")
    for folder, _, names in os.walk(PACKAGE)
    if "__init__.py" in names and os.path.relpath(folder, PACKAGE).count(os.sep) >= 1
)
NOT_FACES = {"plans.protocols", "models.families"}
# Every face imports its modules on first use.
EAGER: set[str] = set()
OUTSIDE = ("launch", "benchmarks", "examples")


def face_names(sub: str) -> set[str]:
    """The face's `__all__`, read from its source (as Griffe reads it), without importing it."""
    face = os.path.join(PACKAGE, *sub.split("."), "__init__.py")
    tree = ast.parse(open(face, encoding="utf-8").read())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets
        ):
            return set(ast.literal_eval(node.value))
    return set()


def deep_imports(source: str, where: str, faces: dict[str, set[str]]) -> list[str]:
    """`from ppl_jax.<sub>.<module> import X` where the face `ppl_jax.<sub>` exports X."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.ImportFrom) or not node.module:
            continue
        parts = node.module.split(".")
        if parts[0] != "ppl_jax" or len(parts) < 3:
            continue
        for alias in node.names:
            if alias.name in faces.get(parts[1], ()):
                found.append(
                    f"{where}:{node.lineno} from {node.module} import {alias.name} "
                    f"(use: from ppl_jax.{parts[1]} import {alias.name})"
                )
    return found


def outside_sources():
    """(where, source) of each Python file outside the package and each docs' Python block."""
    for folder in OUTSIDE:
        for path in sorted(
            glob.glob(os.path.join(helpers.REPO, folder, "**", "*.py"), recursive=True)
        ):
            yield os.path.relpath(path, helpers.REPO), open(path, encoding="utf-8").read()
    pages = glob.glob(os.path.join(helpers.REPO, "docs", "**", "*.md"), recursive=True)
    for path in sorted(pages) + [os.path.join(helpers.REPO, "README.md")]:
        text = open(path, encoding="utf-8").read()
        for i, block in enumerate(re.findall(r"```python\n(.*?)```", text, re.S)):
            yield f"{os.path.relpath(path, helpers.REPO)} (Python block {i + 1})", block


def test_every_subpackage_has_a_face_with_a_docstring_and_a_few_names():
    assert len(SUBPACKAGES) >= 13, SUBPACKAGES
    for sub in SUBPACKAGES:
        face = open(os.path.join(PACKAGE, sub, "__init__.py"), encoding="utf-8").read()
        doc = ast.get_docstring(ast.parse(face)) or ""
        assert len(doc.split()) > 10, f"ppl_jax.{sub}: its docstring says too little: {doc!r}"
        names = face_names(sub)
        assert 2 <= len(names) <= 10, f"ppl_jax.{sub}.__all__: {sorted(names)}"


def test_every_name_a_face_exports_resolves():
    for sub in SUBPACKAGES:
        module = importlib.import_module(f"ppl_jax.{sub}")
        assert set(module.__all__) == face_names(sub)
        for name in module.__all__:
            try:
                obj = getattr(module, name)
            except ModuleNotFoundError as e:  # the harness's model needs the reference extra
                assert e.name and e.name.split(".")[0] in {"lm_eval", "torch"}, (sub, name, e)
                continue
            assert obj is not None, f"ppl_jax.{sub}.{name}"
            assert not isinstance(obj, type(module)), f"ppl_jax.{sub}.{name} is a module"
        assert set(module.__all__) <= set(dir(module))
    import ppl_jax

    assert ppl_jax.__all__ == sorted(ppl_jax.__all__)
    for name in ppl_jax.__all__:
        assert getattr(ppl_jax, name) is not None, f"ppl_jax.{name}"


def test_the_faces_import_none_of_their_modules():
    lazy = [sub for sub in SUBPACKAGES if sub not in EAGER]
    code = (
        "import sys, ppl_jax\n"
        + "".join(f"import ppl_jax.{sub}\n" for sub in lazy)
        + "loaded = [m for m in sys.modules if m.count('.') >= 2 and m.startswith('ppl_jax.')]\n"
        + "print(sorted(loaded), 'jax' in sys.modules)"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert r.stdout.strip() == "[] False", r.stdout


def test_code_outside_the_package_imports_from_the_faces():
    faces = {sub: face_names(sub) for sub in SUBPACKAGES}
    seen = 0
    found = []
    for where, source in outside_sources():
        seen += "ppl_jax" in source
        found += deep_imports(source, where, faces)
    assert seen >= 10  # launch/train_demo.py, the benchmarks, the docs' examples
    assert not found, "\n".join(found)


def test_a_deep_import_is_found():
    faces = {"scoring": {"Scorer", "token_nll"}}
    code = "from ppl_jax.scoring.scorer import Scorer\nfrom ppl_jax.scoring import token_nll\n"
    found = deep_imports(code, "x.py", faces)
    assert found == ["x.py:1 from ppl_jax.scoring.scorer import Scorer "
                     "(use: from ppl_jax.scoring import Scorer)"]  # fmt: skip
    assert deep_imports("from ppl_jax.models.registry import build\n", "x.py", faces) == []


def test_every_room_has_a_lazy_face_whose_names_are_not_its_modules():
    rooms = [room for room in ROOMS if room not in NOT_FACES]
    wanted = {"models.layers", "models.layers.moe", "models.decoders"}
    assert wanted <= set(rooms) and "models.families" in ROOMS
    assert {"checkpoints.readers", "checkpoints.mapping", "checkpoints.formats"} <= set(rooms)
    assert {"evaluation.run", "evaluation.passes"} <= set(rooms)
    for room in rooms:
        folder = os.path.join(PACKAGE, *room.split("."))
        face = open(os.path.join(folder, "__init__.py"), encoding="utf-8").read()
        doc = ast.get_docstring(ast.parse(face)) or ""
        assert len(doc.split()) > 10, f"ppl_jax.{room}: its docstring says too little: {doc!r}"
        assert "lazy_api_imports" in face, f"ppl_jax.{room}: not a lazy face"
        names = face_names(room)
        assert 2 <= len(names) <= 10, f"ppl_jax.{room}.__all__: {sorted(names)}"
        # A module of the room replaces the face's name once it is imported.
        modules = {n[:-3] for n in os.listdir(folder) if n.endswith(".py")} | {
            n for n in os.listdir(folder) if os.path.isfile(os.path.join(folder, n, "__init__.py"))
        }
        assert not names & modules, f"ppl_jax.{room} exports its modules' names: {names & modules}"
        module = importlib.import_module(f"ppl_jax.{room}")
        assert set(module.__all__) == names
        for name in names:
            obj = getattr(module, name)
            assert obj is not None and not isinstance(obj, type(module)), f"ppl_jax.{room}.{name}"
    # The faces of the rooms and of their subpackages, and nothing below them.
    faces = {f"ppl_jax.{'.'.join(room.split('.')[:n])}" for room in rooms for n in (1, 2, 3)}
    code = (
        "import sys\n"
        + "".join(f"import ppl_jax.{room}\n" for room in rooms)
        + f"loaded = [m for m in sys.modules if m.startswith('ppl_jax.') and m not in {faces!r}]\n"
        + "print(sorted(loaded), 'jax' in sys.modules)"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert r.stdout.strip() == "[] False", r.stdout
