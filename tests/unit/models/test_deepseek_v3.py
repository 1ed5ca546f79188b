"""DeepSeek-V3 (`ppl_jax.models.families.deepseek_v3`): its reading of `config.json`, each feature
shown to matter, what it refuses, and the results' invariance to batch, packing and experts over
the `model` axis. Against transformers' float32 log-probabilities of the committed tiny model
(tests/golden/families/deepseek_v3, by tests/golden/make_frontier_golden.py: MLA with a query
bottleneck and values narrower than keys, YaRN with `mscale_all_dim`, a dense first layer, 8
experts in 4 groups with a drawn correction bias, a shared expert, a stored multi-token-prediction
layer) the per-token NLL, `nll_sum` and token counts are checked on `sliding`, `hf_strided` and
`lm_eval_rolling` by `test_families.test_matches_transformers` (bfloat16 in its slow tier)."""

from __future__ import annotations

import json
import os
import shutil

import family_checks
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from test_families import FAMILY_DIR, golden, loaded, protocol_nll

from ppl_jax.checkpoints.formats import safetensors
from ppl_jax.errors import CheckpointError
from ppl_jax.models import registry

FAMILY = "deepseek_v3"
PATH = os.path.join(FAMILY_DIR, FAMILY)


def test_the_description_reads_every_feature():
    d = safetensors.read_description(PATH)
    assert d["family"] == FAMILY and d["model_type"] == FAMILY
    assert (d["q_lora_rank"], d["kv_lora_rank"]) == (16, 16)
    assert (d["head_dim"], d["qk_nope_head_dim"], d["v_head_dim"]) == (8, 8, 12)
    assert d["num_kv_heads"] == d["num_heads"] == 4 and d["rope_interleave"]
    assert d["moe_layers"] == [1, 2] and d["mlp_dim"] == 64
    assert (d["moe_experts"], d["moe_top_k"], d["moe_mlp_dim"]) == (8, 3, 16)
    assert (d["moe_groups"], d["moe_top_groups"], d["moe_scaling"]) == (4, 2, 2.5)
    assert d["moe_shared_mlp_dim"] == 16 and d["moe_norm_topk_prob"]
    assert d["rope_type"] == "yarn" and d["mtp_layers"] == 1
    mscale = 0.1 * 0.8 * np.log(4.0) + 1.0  # yarn_get_mscale(factor 4, mscale_all_dim 0.8)
    assert d["query_scale"] == pytest.approx(16**-0.5 * mscale**2, rel=1e-12)
    assert d["rope_attention_factor"] == pytest.approx((0.1 * np.log(4.0) + 1.0) / mscale)
    kinds = registry.for_description(d).layer_kinds(registry.config_of(d))
    assert [k.mlp for k in kinds] == ["dense", "moe", "moe"]


def _config(tmp_path, **change):
    config = json.loads(open(os.path.join(PATH, "config.json")).read())
    config.update(change)
    (tmp_path / "config.json").write_text(json.dumps(config))


@pytest.mark.parametrize(
    "change, message",
    [
        ({"hidden_act": "gelu"}, "hidden_act 'gelu' is not supported"),
        ({"n_group": 3}, "n_group=3 must divide the 8 experts"),
        ({"num_experts_per_tok": 7}, "num_experts_per_tok=7 exceeds the 4 experts"),
        ({"kv_lora_rank": 1 << 30}, "kv_lora_rank=1073741824 is not a whole number from 1 to"),
        ({"quantization_config": {"quant_method": "hqq"}}, "'hqq', which ppl_jax does not read"),
    ],
)
def test_configs_it_cannot_build_are_one_sentence(tmp_path, change, message):
    _config(tmp_path, **change)
    with pytest.raises(CheckpointError, match=message):
        registry.build(safetensors.read_description(str(tmp_path)), jnp.float32)


# Each feature turned off moves the result well past the tolerance: the comparison sees it.
@pytest.mark.slow
@pytest.mark.parametrize(
    "change",
    [
        {"query_scale": 16**-0.5},  # YaRN's mscale_all_dim on the softmax scale
        {"rope_interleave": False},  # halves rotated, not adjacent pairs
        {"rope_attention_factor": 1.0},  # YaRN's cos/sin factor
        {"moe_scaling": 1.0},  # routed_scaling_factor
        {"moe_top_groups": 4},  # no group limit
        {"moe_norm_topk_prob": False},
        {"moe_top_k": 2},
    ],
)
def test_the_comparison_sees_each_feature(change):
    assert family_checks.largest_change(FAMILY, change) > 1e-2


def test_the_comparison_sees_the_correction_bias():
    model, params = loaded(FAMILY)
    params = jax.tree.map(lambda x: x, params)  # `loaded`'s cached tree stays whole for others
    for layer in ("1", "2"):
        params["layers"][layer]["mlp"]["router_bias"] = jnp.zeros_like(
            params["layers"][layer]["mlp"]["router_bias"]
        )
    ours = np.concatenate(protocol_nll(golden(FAMILY), "sliding", model, params))
    assert np.max(np.abs(ours - family_checks.reference(FAMILY))) > 1e-2


def test_the_multi_token_prediction_layer_is_left_unread(tmp_path):
    """The stored layer 3 (after the 3 decoder layers) is not the causal LM's: the rules leave
    it; a config without it (`num_nextn_predict_layers` 0) reads as weights of 4 layers."""
    d = safetensors.read_description(PATH)
    assert registry.hf_mapping(d)[1][0] == {"from": r"layers\.(3)\..+", "to": None}
    _config(tmp_path, num_nextn_predict_layers=0)
    shutil.copy(os.path.join(PATH, "model.safetensors"), tmp_path)
    with pytest.raises(CheckpointError, match="describes 3 layers but the safetensors weights"):
        safetensors.read_description(str(tmp_path))


def test_refuses_a_context_axis_before_reading_weights():
    d = safetensors.read_description(PATH)
    family = registry.for_description(d)
    assert family.refusal(registry.config_of(d), "context") is None  # tests/slow
    registry.build(d, jnp.float32, "cudnn")  # values padded to the keys' width (split_merge)


@pytest.mark.slow
def test_results_do_not_depend_on_batch_packing_or_experts_over_model():
    family_checks.check_invariance(FAMILY, ("layers", "1", "mlp", "gate"), axis=0)


def test_no_other_package_file_names_the_family():
    """A family is one module: no other package file names it as a family (its name, model
    types or GGUF architectures as string literals, its module in an import; not prose, nor
    llama.cpp's pre-tokenizer table, whose names are llama.cpp's: `family_checks.names_of`)."""
    assert family_checks.names_of(FAMILY) == [os.path.join("models", "families", f"{FAMILY}.py")]
