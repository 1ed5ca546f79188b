"""The test tiers are declared once, by folder (tests/conftest.py): the top folder under tests/ is
the tier, and a case that starts several processes outside tests/multiprocess/ fails, whether it
is marked so (at collection) or not (when it starts them)."""

from __future__ import annotations

import os

import conftest
import pytest

import helpers


class _Item:
    """What the collection hook reads of a collected test."""

    def __init__(self, path: str, markers: tuple[str, ...] = ()):
        self.path = os.path.join(conftest.HERE, path)
        self.nodeid = f"tests/{path}::test_case"
        self.markers = list(markers)

    def add_marker(self, marker) -> None:
        self.markers.append(marker.name)

    def get_closest_marker(self, name: str):
        return name if name in self.markers else None


def test_the_top_folder_marks_its_cases_and_a_file_may_add_slow():
    tiers = {
        "e2e/test_cli.py": "e2e",
        "multiprocess/test_distributed.py": "multiprocess",
        "slow/test_sweep.py": "slow",
        "unit/plans/test_token_cache.py": None,
        "unit/slow/test_x.py": None,  # only the top folder counts
        "shared_data/test_wikitext_cli.py": None,
    }
    assert {p: conftest.tier_of(os.path.join(conftest.HERE, p)) for p in tiers} == tiers
    items = [
        _Item("multiprocess/test_a.py"),
        _Item("e2e/test_b.py", ("slow",)),
        _Item("unit/plans/test_c.py", ("slow",)),
        _Item("unit/plans/test_d.py"),
    ]
    conftest.pytest_collection_modifyitems(None, items)
    assert [i.markers for i in items] == [["multiprocess"], ["slow", "e2e"], ["slow"], []]


def test_a_multiprocess_case_outside_its_folder_stops_the_collection():
    items = [_Item("unit/plans/test_c.py", ("multiprocess",)), _Item("slow/test_d.py")]
    with pytest.raises(pytest.UsageError, match=r"tests/unit/plans/test_c.py::test_case is marked"):
        conftest.pytest_collection_modifyitems(None, items)


def test_starting_several_processes_outside_tests_multiprocess_fails():
    with pytest.raises(AssertionError, match="move it to tests/multiprocess/"):
        helpers.process_env(0, 2, helpers.free_port())
    assert helpers.process_env(0, 1)["XLA_FLAGS"].endswith("=8")  # one process: anywhere


def test_the_default_selection_alone_compiles_at_level_0():
    addopts = ["-ra", "-m", "not slow and not multiprocess", "-n", "auto"]
    default = conftest.default_selection(addopts)
    assert default == "not slow and not multiprocess"
    n8 = "--xla_force_host_platform_device_count=8"
    quick = f"{conftest.QUICK_COMPILE} {conftest.CLASSIC_EMITTERS}"
    assert conftest.compile_flags(n8, default, default) == f"{n8} {quick}"
    assert conftest.compile_flags(n8, default, default, classic=False) == (
        f"{n8} {conftest.QUICK_COMPILE}"
    )
    assert conftest.compile_flags(n8, "slow or multiprocess", default) == n8
    assert conftest.compile_flags(n8, "", default) == n8  # every tier: as a user's run
    mine = f"--xla_backend_optimization_level=2 {n8}"
    assert conftest.compile_flags(mine, default, default) == mine  # the user's level wins


def test_an_xla_that_does_not_know_a_flag_is_not_given_it():
    """jaxlib 0.10 knows the classic emitters' flag, 0.12 no longer: the probe tells."""
    assert conftest.known_flags(conftest.QUICK_COMPILE)  # every XLA knows its levels
    assert not conftest.known_flags("--xla_no_such_flag_of_any_xla=true")


def test_a_started_process_keeps_the_suites_flags_but_its_own_devices(monkeypatch):
    level = f"{conftest.QUICK_COMPILE} {conftest.CLASSIC_EMITTERS}"
    monkeypatch.setenv("XLA_FLAGS", f"--xla_force_host_platform_device_count=8 {level}")
    assert helpers.xla_flags(2) == f"{level} --xla_force_host_platform_device_count=2"
    assert helpers.xla_flags() == level  # one device, as a user's machine
    assert helpers.xla_flags(optimized=True) == ""  # the demo's run: XLA's default level
    assert helpers.process_env(0, 1)["XLA_FLAGS"] == f"{level} " + (
        "--xla_force_host_platform_device_count=8"
    )


