"""Test setup: 8 fake CPU devices, set before JAX is imported; which optional folders are collected;
and shared fixtures.

- `tests/reference/`: the live references (PyTorch, transformers, lm-evaluation-harness), collected
  only when those packages (and accelerate, which lm-eval's HFLM needs) are importable
  (`pip install '.[reference]'`). Without them the default suite compares with the numbers they
  produced, committed in `tests/golden/`.
- `tests/shared_data/`: tests on data the project may not ship (WikiText-2, the GPT-2 tokenizer),
  collected only when the environment variable PPL_JAX_TEST_DATA names an existing folder.
- `tests/gpu/`: the cuDNN attention path on an NVIDIA GPU, collected only when
  PPL_JAX_GPU_TESTS=1; then JAX is not held to the CPU (the 8 fake devices are CPU devices).
- the tokamax kernel's tests (`TOKAMAX_PATHS`: its Triton kernel interpreted on CPU, and in
  tests/gpu/ its kernels on the GPU), collected only where tokamax is installed
  (`pip install '.[gpu]'`, Python >= 3.12).

A folder that is not collected adds no skipped tests; the pytest header says what ran.
"""

import importlib.util
import os

os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
).strip()
# One persistent compilation cache for the whole test run and the processes it starts (the CLI's
# subprocess runs compile the same demo and tiny models again and again), kept between runs.
os.environ.setdefault(
    "JAX_COMPILATION_CACHE_DIR",
    os.path.join(
        os.path.dirname(os.path.dirname(os.path.abspath(__file__))), ".pytest_cache", "jax"
    ),
)
# Every compile is kept, however short: at optimisation level 0 most compiles take under half a
# second, and the two workers and the CLI's processes compile the same small programs (measured on
# tests/e2e, evaluation and analysis: 139 s with a 0.5 s floor, 116 s with none).
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
GPU_TESTS_ENV = "PPL_JAX_GPU_TESTS"
if os.environ.get(GPU_TESTS_ENV) == "1":
    # tests/gpu/ on the machine's GPU; processes the tests start share it with this one.
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
else:
    os.environ.setdefault("JAX_PLATFORMS", "cpu")

import sys  # noqa: E402

import pytest  # noqa: E402

import helpers  # noqa: E402

# Tests mirror the package (tests/unit/<subpackage>/) and the tiers (tests/e2e, multiprocess,
# slow); the live references import the tests they re-run live by module name (`import test_hf`),
# so every test folder is importable, as pytest's default import mode makes the folder it collects.
for _folder, _, _names in os.walk(os.path.dirname(os.path.abspath(__file__))):
    if any(n.startswith("test_") and n.endswith(".py") for n in _names) and _folder not in sys.path:
        sys.path.append(_folder)

REFERENCE_PACKAGES = ("torch", "transformers", "lm_eval", "accelerate")
HERE = os.path.dirname(os.path.abspath(__file__))


def _missing_reference_packages() -> list[str]:
    return [name for name in REFERENCE_PACKAGES if importlib.util.find_spec(name) is None]


def _test_data_dir() -> str | None:
    """The folder PPL_JAX_TEST_DATA names, if it exists."""
    path = os.environ.get(helpers.TEST_DATA_ENV, "")
    return os.path.abspath(path) if path and os.path.isdir(path) else None


HARNESS_PATHS = {
    os.path.join(HERE, "unit", "harness"),
    os.path.join(HERE, "e2e", "test_harness_cli.py"),
    os.path.join(HERE, "multiprocess", "test_harness_processes.py"),
}
TOKAMAX_PATHS = {
    os.path.join(HERE, "unit", "models", "test_tokamax_kernel.py"),
    os.path.join(HERE, "gpu", "test_tokamax.py"),
}


def _tokamax_installed() -> bool:
    return importlib.util.find_spec("tokamax") is not None


def unavailable(path) -> str | None:
    """Why the optional tier that holds `path` (a file or folder) cannot run here, or None: the
    live references without their packages, the shared-data tests without their folder, the GPU
    tests unasked, the harness without lm_eval."""
    path = os.path.abspath(str(path))

    def within(folder: str) -> bool:
        return path == folder or path.startswith(folder + os.sep)

    if within(os.path.join(HERE, "reference")) and _missing_reference_packages():
        missing = ", ".join(_missing_reference_packages())
        return f"the live references need {missing}: pip install '.[reference]'"
    if within(os.path.join(HERE, "shared_data")) and _test_data_dir() is None:
        return f"the shared-data tests need {helpers.TEST_DATA_ENV} to name the data folder"
    if within(os.path.join(HERE, "gpu")) and os.environ.get(GPU_TESTS_ENV) != "1":
        return f"the GPU tests run with {GPU_TESTS_ENV}=1, on a machine with a GPU"
    if any(within(p) for p in HARNESS_PATHS) and importlib.util.find_spec("lm_eval") is None:
        return "the harness tests need lm_eval: pip install '.[harness]'"
    if any(within(p) for p in TOKAMAX_PATHS) and not _tokamax_installed():
        return "the tokamax kernel's tests need tokamax: pip install '.[gpu]' (Python >= 3.12)"
    return None


