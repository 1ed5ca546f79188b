"""tests/unit/checkpoints/test_hf.py's comparisons with PyTorch, live: tiny random transformers models saved by the
installed transformers (so that a change in what `save_pretrained` writes shows), scored by
PyTorch and by ppl_jax."""

import os

import pytest
import torch

import recipes
import test_hf


@pytest.fixture(scope="module")
def live_models(tmp_path_factory) -> dict:
    """family -> (directory, the PyTorch model). Llama is saved in sharded safetensors."""
    root = tmp_path_factory.mktemp("hf")
    return {
        name: (str(root / name), recipes.save_hf_family(name, str(root / name)))
        for name in recipes.HF_FAMILIES
    }


def test_the_families_are_those_of_the_golden_files(live_models):
    assert tuple(live_models) == test_hf.FAMILIES
    assert os.path.isfile(os.path.join(live_models["llama"][0], "model.safetensors.index.json"))


@pytest.mark.parametrize("family,mesh_shape", test_hf.MESH_CASES)
def test_log_probs_match_pytorch_live(live_models, family, mesh_shape):
    path, model = live_models[family]
    tokens = recipes.hf_tokens()
    ref = recipes.torch_log_probs(model, tokens)
    test_hf.check_log_probs(path, tokens, ref, mesh_shape)


def test_descriptions_live(live_models):
    test_hf.check_descriptions({name: path for name, (path, _) in live_models.items()})


@pytest.mark.parametrize("family,change", test_hf.CHANGES)
def test_the_comparison_sees_rope_scaling_and_sliding_window_live(live_models, family, change):
    path, model = live_models[family]
    tokens = recipes.hf_tokens()
    test_hf.check_sees_change(path, tokens, recipes.torch_log_probs(model, tokens), change)


def test_bfloat16_saved_by_pytorch(live_models, tmp_path):
    path, model = live_models["gpt2"]
    model.to(torch.bfloat16).save_pretrained(str(tmp_path / "bf16"))
    model.to(torch.float32)
    test_hf.check_bfloat16(path, str(tmp_path / "bf16"))
