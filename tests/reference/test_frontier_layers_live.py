"""tests/slow/test_frontier_layers.py's comparisons with transformers, live: each case of
tests/golden/make_frontier_layers_golden.py rerun now with the installed transformers in torch
float32; the committed golden files are what it computes today."""

import importlib.util
import os

import numpy as np
import pytest
import test_frontier_layers

import helpers


@pytest.fixture(scope="module")
def recipe():
    path = os.path.join(helpers.GOLDEN, "make_frontier_layers_golden.py")
    spec = importlib.util.spec_from_file_location("make_frontier_layers_golden", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_cases_are_those_of_the_golden_files(recipe):
    stored = sorted(n[: -len(".npz")] for n in os.listdir(test_frontier_layers.GOLDEN))
    assert sorted(recipe.CASES) == stored


@pytest.mark.parametrize(
    "name", sorted(test_frontier_layers.ROUTED + list(test_frontier_layers.MLA_ROPE))
    + ["llama4_attention_nope", "llama4_attention_rope"],
)  # fmt: skip
def test_golden_file_is_what_transformers_computes_today(recipe, name):
    fresh = recipe.run_case(name)
    stored = test_frontier_layers.golden(name)
    assert sorted(fresh) == sorted(stored)
    for key, value in stored.items():
        if key.startswith("w:") or key in ("x", "positions", "experts"):
            np.testing.assert_array_equal(fresh[key], value, err_msg=key)
        else:
            assert test_frontier_layers.rel_diff(fresh[key], value) < 1e-6, key