def pytest_ignore_collect(collection_path, config):
    """An optional tier's folder is left out of a run that cannot run it (see `unavailable`)."""
    path = os.path.abspath(str(collection_path))
    optional = {os.path.join(HERE, f) for f in ("reference", "shared_data", "gpu")}
    if path in optional | HARNESS_PATHS | TOKAMAX_PATHS:
        return True if unavailable(path) else None
    return None


class _Unavailable(pytest.File):
    """An optional tier's file named on the command line where the tier cannot run: one skip
    with the reason, not the ImportError of its imports."""

    def collect(self):
        raise pytest.skip.Exception(unavailable(self.path), allow_module_level=True)


def pytest_pycollect_makemodule(module_path, parent):
    # Folders of optional tiers are left out (`pytest_ignore_collect`); a file named alone is not.
    if unavailable(module_path):
        return _Unavailable.from_parent(parent, path=module_path)
    return None


def pytest_report_header(config) -> list[str]:
    missing = _missing_reference_packages()
    refs = (
        "live references: ran (tests/reference: torch, transformers, lm_eval, accelerate)"
        if not missing
        else f"live references: not run, golden files only ({', '.join(missing)} not installed; "
        "pip install '.[reference]')"
    )
    data = _test_data_dir()
    shared = (
        f"shared data tests: ran (tests/shared_data, {helpers.TEST_DATA_ENV}={data})"
        if data
        else f"shared data tests: not run ({helpers.TEST_DATA_ENV} names no folder)"
    )
    harness = (
        "harness tests: ran (tests/unit/harness)"
        if importlib.util.find_spec("lm_eval") is not None
        else "harness tests: not run (lm_eval not installed; pip install '.[harness]')"
    )
    tokamax = (
        "tokamax tests: ran (tests/unit/models/test_tokamax_kernel.py)"
        if _tokamax_installed()
        else "tokamax tests: not run (tokamax not installed; pip install '.[gpu]', Python >= 3.12)"
    )
    return [f"ppl_jax: {refs}; {shared}; {harness}; {tokamax}"]


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory) -> str:
    """A random tiny Llama (untied head, GQA) saved as a training state at steps 3 and 5."""
    path = str(tmp_path_factory.mktemp("ckpt") / "tiny")
    helpers.save_random_checkpoint(path, steps=(3, 5))
    return path


@pytest.fixture(scope="session")
def demo_checkpoint() -> str:
    from ppl_jax.config.defaults import demo_checkpoint_dir

    path = demo_checkpoint_dir()
    if not os.path.isdir(path):
        pytest.fail(f"the demo checkpoint is missing at {path}; run launch/train_demo.py")
    return path


@pytest.fixture(scope="session")
def bpe_tokenizer(tmp_path_factory) -> str:
    """Path of a byte-level BPE tokenizer.json (512 ids, `<|endoftext|>` = 0) trained at test time
    on standard-library source (`helpers.train_bpe`)."""
    return helpers.bpe_file(str(tmp_path_factory.mktemp("bpe") / "bpe.json"))


@pytest.fixture(scope="session")
def test_data() -> str:
    """The folder of data the project may not ship (PPL_JAX_TEST_DATA); only tests/shared_data/
    uses it, and that folder is collected only when it exists."""
    path = _test_data_dir()
    assert path is not None
    return path


# Tiers: the top folder under tests/ is the tier (pyproject.toml declares the markers; `python -m
# pytest` runs the default tiers, without `slow` and `multiprocess`; `python -m pytest -m "slow or
# multiprocess"` runs the rest). Beside the folder, a test file may add `slow` itself
# (`@pytest.mark.slow` on a case, or a module's `pytestmark`): the costliest variants of checks
# whose other cases stay in the default tiers, and the long e2e scenarios. `multiprocess` is the
# folder and nothing else: a case marked so elsewhere stops the collection, and a test elsewhere
# that starts several processes fails (`helpers.process_env`).
TIER_FOLDERS = ("e2e", "multiprocess", "slow")


# The smoke tier (`python -m pytest -m smoke`: an install checked in about a minute on 2 cores):
# a few cases of the default tiers that run each part end to end, named here in one place (a
# case renamed or removed fails tests/unit/test_tiers.py). A name without `[...]` takes every
# parameter of its case.
SMOKE = (
    "tests/e2e/test_cli.py::test_default_run_scores_the_shipped_held_out_text",  # the demo run
    "tests/e2e/test_report_cli.py::test_table_csv_and_png",  # a report
    "tests/unit/evaluation/test_references.py::test_hf_strided_matches_the_hf_guide[gpt2-16-5]",
    "tests/unit/checkpoints/test_readers_golden.py::test_sharded_safetensors_logits_equal_the_writers",
    "tests/unit/checkpoints/test_checkpoint.py::test_restore_params_reads_the_chosen_step",
    "tests/unit/models/test_families.py::test_matches_transformers[qwen3-sliding]",
    "tests/unit/tokenizer/test_tokenizer_hf.py::test_ids_and_specials_match_transformers_golden"
    "[llama_json-add_bos_token_True]",
    "tests/unit/scoring/test_scoring.py::test_per_token_nll_matches_numpy_float64",
    "tests/unit/metrics/test_metrics.py::test_derived_metrics_against_numpy_float64",
    "tests/unit/data/test_data.py::test_jsonl_format_reads_the_text_field",
    "tests/unit/outputs/test_store.py::test_round_trip_done_and_replace",
    "tests/unit/config/test_config.py::test_described_defaults_are_the_config_values",
)


