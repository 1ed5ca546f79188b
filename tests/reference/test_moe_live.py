"""ppl_jax's MoE layer against transformers' own `MixtralSparseMoeBlock`, `Qwen2MoeSparseMoeBlock`,
`Qwen3MoeSparseMoeBlock` and `OlmoeSparseMoeBlock`, run now in torch float32 on the weights of
tests/golden/make_moe_golden.py; and the committed golden files are what they compute today."""

import importlib.util
import os

import jax.numpy as jnp
import numpy as np
import pytest
import test_moe

from ppl_jax.models import moe

import helpers


@pytest.fixture(scope="module")
def make_moe_golden():
    path = os.path.join(helpers.GOLDEN, "make_moe_golden.py")
    spec = importlib.util.spec_from_file_location("make_moe_golden", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


CASES = [
    "mixtral",
    "qwen2_moe",
    "qwen3_moe",
    "qwen3_moe_unnormalised",
    "olmoe",
    "tie_inside",
    "tie_boundary",
]


@pytest.mark.parametrize("name", CASES)
def test_layer_equals_transformers_block(make_moe_golden, name):
    fresh = make_moe_golden.run_case(name)
    top_k, norm = int(fresh["top_k"]), bool(fresh["norm_topk_prob"])
    params = test_moe.hf_to_ppl(fresh)
    x = jnp.asarray(fresh["x"])
    y = np.asarray(test_moe.call(params, x, top_k, norm))
    flat = x.reshape(-1, x.shape[-1])
    _, chosen = moe.route(flat, params["router"], top_k, norm)
    same = np.array(
        [
            set(a) == set(b)
            for a, b in zip(np.asarray(chosen).tolist(), fresh["experts"].tolist(), strict=True)
        ]
    )
    if name != "tie_boundary":
        assert same.all()
    else:  # torch.topk's choice between tied experts at the k-th place (see moe's docstring)
        assert 0 < same.sum() < len(same)
    y, ref = y.reshape(flat.shape), fresh["y"].reshape(flat.shape)
    assert test_moe.rel_diff(y[same], ref[same]) < 1e-6
    # The committed golden file is what transformers computes today.
    stored = test_moe.load_golden(name)
    np.testing.assert_array_equal(stored["experts"], fresh["experts"])
    assert test_moe.rel_diff(stored["y"], fresh["y"]) < 1e-6
