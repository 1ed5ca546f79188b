"""Llama 4's text model (`ppl_jax.models.families.llama4`): its reading of `config.json`, each
feature shown to matter, what it refuses, and the results' invariance to batch, packing and
experts over the `model` axis. Against transformers' float32 log-probabilities of the committed
tiny model (tests/golden/families/llama4, by tests/golden/make_frontier_golden.py: layers 0-2
rotary with pairs rotated, llama3 scaling, L2 QK-norm and chunks of 8; layer 3 NoPE with
temperature tuning that grows inside the window; routed blocks with a shared expert on layers 1
and 3) the per-token NLL, `nll_sum` and token counts are checked on `sliding`, `hf_strided` and
`lm_eval_rolling` by `test_families.test_matches_transformers` (bfloat16 in its slow tier)."""

from __future__ import annotations

import json
import os

import family_checks
import jax.numpy as jnp
import pytest
from test_families import FAMILY_DIR

from ppl_jax.checkpoints.formats import safetensors
from ppl_jax.errors import CheckpointError
from ppl_jax.models import registry

FAMILY = "llama4"
PATH = os.path.join(FAMILY_DIR, FAMILY)


def test_the_description_reads_every_feature():
    d = safetensors.read_description(PATH)
    assert d["family"] == FAMILY and d["model_type"] == "llama4_text"
    assert d["nope_layers"] == [3] and (d["attn_chunk"], d["chunk_layers"]) == (8, [0, 1, 2])
    assert d["qk_l2_norm"] and d["temperature_tuning"]
    assert (d["floor_scale"], d["attn_scale"]) == (4.0, 0.25)
    assert d["moe_layers"] == [1, 3] and d["mlp_dim"] == 64
    assert (d["moe_experts"], d["moe_top_k"], d["moe_mlp_dim"], d["moe_shared_mlp_dim"]) == (
        4,
        1,
        16,
        16,
    )
    assert d["rope_type"] == "llama3" and not d["tie_embeddings"]
    kinds = registry.for_description(d).layer_kinds(registry.config_of(d))
    assert [(k.mlp, k.note) for k in kinds] == [
        ("dense", "chunked"),
        ("moe", "chunked"),
        ("dense", "chunked"),
        ("moe", "nope"),
    ]


def _config(tmp_path, drop=(), **change):
    config = json.loads(open(os.path.join(PATH, "config.json")).read())
    for key in drop:
        config.pop(key)
    config.update(change)
    (tmp_path / "config.json").write_text(json.dumps(config))


def test_defaults_follow_transformers(tmp_path):
    """Without `no_rope_layers`, `layer_types` and `moe_layers`: every fourth layer NoPE, the
    others chunked, every `interleave_moe_layer_step`-th layer routed."""
    _config(tmp_path, ("no_rope_layers", "layer_types", "moe_layers"), num_hidden_layers=8)
    d = safetensors.read_description(str(tmp_path))
    assert d["nope_layers"] == [3, 7] and d["chunk_layers"] == [0, 1, 2, 4, 5, 6]
    assert d["moe_layers"] == [1, 3, 5, 7]


@pytest.mark.parametrize(
    "change, message",
    [
        ({"no_rope_layers": [1, 2, 1, 0]}, "no_rope_layers must mark each of the 4 layers"),
        ({"layer_types": ["sliding_attention"] * 4}, "layer_types are not 4 of chunked"),
        ({"attention_chunk_size": None}, "chunked layers without an attention_chunk_size"),
        ({"attention_bias": True}, "attention_bias is not supported"),
        (
            {"quantization_config": {"quant_method": "fbgemm_fp8"}},
            "'fbgemm_fp8', which ppl_jax does not read .* dequantized",
        ),
    ],
)
def test_configs_it_cannot_match_are_one_sentence(tmp_path, change, message):
    _config(tmp_path, **change)
    with pytest.raises(CheckpointError, match=message):
        safetensors.read_description(str(tmp_path))


def test_refusals_before_reading_weights():
    d = safetensors.read_description(PATH)
    family = registry.for_description(d)
    assert family.refusal(registry.config_of(d), "context") is None  # tests/slow
    registry.build(d, jnp.float32, "splash")  # the chunks by segment ids (splash_cases)
    registry.build(d, jnp.float32, "cudnn")  # the chunks reshaped into rows (split_merge)


# Each feature turned off moves the result well past the tolerance: the comparison sees it.
@pytest.mark.parametrize(
    "change",
    [
        {"attn_chunk": None, "chunk_layers": []},
        pytest.param({"nope_layers": []}, marks=pytest.mark.slow),
        {"temperature_tuning": False},
        pytest.param({"qk_l2_norm": False}, marks=pytest.mark.slow),
        pytest.param({"rope_type": "default"}, marks=pytest.mark.slow),
        pytest.param({"moe_top_k": 2}, marks=pytest.mark.slow),
    ],
)
def test_the_comparison_sees_each_feature(change):
    assert family_checks.largest_change(FAMILY, change) > 1e-2


@pytest.mark.slow
def test_results_do_not_depend_on_batch_packing_or_experts_over_model():
    family_checks.check_invariance(FAMILY, ("layers", "1", "mlp", "gate"), axis=0)


def test_no_other_package_file_names_the_family():
    """A family is one module: no other package file names it as a family (its name, model
    types or GGUF architectures as string literals, its module in an import; not prose, nor
    llama.cpp's pre-tokenizer table, whose names are llama.cpp's: `family_checks.names_of`)."""
    assert family_checks.names_of(FAMILY) == [os.path.join("models", "families", f"{FAMILY}.py")]
