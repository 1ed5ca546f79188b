"""The golden files are what the installed references compute today: tests/golden/make_golden.py's
numbers, recomputed from the committed models, against the committed numbers."""

import json
import os

import numpy as np
import pytest

import helpers


@pytest.fixture(scope="module")
def make_golden():
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "make_golden", os.path.join(helpers.GOLDEN, "make_golden.py")
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def assert_same(stored, fresh, where: str = "") -> None:
    """Equal structure; equal ints and strings; floats within 1e-6 relative (PyTorch's CPU
    kernels may change their summation order between versions), perplexities through their
    logarithm."""
    if isinstance(stored, dict):
        assert sorted(stored) == sorted(fresh), where
        for key in stored:
            if key != "generated_with":
                assert_same(stored[key], fresh[key], f"{where}/{key}")
    elif isinstance(stored, list):
        assert len(stored) == len(fresh), where
        for i, (a, b) in enumerate(zip(stored, fresh, strict=True)):
            assert_same(a, b, f"{where}[{i}]")
    elif isinstance(stored, float) and where.endswith("perplexity") and stored > 0 < fresh:
        # exp(mean NLL): compare the mean NLL itself within 1e-6 relative, as every other float
        # (the random models' perplexities run to 1e12, where 1e-6 relative of the perplexity
        # is a 4e-8 relative change of the NLL, below float32's summation noise).
        np.testing.assert_allclose(np.log(fresh), np.log(stored), rtol=1e-6, err_msg=where)
    elif isinstance(stored, float):
        assert isinstance(fresh, float), where
        np.testing.assert_allclose(fresh, stored, rtol=1e-6, atol=1e-6, err_msg=where)
    else:
        assert stored == fresh, where


@pytest.mark.parametrize(
    "name", ["hf/log_probs.json", "references/references.json", "lm_eval_windows.json"]
)
def test_golden_numbers_are_current(make_golden, name):
    fresh = {
        "hf/log_probs.json": make_golden.hf_numbers,
        "references/references.json": make_golden.reference_numbers,
        "lm_eval_windows.json": make_golden.window_numbers,
    }[name]()
    with open(os.path.join(helpers.GOLDEN, name), encoding="utf-8") as f:
        stored = json.load(f)
    assert_same(stored, json.loads(json.dumps(fresh)), name)
