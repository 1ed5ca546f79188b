"""tests/unit/models/test_rope_long.py against transformers itself, live: the committed rotary
golden is what the installed transformers computes, and ppl_jax's angles equal it far past every
original length."""

import importlib.util
import os

import numpy as np
import pytest
import test_rope_long

import helpers


@pytest.fixture(scope="module")
def fresh():
    spec = importlib.util.spec_from_file_location(
        "make_rope_golden", os.path.join(helpers.GOLDEN, "make_rope_golden.py")
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.compute()


def test_the_rope_golden_is_current(fresh, golden):
    (meta, arrays), (stored_meta, stored) = fresh, golden
    assert meta["cases"] == stored_meta["cases"] and sorted(arrays) == sorted(stored)
    for key, value in arrays.items():
        if key.endswith(("inv_freq", "powers")):
            np.testing.assert_array_equal(value, stored[key], err_msg=key)
        else:  # cosines of one float32 library release against another's
            np.testing.assert_allclose(value, stored[key], rtol=0, atol=2.4e-7, err_msg=key)


@pytest.mark.parametrize("name", test_rope_long.CASES)
def test_float32_angles_equal_transformers_live(fresh, name):
    test_rope_long.test_float32_angles_equal_transformers_far_past_the_original_length(fresh, name)


golden = test_rope_long.golden
