"""The docs are true: every source path they name exists, no developer's absolute path, every
timing they quote comes from one place (BENCHMARKS.md), the public names and tools are all
listed, and the API reference renders each parameter, attribute, exception and return value in
a row of its own (mkdocstrings' warnings are errors: `mkdocs build --strict`)."""

from __future__ import annotations

import glob
import importlib
import importlib.util
import logging
import os
import re
import sysconfig

import pytest

import helpers

REPO = helpers.REPO
PAGES = ["README.md", "BENCHMARKS.md", "benchmarks/LOG.md"] + sorted(
    os.path.relpath(p, REPO)
    for p in glob.glob(os.path.join(REPO, "docs", "**", "*.md"), recursive=True)
)
TOP = ("ppl_jax", "tests", "benchmarks", "configs", "launch", "examples", "docs")
PATH = re.compile(r"(?<![\w/.-])((?:" + "|".join(TOP) + r")/[\w./*<>-]*[\w*>])")
BARE = re.compile(r"`([\w-]+\.(?:py|sh))`")  # a source file named alone
DOTTED = re.compile(r"`(ppl_jax(?:\.\w+)+)")
DURATION = re.compile(r"(?<![\w.,-])(\d[\d,.]*(?:-\d[\d,.]*)?) ?(ms|s|seconds|minutes?)\b")


def read(page: str) -> str:
    with open(os.path.join(REPO, page), encoding="utf-8") as f:
        return f.read()


def prose(text: str) -> list[str]:
    """The lines of a page outside fenced code blocks."""
    out, fenced = [], False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if not fenced:
            out.append(line)
    return out


def _files_named() -> set[str]:
    names = set()
    for _root, dirs, files in os.walk(REPO):
        dirs[:] = [d for d in dirs if not d.startswith(".") and d not in ("site", "__pycache__")]
        names.update(files)
    stdlib = sysconfig.get_paths()["stdlib"]
    names.update(os.listdir(stdlib))
    return names


# Packages of the extras (`reference`) that the default suite may run without.
OPTIONAL = {"lm_eval", "torch", "transformers"}


def _resolves(dotted: str) -> bool:
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        module = ".".join(parts[:i])
        try:
            obj = importlib.import_module(module)
        except ModuleNotFoundError as e:
            if e.name and e.name.split(".")[0] in OPTIONAL and importlib.util.find_spec(module):
                return i == len(parts)  # a module of an extra the suite may lack (lm_eval)
            continue
        except ImportError:
            continue
        for name in parts[i:]:
            if not hasattr(obj, name):
                return False
            obj = getattr(obj, name)
        return True
    return False


@pytest.mark.parametrize("page", PAGES)
def test_every_source_path_named_in_the_docs_exists(page):
    text = read(page)
    missing = []
    for m in PATH.finditer(text):
        path = m.group(1).rstrip(".")
        if "*" in path or "<" in path:  # a pattern: its folder exists
            path = path.split("*")[0].split("<")[0].rsplit("/", 1)[0]
        if not os.path.exists(os.path.join(REPO, path)):
            missing.append(path)
    named = _files_named()
    missing += [f"`{n}`" for n in BARE.findall(text) if n not in named]
    missing += [f"`{d}`" for d in DOTTED.findall(text) if not _resolves(d)]
    assert missing == [], f"{page} names what does not exist: {missing}"


@pytest.mark.parametrize("page", PAGES)
def test_no_developers_absolute_path(page):
    text = read(page)
    assert REPO not in text
    assert not re.search(r"(?<![\w.])/(work|Users|root)/", text), page


def current_figures() -> str:
    text = read("BENCHMARKS.md")
    return text[text.index("[start:current]") : text.index("[end:current]")]


def quoted_timings() -> list[tuple[str, str]]:
    """(page, duration) for every measured duration quoted outside BENCHMARKS.md and the log:
    prose lines only, not a setting's default or a timeout."""
    found = []
    for page in PAGES:
        if page in ("BENCHMARKS.md", "benchmarks/LOG.md", "docs/benchmarks.md"):
            continue
        for line in prose(read(page)):
            if re.search(r"timeout|PPL_JAX_|error:", line, re.I):  # settings and messages
                continue
            for m in DURATION.finditer(line):
                if not re.search(r"default\W*$", line[: m.start()]):  # `default 10 s`
                    found.append((page, f"{m.group(1)} {m.group(2)}"))
    return found


def test_every_timing_quoted_comes_from_one_place():
    """README said 17 s / 6 s and docs/index.md 55-70 s / 16 s for the same things; now every
    duration the docs quote is a figure of BENCHMARKS.md's current table."""
    table = current_figures()
    quoted = quoted_timings()
    assert len(quoted) >= 8  # the README's and the pages' figures are seen
    stray = [(page, t) for page, t in quoted if t not in table]
    assert stray == [], f"timings quoted but not in BENCHMARKS.md: {stray}"
    # and the README's getting-started figures are those of the table
    for figure in ("28 s", "10 s", "16 s", "282 s"):
        assert ("README.md", figure) in quoted and figure in table


