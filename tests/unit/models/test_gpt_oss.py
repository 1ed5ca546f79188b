"""GPT-OSS (`ppl_jax.models.families.gpt_oss`): its reading of `config.json`, each feature shown
to matter, what it refuses, and the results' invariance to batch, packing and experts over the
`model` axis. Against transformers' float32 log-probabilities of the committed tiny model
(tests/golden/families/gpt_oss, by tests/golden/make_frontier_golden.py: sinks drawn N(0, 1), a
window of 8 on layers 0 and 2, q/k/v/o biases, 6 experts of which 3 are chosen, experts' pre-
activations past the clamp, YaRN past 16 positions) the per-token NLL, `nll_sum` and token counts
are checked on `sliding`, `hf_strided` and `lm_eval_rolling` by
`test_families.test_matches_transformers` (bfloat16 in its slow tier)."""

from __future__ import annotations

import json
import os

import family_checks
import jax.numpy as jnp
import numpy as np
import pytest
from test_families import FAMILY_DIR, golden, loaded, protocol_nll

from ppl_jax.checkpoints.formats import safetensors
from ppl_jax.errors import CheckpointError
from ppl_jax.models import registry

FAMILY = "gpt_oss"
PATH = os.path.join(FAMILY_DIR, FAMILY)


def test_the_description_reads_every_feature():
    d = safetensors.read_description(PATH)
    assert d["family"] == FAMILY and d["attn_sinks"]
    assert (d["sliding_window"], d["sliding_layers"]) == (8, [0, 2])
    assert (d["qkv_bias"], d["o_bias"], d["tie_embeddings"]) == (True, True, False)
    assert d["moe_layers"] == [0, 1, 2, 3]
    assert (d["moe_experts"], d["moe_top_k"], d["moe_mlp_dim"]) == (6, 3, 16)
    assert (d["swiglu_alpha"], d["swiglu_limit"]) == (1.702, 7.0)
    assert (d["rope_type"], d["rope_factor"], d["rope_truncate"]) == ("yarn", 4.0, False)
    kinds = registry.for_description(d).layer_kinds(registry.config_of(d))
    assert [k.note for k in kinds] == ["sinks sliding", "sinks", "sinks sliding", "sinks"]


def test_defaults_follow_transformers(tmp_path):
    """Without `layer_types` the even layers are windowed; without `rope_parameters` YaRN of
    factor 32 past 4,096 positions with `rope_theta` 150,000."""
    config = json.loads(open(os.path.join(PATH, "config.json")).read())
    for key in ("layer_types", "rope_parameters", "sliding_window", "attention_bias"):
        config.pop(key)
    (tmp_path / "config.json").write_text(json.dumps(config))
    d = safetensors.read_description(str(tmp_path))
    assert (d["sliding_window"], d["sliding_layers"]) == (128, [0, 2])
    assert (d["rope_type"], d["rope_factor"], d["rope_theta"]) == ("yarn", 32.0, 150000.0)
    assert d["rope_original_max_positions"] == 4096 and d["qkv_bias"]


def test_a_quantization_it_does_not_read_is_refused_in_one_sentence(tmp_path):
    # MXFP4 experts are read (tests/unit/checkpoints/test_quantized.py); another method is not.
    config = json.loads(open(os.path.join(PATH, "config.json")).read())
    config["quantization_config"] = {"quant_method": "bitsandbytes"}
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(
        CheckpointError, match="'bitsandbytes', which ppl_jax does not read .* give a dequantized"
    ):
        safetensors.read_description(str(tmp_path))


def test_refusals_before_reading_weights():
    d = safetensors.read_description(PATH)
    family = registry.for_description(d)
    assert family.refusal(registry.config_of(d), "context") is None  # tests/slow
    registry.build(d, jnp.float32, "cudnn")  # sinks: the epilogue after the merge (split_merge)


# Each feature turned off moves the result well past the tolerance: the comparison sees it.
@pytest.mark.slow
@pytest.mark.parametrize(
    "change",
    [
        {"sliding_window": None, "sliding_layers": []},
        {"rope_type": "default", "rope_attention_factor": 1.0},  # YaRN
        {"swiglu_limit": 1e6},  # the clamp
        {"moe_top_k": 2},
    ],
)
def test_the_comparison_sees_each_feature(change):
    assert family_checks.largest_change(FAMILY, change) > 1e-2


def test_the_comparison_sees_the_sinks():
    """Sinks at -1e30 are no sinks (their exponential underflows to 0)."""
    model, params = loaded(FAMILY)
    for layer in params["layers"].values():
        layer["attn"]["sinks"] = jnp.full_like(layer["attn"]["sinks"], -1e30)
    ours = np.concatenate(protocol_nll(golden(FAMILY), "sliding", model, params))
    assert np.max(np.abs(ours - family_checks.reference(FAMILY))) > 1e-2


@pytest.mark.slow
def test_results_do_not_depend_on_batch_packing_or_experts_over_model():
    """Within 5e-6: XLA:CPU's float32 products change their order of summation with the batch's
    shape (measured 1.5e-6 here, where the experts' pre-activations are drawn past the clamp;
    7e-7 for DeepSeek-V3 and Mixtral)."""
    family_checks.check_invariance(FAMILY, ("layers", "1", "mlp", "gate"), axis=0, rtol=5e-6)


def test_no_other_package_file_names_the_family():
    """A family is one module: no other package file names it as a family (its name, model
    types or GGUF architectures as string literals, its module in an import; not prose, nor
    llama.cpp's pre-tokenizer table, whose names are llama.cpp's: `family_checks.names_of`)."""
    assert family_checks.names_of(FAMILY) == [os.path.join("models", "families", f"{FAMILY}.py")]
