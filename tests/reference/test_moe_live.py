"""ppl_jax's MoE layer against transformers' own `MixtralSparseMoeBlock`, `Qwen2MoeSparseMoeBlock`,
`Qwen3MoeSparseMoeBlock` and `OlmoeSparseMoeBlock`, run now in torch float32 on the weights of
tests/golden/make_moe_golden.py; and the committed golden files are what they compute today."""

import importlib.util
import os

import jax.numpy as jnp
import numpy as np
import pytest
import test_moe

from ppl_jax.models.families import mixture
from ppl_jax.models.layers.moe import dropless

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
    _, chosen = dropless.route(flat, params["router"], top_k, norm)
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


@pytest.mark.parametrize("model_type", mixture.MODEL_TYPES)
def test_spec_and_sparse_layers_as_transformers_builds_them(model_type):
    """`mixture.moe_spec` and `sparse_layers` on a saved config (defaults filled by
    transformers) give the shapes and MoE layers of transformers' own decoder layers."""
    import importlib

    from transformers import AutoConfig

    extra = {"decoder_sparse_step": 2, "mlp_only_layers": [3]} if "qwen" in model_type else {}
    config = AutoConfig.for_model(
        model_type, hidden_size=16, intermediate_size=40, num_hidden_layers=6,
        num_attention_heads=2, num_key_value_heads=2, **extra,
    )  # fmt: skip
    c = config.to_dict()
    spec = mixture.moe_spec(c)
    modeling = importlib.import_module(f"transformers.models.{model_type}.modeling_{model_type}")
    prefix = {
        "mixtral": "Mixtral",
        "qwen2_moe": "Qwen2Moe",
        "qwen3_moe": "Qwen3Moe",
        "olmoe": "Olmoe",
    }
    layer_class = getattr(modeling, f"{prefix[model_type]}DecoderLayer")
    block_class = getattr(modeling, f"{prefix[model_type]}SparseMoeBlock")
    config._experts_implementation = "eager"
    layers = [layer_class(config, i) for i in range(6)]
    assert mixture.sparse_layers(c) == tuple(
        i for i, layer in enumerate(layers) if isinstance(layer.mlp, block_class)
    )
    block = layers[mixture.sparse_layers(c)[0]].mlp
    assert block.gate.weight.shape == (spec.num_experts, spec.embed_dim)
    assert block.gate.top_k == spec.top_k
    assert tuple(block.experts.down_proj.shape) == (spec.num_experts, 16, spec.mlp_dim)
    assert getattr(block.gate, "norm_topk_prob", True) == spec.norm_topk_prob
    shared = getattr(block, "shared_expert", None)
    assert (shared.gate_proj.weight.shape[0] if shared else 0) == spec.shared_mlp_dim


@pytest.mark.parametrize("model_type", mixture.MODEL_TYPES)
def test_weights_saved_by_transformers_load_and_score_alike(model_type, tmp_path):
    """A tiny random model saved by transformers (per-expert tensors on disk): the mixture rules
    stacks its first block, whose output on random states equals transformers' block's."""
    import torch
    from safetensors.numpy import load_file
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(
        model_type, hidden_size=16, intermediate_size=24, moe_intermediate_size=24,
        shared_expert_intermediate_size=20, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=2, vocab_size=32, num_local_experts=8, num_experts=8,
        num_experts_per_tok=3, norm_topk_prob=model_type != "olmoe",
    )  # fmt: skip
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).eval()
    model.save_pretrained(tmp_path)
    tensors = load_file(str(tmp_path / "model.safetensors"))
    spec = mixture.moe_spec(config.to_dict())
    tensors = {k.removeprefix("model."): v for k, v in tensors.items() if ".layers.0.mlp" in k
               or ".layers.0.block_sparse_moe" in k}  # fmt: skip
    params = test_moe.hf_block_params(tensors, spec, model_type)
    x = np.random.default_rng(0).standard_normal((2, 9, 16)).astype(np.float32)
    with torch.no_grad():
        expected = model.model.layers[0].mlp(torch.from_numpy(x)).numpy()
    p = {k: jnp.asarray(v) for k, v in params.items()}
    if spec.shared_mlp_dim:
        p["shared_expert"] = tuple(p.pop(k) for k in test_moe.SHARED_NAMES)
    y = test_moe.call(p, jnp.asarray(x), spec.top_k, spec.norm_topk_prob)
    assert test_moe.rel_diff(y, expected) < 1e-6
