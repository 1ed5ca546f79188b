"""The hybrid families (issue 24: Qwen3.5, Qwen3-Next, Mamba2, Nemotron-H, Falcon-H1) against
transformers 5's own log-probabilities, stored with tiny random models in tests/golden/families/
by tests/golden/make_hybrid_golden.py, under the three protocols of test_families.py: per-token
NLL within 1e-5 relative of transformers' float32, nll_sum within 1e-6 relative, bfloat16 within
1e-3 of float32; the scans' chunk size and packing change no NLL by more than 1e-6; each feature
turned off moves the numbers."""

from __future__ import annotations

import dataclasses
import functools
import json
import os

import jax.numpy as jnp
import numpy as np
import pytest
import test_families
from flax import nnx

from ppl_jax.models import falcon_h1, mamba2
from ppl_jax.models import nnx as nnx_lib

import helpers
import hybrid_weights

# family -> (config reader, module, weights reader)
FAMILIES = {
    "mamba2": (mamba2.from_hf_config, mamba2.Mamba2, hybrid_weights.mamba2_params),
    "falcon_h1": (falcon_h1.from_hf_config, falcon_h1.FalconH1, hybrid_weights.falcon_h1_params),
}
PROTOCOLS = test_families.PROTOCOLS
HYBRID_DIR = os.path.join(helpers.GOLDEN, "hybrid")


def config_of(family: str):
    stored = stored_dir(family)
    return FAMILIES[family][0](stored.config)


@functools.cache
def golden(family: str) -> dict:
    with open(os.path.join(HYBRID_DIR, family, "golden.json"), encoding="utf-8") as f:
        return json.load(f)


@functools.cache
def stored_dir(family: str) -> hybrid_weights.Stored:
    return hybrid_weights.Stored(os.path.join(HYBRID_DIR, family))


def loaded(family: str, dtype=jnp.float32, change: str = "{}"):
    """(LanguageModel, params) of the committed directory; `change`: JSON of config fields
    replaced (`{"ssm_chunk": 5}`)."""
    return _loaded(family, jnp.dtype(dtype).name, change)


@functools.cache
def _loaded(family: str, dtype: str, change: str):
    cfg = config_of(family)
    cfg = dataclasses.replace(cfg, **json.loads(change))
    _, module_class, weights = FAMILIES[family]
    dtype = jnp.dtype(dtype)
    model = nnx_lib.from_nnx(
        lambda: module_class(cfg, nnx.Rngs(0), dtype), cfg.vocab_size, cfg.max_positions, {}
    )
    stored = stored_dir(family)
    params = weights(stored, cfg)
    assert not stored.unused(), stored.unused()
    flat = {k: v for k, v in _flat(params).items()}
    expected = _flat(model.abstract_params)
    assert sorted(flat) == sorted(expected)
    for name, leaf in expected.items():
        assert flat[name].shape == leaf.shape, name
    params = {k: jnp.asarray(v, dtype) for k, v in flat.items()}
    return model, _nest(params)


def _flat(tree, prefix=""):
    out = {}
    for k, v in tree.items():
        if isinstance(v, dict):
            out.update(_flat(v, f"{prefix}{k}/"))
        else:
            out[prefix + k] = v
    return out


def _nest(flat):
    out: dict = {}
    for name, leaf in flat.items():
        node = out
        *parents, last = name.split("/")
        for p in parents:
            node = node.setdefault(p, {})
        node[last] = leaf
    return out


def nll(family, protocol="sliding", dtype=jnp.float32, change="{}"):
    g = golden(family)
    return np.concatenate(test_families.protocol_nll(g, protocol, *loaded(family, dtype, change)))


def reference(family, protocol="sliding"):
    g = golden(family)
    return np.concatenate(
        [-np.asarray(w["log_probs"], np.float64) for w in g["protocols"][protocol]]
    )


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_matches_transformers(family, protocol):
    ours, ref = nll(family, protocol), reference(family, protocol)
    assert ours.shape == ref.shape
    per_token = np.max(np.abs(ours - ref) / np.abs(ref))
    total = abs(ours.sum() - ref.sum()) / ref.sum()
    assert per_token < 1e-5 and total < 1e-6, (per_token, total)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_bfloat16_within_1e3_of_float32(family):
    f32, bf16 = nll(family), nll(family, dtype=jnp.bfloat16)
    assert abs(bf16.sum() - f32.sum()) / f32.sum() < 1e-3


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_the_scans_chunk_size_changes_no_nll(family):
    base = nll(family)
    for chunk in (3, 5, 64):
        ours = nll(family, change=json.dumps({"ssm_chunk": chunk}))
        assert np.max(np.abs(ours - base) / base) < 1e-6


# Each feature turned off moves some token's NLL well past the tolerance: the comparison sees it.
CHANGES = [
    ("mamba2", {"ssm_dt_min": 0.0}),
    ("mamba2", {"ssm_dt_max": None}),
    ("falcon_h1", {"embedding_scale": 1.0}),
    ("falcon_h1", {"lm_head_scale": 1.0}),
    ("falcon_h1", {"key_scale": 1.0}),
    ("falcon_h1", {"attention_in_scale": 1.0}),
    ("falcon_h1", {"attention_out_scale": 1.0}),
    ("falcon_h1", {"ssm_in_scale": 1.0}),
    ("falcon_h1", {"ssm_out_scale": 1.0}),
    ("falcon_h1", {"mlp_gate_scale": 1.0}),
    ("falcon_h1", {"mlp_down_scale": 1.0}),
    ("falcon_h1", {"ssm_scales": [1.0] * 5}),
    ("falcon_h1", {"ssm_norm": "gated"}),
]


@pytest.mark.slow
@pytest.mark.parametrize("family,change", CHANGES)
def test_the_comparison_sees_each_feature(family, change):
    assert np.max(np.abs(nll(family, change=json.dumps(change)) - reference(family))) > 1e-3