def is_smoke(nodeid: str) -> bool:
    """Whether the case `nodeid` (`tests/...::name[params]`) is one of `SMOKE`'s."""
    return nodeid in SMOKE or nodeid.split("[")[0] in SMOKE


def tier_of(path) -> str | None:
    """The tier of a test file: its top folder under tests/ if that is a tier's, else None."""
    top = os.path.relpath(os.path.abspath(str(path)), HERE).split(os.sep)[0]
    return top if top in TIER_FOLDERS else None


# The default tiers' models are tiny: most of their time is XLA's CPU compiler, not the run. They
# compile at XLA's backend optimisation level 0, which takes a third less time, and with XLA's
# classic elemental emitters for fusions instead of its MLIR fusion emitters, which halves the
# rest (tests/unit/models/test_split_merge.py and test_gguf_packed.py: 61 s -> 29 s on 2 cores;
# the whole default tier: docs/development.md). The rounding is not always the same as a user's
# run (LLVM fuses fewer multiply-adds), so the tiers whose bounds are tightest, `slow` and
# `multiprocess`, compile as a user's run does; so does any selection other than the default one
# (pyproject.toml's `addopts`), and a level named in the user's XLA_FLAGS wins. An XLA that no
# longer knows the emitters' flag (jaxlib 0.12's; XLA stops at an unknown flag) is not given it
# (`known_flags`, asked once, in a process of its own). Set here, before the first computation creates JAX's CPU
# client (importing JAX reads no XLA flag); the processes tests start keep the flags
# (`helpers.xla_flags`).
QUICK_COMPILE = "--xla_backend_optimization_level=0"
CLASSIC_EMITTERS = "--xla_cpu_use_fusion_emitters=false"


def known_flags(flags: str) -> bool:
    """Whether this process's XLA starts a CPU client with `flags` (an unknown flag stops it)."""
    import subprocess

    probe = "import jax; jax.devices()"
    env = dict(os.environ, XLA_FLAGS=flags, JAX_PLATFORMS="cpu")
    run = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, timeout=120)
    return run.returncode == 0


def default_selection(addopts: list[str]) -> str:
    """The `-m` expression of pyproject.toml's `addopts` (the README's test command), given as
    pytest reads the option (split into arguments)."""
    return addopts[addopts.index("-m") + 1]


def compile_flags(flags: str, selection: str, default: str, *, classic: bool = True) -> str:
    """XLA_FLAGS for a run that selects `selection`: `flags`, with level 0 (and, where `classic`,
    the classic emitters) added when the selection is the default one and `flags` name no
    level."""
    if selection != default or "--xla_backend_optimization_level" in flags:
        return flags
    quick = f"{QUICK_COMPILE} {CLASSIC_EMITTERS}" if classic else QUICK_COMPILE
    return f"{flags} {quick}".strip()


def pytest_xdist_auto_num_workers(config) -> int:
    """`-n auto` (pyproject.toml's `addopts`): one worker more than the cores (`--maxprocesses`
    caps it at 4). A worker is idle while a process it started runs or while it reads and
    writes files; on 2 cores 3 workers ran the default tiers in 305 s, 2 in 329 s (quiet cores,
    JAX's compilation cache empty)."""
    return (os.cpu_count() or 1) + 1


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist starts its workers
def pytest_configure(config):
    if config.option.markexpr == "smoke":  # one process: workers would each collect the suite
        config.option.numprocesses, config.option.dist = 0, "no"
    default = default_selection(config.getini("addopts"))
    selection = config.option.markexpr
    flags = os.environ["XLA_FLAGS"]
    quick = compile_flags(flags, default if selection == "smoke" else selection, default)
    if CLASSIC_EMITTERS in quick and CLASSIC_EMITTERS not in flags and not known_flags(quick):
        quick = compile_flags(flags, default, default, classic=False)
    os.environ["XLA_FLAGS"] = quick  # pytest-xdist's workers inherit it: asked once


def pytest_collection_modifyitems(config, items):
    misplaced = []
    for item in items:
        tier = tier_of(item.path)
        if tier is not None:
            item.add_marker(getattr(pytest.mark, tier))
        elif item.get_closest_marker("multiprocess") is not None:
            misplaced.append(item.nodeid)
        if is_smoke(item.nodeid):
            item.add_marker(pytest.mark.smoke)
    if misplaced:
        raise pytest.UsageError(
            f"{misplaced[0]} is marked multiprocess outside tests/multiprocess/ "
            f"({len(misplaced)} such cases): move it there (the tier is the folder)."
        )
