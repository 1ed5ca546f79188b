"""The hybrid families (issue 24: `qwen3_5` for Qwen3.5 and Qwen3-Next, `mamba2`, `nemotron_h`,
`falcon_h1`), read by the registry from the transformers directories in tests/golden/families/
(written by tests/golden/make_hybrid_golden.py): `test_families.test_matches_transformers` checks
them against transformers' float32 log-probabilities under the three protocols (per token within
1e-5 relative, `nll_sum` within 1e-6; bfloat16 in its slow tier); here, what the scans add: the
scan's chunk size and packing change no number, the descriptions read every feature, packed
rows over the context axis (the scans' state passed from chunk to chunk) equal one device, and
each feature turned off (a description field, or weights that undo
it) moves the numbers.

Tolerances of the chunk size: 1e-6 relative per token for the Mamba2 families (measured 2e-7 to
3e-7). For the Gated DeltaNet families 1e-6 is below float32's floor: perturbing every weight by
at most half an ulp (their own float32 rounding) moves a token's NLL by up to 3.6e-6 to 6e-6
relative (three draws per family), and transformers' own float32 moves it by 1.3e-6 to 3e-6 when
its chunk size goes from 64 to 3, 8 or 16. The scan adds no error of its own
(test_gated_delta.test_the_rounding_is_that_of_the_inputs; on the golden windows' scan inputs too
its error is what half-ulp changes of those inputs cause, as is transformers' chunked and
recurrent rules'). Against transformers' float64 (which the golden files carry) ppl_jax's and
transformers' float32 spread alike (rms 4.7e-7 and 4.2e-7 relative per token for qwen3_5, 4.4e-7
and 4.8e-7 for qwen3_next); qwen3_5's largest, 1.0e-5 for ppl_jax at one lm_eval_rolling token
and 3.9e-6 for transformers, are single draws of that spread. Their chunk-size tolerance is 5e-6
per token (measured 1.8e-6; over the context axis 4.4e-6) with the sums within 1e-7 (measured
2e-8).
"""

from __future__ import annotations

import json
import os

import family_checks
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import test_context_scoring
import test_families
from test_families import FAMILY_DIR, golden, loaded, ppl_windows, protocol_nll, score_rows

from ppl_jax.checkpoints.formats import safetensors
from ppl_jax.models import registry
from ppl_jax.plans import windows as windows_lib
from ppl_jax.plans.layout import plan_layout

HYBRIDS = ("falcon_h1", "mamba2", "nemotron_h", "qwen3_5", "qwen3_next")
GATED_DELTA = ("qwen3_5", "qwen3_next")  # the less well conditioned (module docstring)


def nll(family, description=None, dtype=jnp.float32, edit=None):
    """ppl_jax's per-token NLL of the family's `sliding` windows (`description`: fields replaced;
    `edit`: weight name -> a constant it is set to)."""
    model, params = loaded(family, dtype, json.dumps(description) if description else None)
    for name, value in (edit or {}).items():
        *parents, last = name.split("/")
        node = params = dict(params)
        for p in parents:
            node[p] = dict(node[p])
            node = node[p]
        node[last] = jnp.full_like(node[last], value)
    return np.concatenate(protocol_nll(golden(family), "sliding", model, params))


def reference(family, protocol="sliding"):
    return np.concatenate(
        [-np.asarray(w["log_probs"], np.float64) for w in golden(family)["protocols"][protocol]]
    )


