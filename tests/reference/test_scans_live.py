"""ppl_jax's Gated DeltaNet and Mamba2 layers against transformers' own `Qwen3_5GatedDeltaNet`,
`Qwen3NextGatedDeltaNet`, `Mamba2Mixer`, `NemotronHMamba2Mixer` and `FalconH1Mixer`, run now in
torch float32 on the weights of tests/golden/make_scan_golden.py; and the committed golden files
are what they compute today."""

import importlib.util
import os

import numpy as np
import pytest
import test_scan_layers

import helpers


@pytest.fixture(scope="module")
def make_scan_golden():
    path = os.path.join(helpers.GOLDEN, "make_scan_golden.py")
    spec = importlib.util.spec_from_file_location("make_scan_golden", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("name", test_scan_layers.CASES)
def test_layer_equals_transformers_layer(make_scan_golden, name):
    fresh = make_scan_golden.run_case(name)
    layer, scale = test_scan_layers.layer_of(name, fresh)
    y = test_scan_layers.run(layer, fresh["x"], np.ones(fresh["x"].shape[:2], np.int32), scale)
    assert test_scan_layers.rel_diff(y, fresh["y"]) < 5e-6
    stored = test_scan_layers.load_golden(name)
    assert sorted(stored) == sorted(fresh)
    for key in stored:
        if key == "y":  # PyTorch's float32 recurrence rounds with the CPU's vector width
            assert test_scan_layers.rel_diff(fresh[key], stored[key]) < 5e-6, key
            continue
        np.testing.assert_allclose(fresh[key], stored[key], rtol=1e-6, atol=1e-6, err_msg=key)