def test_the_benchmarks_log_is_dated():
    log = read("benchmarks/LOG.md")
    headings = re.findall(r"^## (.*)$", log, re.M)
    assert len(headings) >= 10
    dates = [h[:10] for h in headings]
    assert all(re.fullmatch(r"\d{4}-\d\d-\d\d", d) for d in dates), headings
    assert dates == sorted(dates)
    assert len(read("BENCHMARKS.md").splitlines()) < 80
    assert "benchmarks/LOG.md" in read("BENCHMARKS.md")
    assert '--8<-- "BENCHMARKS.md:current"' in read("docs/benchmarks.md")


def test_every_public_name_and_tool_is_listed():
    import ppl_jax
    from ppl_jax.cli.help import SUBCOMMANDS

    library = read("docs/library.md")
    section = library[library.index("## The public API") : library.index("```python")]
    listed = set(re.findall(r"`(\w+)`", section))
    assert set(ppl_jax.__all__) - listed == set()
    tools = read("docs/command-line.md")
    table = tools[tools.index("## The tools") : tools.index("## Config files")]
    assert {t for t in SUBCOMMANDS if f"`ppl-jax {t} " not in table} == set()
    api = read("docs/reference/api.md")
    documented = set(re.findall(r"^::: ppl_jax\.(\w+)", api, re.M))
    assert {n for n in ppl_jax.__all__ if n[0].isupper() or n.islower()} - documented - {
        "PplJaxError", "ConfigError", "DataError", "CheckpointError", "NumericsError",
        "Interrupted", "__version__",
    } == set()  # fmt: skip


def test_mkdocstrings_warnings_are_not_turned_off():
    config = read("mkdocs.yml")
    assert "strict: true" in config
    assert "warn_unknown_params: false" not in config and "warn_missing_types: false" not in config


# ---- the API reference, as mkdocstrings reads it ----------------------------------------------


def api_objects():
    griffe = pytest.importorskip("griffe")
    logging.getLogger("griffe").setLevel(logging.ERROR)
    pkg = griffe.load(
        "ppl_jax",
        search_paths=[REPO],
        docstring_parser="google",
        allow_inspection=False,
    )
    names = re.findall(r"^::: ppl_jax(\.\S+)?$", read("docs/reference/api.md"), re.M)
    for name in names:
        obj = pkg[name[1:]] if name else pkg
        target = obj.final_target if obj.is_alias else obj
        yield f"ppl_jax{name}", target
        if target.is_class or target.is_module:
            for member_name, member in target.members.items():
                if member_name.startswith("_") and member_name not in ("__init__", "__call__"):
                    continue
                try:
                    member = member.final_target if member.is_alias else member
                except Exception:  # an alias to something outside the package
                    continue
                yield f"ppl_jax{name}.{member_name}", member


def signature_names(obj) -> set[str]:
    if obj.is_function:
        return {p.name for p in obj.parameters}
    if obj.is_class:
        names = set(obj.members)
        init = obj.members.get("__init__")
        if init is not None:
            init = init.final_target if init.is_alias else init
            names |= {p.name for p in init.parameters}
        return names
    return set()


def row_problems(where: str, obj) -> list[str]:
    if obj.docstring is None:
        return []
    names = signature_names(obj)
    out = []
    for section in obj.docstring.parse("google"):
        kind = section.kind.value
        if kind in ("parameters", "attributes", "other parameters"):
            rows = {item.name for item in section.value}
            for item in section.value:
                if "," in item.name or (kind == "parameters" and names and item.name not in names):
                    out.append(f"{where}: {kind} row {item.name!r} is no parameter")
                for m in re.finditer(r"(?:^|[;.]\s+)([a-z_]\w*): ", item.description):
                    if m.group(1) != item.name and m.group(1) in names | rows:
                        out.append(f"{where}: {m.group(1)!r} inside the row of {item.name!r}")
        if kind == "returns" and len(section.value) > 1:
            out.append(f"{where}: the return value in {len(section.value)} rows")
        if kind == "raises":
            for item in section.value:
                for m in re.finditer(r"[;.]\s+(\w+Error):", item.description):
                    out.append(f"{where}: {m.group(1)} inside the row of {item.annotation}")
    return out


def test_the_api_reference_renders_a_row_per_parameter():
    """`mesh` was rendered inside the `model` row of `Evaluator`, `derive`'s return value in four
    rows (a continuation line taken for another value), `DataError` inside `ConfigError`'s."""
    problems = [p for where, obj in api_objects() for p in row_problems(where, obj)]
    assert problems == []


def test_attributes_set_by_unpacking_carry_their_own_type():
    """griffe gave `Evaluator.param_targets` (set by tuple unpacking) the type of `datasets`."""
    (evaluator,) = [obj for where, obj in api_objects() if where == "ppl_jax.Evaluator"]
    (section,) = [s for s in evaluator.docstring.parse("google") if s.kind.value == "attributes"]
    types = {item.name: str(item.annotation) for item in section.value}
    assert types["param_targets"] == types["reference_targets"] == "Any"