def test_the_descriptions_read_every_feature():
    d = {f: safetensors.read_description(os.path.join(FAMILY_DIR, f)) for f in HYBRIDS}
    assert {f: x["family"] for f, x in d.items()} == {
        "falcon_h1": "falcon_h1",
        "mamba2": "mamba2",
        "nemotron_h": "nemotron_h",
        "qwen3_5": "qwen3_5",
        "qwen3_next": "qwen3_5",
    }
    kinds = {
        f: [(k.mixer, k.mlp) for k in registry.for_description(x).layer_kinds(
            registry.config_of(x))]
        for f, x in d.items()
    }  # fmt: skip
    assert set(kinds["mamba2"]) == {("state_space", "none")}
    assert {"linear_attention", "attention"} == {m for m, _ in kinds["qwen3_5"]}
    assert {"moe"} <= {m for _, m in kinds["qwen3_next"]}
    assert {("state_space", "none"), ("attention", "none"), ("none", "dense"), ("none", "moe")} \
        <= set(kinds["nemotron_h"])  # fmt: skip
    assert d["falcon_h1"]["ssm_scales"] != [1.0] * 5 and d["falcon_h1"]["key_scale"] != 1.0
    assert d["qwen3_next"]["model_type"] == "qwen3_next" and d["qwen3_next"]["moe_top_k"] > 1
    assert 0 < d["qwen3_5"]["rope"]["rotary_dim"] < d["qwen3_5"]["head_dim"]


@pytest.mark.parametrize("family", HYBRIDS)
def test_packed_rows_over_the_context_axis_equal_one_device(family):
    """Ten windows of the golden stream packed three to a row of 128 tokens, scored on
    `data=2, context=4` and `context=8` (chunks of 16 and 8 tokens: segments, the convolution's
    tails and the scan's state cross chunk boundaries): per-token NLL within the chunk-size
    tolerance of `data=8` (the module docstring), window sums within 1e-6."""
    model, params = loaded(family)
    assert model.context_parallel and registry.context_refusal(model.description) is None
    params = jax.device_get(params)
    stream = np.asarray(golden(family)["stream"], np.int32)
    starts = [0, 60, 75, 130, 190, 230, 260, 310, 350, 400]
    lengths = [60, 15, 55, 60, 40, 30, 50, 40, 50, 45]
    wins = windows_lib.make(stream, starts, lengths, [1] * 10, 127)
    layout = plan_layout(wins, 8, pack=True)
    assert layout.max_segments == 3
    base_totals, base = test_context_scoring.score(model, params, wins, layout, (8, 1, 1))
    rtol = 5e-6 if family in GATED_DELTA else 1e-6
    for mesh_shape in ((2, 4, 1), (1, 8, 1)):
        totals, got = test_context_scoring.score(
            model, params, wins, layout, mesh_shape, token_chunk=16
        )
        np.testing.assert_array_equal(got["scored"], base["scored"])
        np.testing.assert_allclose(got["nll"], base["nll"], rtol=rtol, atol=1e-6)
        np.testing.assert_allclose(totals.window_nll, base_totals.window_nll, rtol=1e-6)


@pytest.mark.parametrize("family", HYBRIDS)
def test_the_scans_chunk_size_changes_no_nll(family):
    base = nll(family)
    field = "gdn_chunk" if family in GATED_DELTA else "ssm_chunk"
    for chunk in (3, 64):
        ours = nll(family, {field: chunk})
        assert np.max(np.abs(ours - base) / base) < (5e-6 if family in GATED_DELTA else 1e-6)
        assert abs(ours.sum() - base.sum()) / base.sum() < 1e-7


@pytest.mark.parametrize("family", HYBRIDS)
def test_a_packed_row_scores_as_its_windows_alone(family):
    """Two lm_eval_rolling windows of different lengths in one row: the scans restart at the
    second one's start (state and convolution), within 1e-6 of each scored alone."""
    model, params = loaded(family)
    g = golden(family)
    windows = ppl_windows(g, "lm_eval_rolling")
    lengths = windows.row_lengths()
    a, b = int(np.argmax(lengths)), int(np.argmin(lengths))
    rows = windows.fill([(b, a)] + [()] * 7, int(lengths[a] + lengths[b]))
    packed = score_rows(model, params, rows)[0][rows["target_mask"][0, 1:]]
    alone = []
    for k in (b, a):
        one = windows.fill([(k,)] + [()] * 7, int(lengths[a] + lengths[b]))
        alone.append(score_rows(model, params, one)[0][one["target_mask"][0, 1:]])
    np.testing.assert_allclose(packed, np.concatenate(alone), rtol=1e-6)
    ref = g["protocols"]["lm_eval_rolling"]
    expected = np.concatenate([-np.asarray(ref[k]["log_probs"]) for k in (b, a)])
    np.testing.assert_allclose(packed, expected, rtol=1e-5)


