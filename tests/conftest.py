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
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.5")
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


def pytest_ignore_collect(collection_path, config):
    path = os.path.abspath(str(collection_path))
    if path == os.path.join(HERE, "reference"):
        return True if _missing_reference_packages() else None
    if path == os.path.join(HERE, "shared_data"):
        return True if _test_data_dir() is None else None
    if path == os.path.join(HERE, "gpu"):
        return True if os.environ.get(GPU_TESTS_ENV) != "1" else None
    if path in HARNESS_PATHS:  # the harness model runs lm_eval's own code (the `harness` extra)
        return True if importlib.util.find_spec("lm_eval") is None else None
    return None


HARNESS_PATHS = {
    os.path.join(HERE, "unit", "harness"),
    os.path.join(HERE, "multiprocess", "test_harness_processes.py"),
}


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
    return [f"ppl_jax: {refs}; {shared}; {harness}"]


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


# Tiers (pyproject.toml declares the markers; `python -m pytest` runs the default tiers, without
# `slow` and `multiprocess`; `python -m pytest -m "slow or multiprocess"` runs the rest).
E2E_FILES = {  # run the command line in a subprocess
    "test_cli.py", "test_errors_cli.py", "test_help.py", "test_fail_early.py",
    "test_report_cli.py", "test_launchers.py", "test_resume_cli.py", "test_wikitext_cli.py",
    "test_examples.py", "test_other_trainers_cli.py",
}  # fmt: skip
MULTIPROCESS_FILES = {
    "test_distributed.py", "test_plan_agreement.py", "test_bench_data.py", "test_harness_processes.py",
    "test_stacked_reads.py", "test_hub_processes.py",
}  # fmt: skip
MULTIPROCESS_NAMES = ("two_processes", "2p]", "a_bad_share_stops_both")
SLOW_NAMES = (  # the costliest cases of files whose other tests stay in the default tiers
    "test_bfloat16_within_1e3_of_float32",
    "test_converts_to_orbax_and_scores_the_same",
    "test_invariant_to_batch_size_order_and_mesh",
    "test_nearly_identical_models_kl_within_1e_8",
    "test_different_models_kl_within_float32_rounding",
    "test_demo_model_loss_falls_with_context_and_bfloat16_drifts_a_little",
    "test_maxtext_converted_to_own_layout_restores_bit_for_bit",
    "test_conversion_to_orbax_restores_the_same_params[bfloat16]",
    "test_orbax_restore_is_restore_params[bfloat16]",
)
SLOW_FILES = {
    "test_resume_cli.py", "test_sweep.py", "test_invariance.py", "test_compare_trust.py",
    "test_other_trainers_cli.py", "test_examples.py",
    "test_harness_cli.py", "test_other_trainers_sweep.py", "test_long_window.py",
    "test_context_grid.py",
}  # fmt: skip


def pytest_collection_modifyitems(config, items):
    for item in items:
        name = os.path.basename(str(item.fspath))
        if name in E2E_FILES:
            item.add_marker(pytest.mark.e2e)
        if name in MULTIPROCESS_FILES or any(s in item.nodeid for s in MULTIPROCESS_NAMES):
            item.add_marker(pytest.mark.multiprocess)
        if name in SLOW_FILES or any(s in item.nodeid for s in SLOW_NAMES):
            item.add_marker(pytest.mark.slow)