def test_an_optional_tiers_file_run_alone_is_a_skip_with_its_reason(monkeypatch):
    """`pytest tests/reference/test_moe_live.py` without the reference packages: a skip saying
    what to install (was the ImportError of its imports); the folder is left out as before."""
    monkeypatch.setattr(conftest, "_missing_reference_packages", lambda: ["torch"])
    live = os.path.join(conftest.HERE, "reference", "test_moe_live.py")
    assert conftest.unavailable(live) == (
        "the live references need torch: pip install '.[reference]'"
    )
    assert conftest.pytest_ignore_collect(os.path.dirname(live), None) is True
    assert conftest.unavailable(os.path.join(conftest.HERE, "unit", "test_tiers.py")) is None
    monkeypatch.delenv(conftest.GPU_TESTS_ENV, raising=False)
    assert "PPL_JAX_GPU_TESTS=1" in conftest.unavailable(os.path.join(conftest.HERE, "gpu", "x.py"))


def test_the_tokamax_tests_are_collected_only_where_tokamax_is_installed(monkeypatch):
    """Python 3.11, or 3.12 without the `gpu` extra: its files are left out (no skip shown);
    named alone, a skip saying what to install."""
    kernel_tests = os.path.join(conftest.HERE, "unit", "models", "test_tokamax_kernel.py")
    monkeypatch.setattr(conftest, "_tokamax_installed", lambda: False)
    assert conftest.unavailable(kernel_tests) == (
        "the tokamax kernel's tests need tokamax: pip install '.[gpu]' (Python >= 3.12)"
    )
    assert conftest.pytest_ignore_collect(kernel_tests, None) is True
    monkeypatch.setattr(conftest, "_tokamax_installed", lambda: True)
    assert conftest.unavailable(kernel_tests) is None
    assert conftest.pytest_ignore_collect(kernel_tests, None) is None
    monkeypatch.delenv(conftest.GPU_TESTS_ENV, raising=False)
    gpu = os.path.join(conftest.HERE, "gpu", "test_tokamax.py")
    assert "PPL_JAX_GPU_TESTS=1" in conftest.unavailable(gpu)
    monkeypatch.setenv(conftest.GPU_TESTS_ENV, "1")
    assert conftest.unavailable(gpu) is None


@pytest.mark.slow
def test_an_optional_tiers_file_run_alone_is_skipped_by_pytest(tmp_path):
    import subprocess
    import sys

    code = (
        "import sys; sys.modules['torch'] = None; import pytest; "  # torch not installed
        "sys.exit(pytest.main(['-n', '0', '-q', '-p', 'no:cacheprovider', '-rs', "
        "'tests/reference/test_moe_live.py']))"
    )
    r = subprocess.run([sys.executable, "-c", code], cwd=helpers.REPO, capture_output=True,
                       text=True, timeout=300)  # fmt: skip
    assert r.returncode in (0, 5), r.stdout[-2000:]  # 5: no test collected, only the skip
    assert "the live references need torch: pip install '.[reference]'" in r.stdout
    assert "1 skipped" in r.stdout and "Error" not in r.stdout


def test_every_smoke_case_exists_and_each_part_has_one():
    """`python -m pytest -m smoke` runs the cases `conftest.SMOKE` names: a name that no longer
    matches a case would leave its part out without a word."""
    parts = set()
    for entry in conftest.SMOKE:
        path, name = entry.split("::")
        with open(os.path.join(helpers.REPO, path), encoding="utf-8") as f:
            assert f"def {name.split('[')[0]}(" in f.read(), entry
        parts.add(path.split("/")[2] if path.startswith("tests/unit/") else path.split("/")[1])
    assert {"e2e", "evaluation", "checkpoints", "models", "scoring", "tokenizer"} <= parts
    assert conftest.is_smoke(
        "tests/unit/metrics/test_metrics.py::test_derived_metrics_against_numpy_float64"
    )
    assert conftest.is_smoke(
        "tests/unit/scoring/test_scoring.py::test_per_token_nll_matches_numpy_float64[mha-tied]"
    )
    assert not conftest.is_smoke(
        "tests/unit/evaluation/test_references.py::test_hf_strided_matches_the_hf_guide[gpt2-9-4]"
    )


def test_the_smoke_marker_is_declared():
    import tomllib

    with open(os.path.join(helpers.REPO, "pyproject.toml"), "rb") as f:
        markers = tomllib.load(f)["tool"]["pytest"]["ini_options"]["markers"]
    assert any(m.startswith("smoke:") for m in markers)