# Each feature turned off moves some token's NLL well past the tolerance: the comparison sees it.
# (family, description fields replaced, weights set to a constant)
CHANGES = [
    ("qwen3_5", {"rope": "rotary_dim=0"}, {}),  # partial rotary -> all dims
    ("qwen3_5", {}, {"layers/3/attn/gate": 0.0}),  # the output gate at 1/2 everywhere
    ("qwen3_5", {}, {"layers/3/attn/q_norm": 3.0}),  # QK-norm's (1 + w)
    ("qwen3_5", {}, {"layers/1/linear_attn/norm": 3.0}),  # the gated norm's weight
    ("qwen3_next", {"moe_top_k": 1}, {}),
    ("qwen3_next", {"moe_norm_topk_prob": False}, {}),
    ("qwen3_next", {}, {"layers/0/mlp/shared_scale": -30.0}),  # the shared expert's gate shut
    ("qwen3_next", {}, {"layers/0/linear_attn/conv_v": 0.25}),  # the convolution's weights
    ("nemotron_h", {"ssm_dt_min": 0.0}, {}),  # time_step_min's floor
    ("nemotron_h", {"moe_top_groups": 2}, {}),  # group-limited routing
    ("nemotron_h", {"moe_scale": 1.0}, {}),
    ("nemotron_h", {"moe_norm_topk_prob": False}, {}),
    ("nemotron_h", {"moe_top_k": 1}, {}),
    ("nemotron_h", {}, {"layers/1/mixer/bias": 0.0}),  # the correction bias
    ("nemotron_h", {}, {"layers/1/mixer/latent_in": 0.1}),  # the latent projection
    ("mamba2", {"ssm_dt_min": 0.0}, {}),
    ("mamba2", {"ssm_dt_max": None}, {}),
    ("falcon_h1", {"embedding_scale": 1.0}, {}),
    ("falcon_h1", {"lm_head_scale": 1.0}, {}),
    ("falcon_h1", {"key_scale": 1.0}, {}),
    ("falcon_h1", {"attention_in_scale": 1.0}, {}),
    ("falcon_h1", {"attention_out_scale": 1.0}, {}),
    ("falcon_h1", {"ssm_in_scale": 1.0}, {}),
    ("falcon_h1", {"ssm_out_scale": 1.0}, {}),
    ("falcon_h1", {"mlp_gate_scale": 1.0}, {}),
    ("falcon_h1", {"mlp_down_scale": 1.0}, {}),
    ("falcon_h1", {"ssm_scales": [1.0] * 5}, {}),
    ("falcon_h1", {"ssm_norm": "gated"}, {}),
]


@pytest.mark.slow
@pytest.mark.parametrize("family,change,edit", CHANGES)
def test_the_comparison_sees_each_feature(family, change, edit):
    if change.get("rope") == "rotary_dim=0":
        d = safetensors.read_description(os.path.join(FAMILY_DIR, family))
        change = {"rope": {**d["rope"], "rotary_dim": 0}}
    ours = nll(family, change, edit=edit)
    assert np.max(np.abs(ours - reference(family))) > 1e-3


def test_the_hybrids_are_in_the_family_tests():
    assert set(HYBRIDS) <= set(test_families.FAMILIES)


@pytest.mark.parametrize(
    "family,sharded_param",
    [
        ("qwen3_next", ("layers", "0", "mlp", "gate")),
        ("nemotron_h", ("layers", "1", "mixer", "up")),
    ],
)
def test_the_mixtures_do_not_depend_on_batch_packing_or_experts_over_model(family, sharded_param):
    """The hybrids with routed experts, as the other mixtures (`family_checks.check_invariance`):
    batches of 1, 4 or 16 rows, two windows packed to a row, and the experts split over `model`
    (data=4, model=2) change no window's NLL beyond the chunk-size tolerance."""
    rtol = 5e-6 if family in GATED_DELTA else 1e-6
    family_checks.check_invariance(family, sharded_param, axis=0, rtol=rtol)
