"""RoPE at positions up to 1,048,575 (`ppl_jax.models.layers.rope`): the float32 angles equal
transformers' (tests/golden/rope, made by tests/golden/make_rope_golden.py) for every scaling, far
past each original length; the exact angles equal the float64 cosine."""

from __future__ import annotations

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ppl_jax.models.decoders.llama import LlamaConfig
from ppl_jax.models.families.gpt_neox import GPTNeoXConfig
from ppl_jax.models.layers import rope

import helpers

FOLDER = os.path.join(helpers.GOLDEN, "rope")
MAX = 1 << 20  # every position of the golden is below it


@pytest.fixture(scope="module")
def golden() -> tuple[dict, dict[str, np.ndarray]]:
    with open(os.path.join(FOLDER, "rope.json"), encoding="utf-8") as f:
        meta = json.load(f)
    with np.load(os.path.join(FOLDER, "rope.npz")) as z:
        arrays = {k: z[k] for k in z.files}
    return meta, arrays


def config(name: str, case: dict, angles: str = "float32"):
    """The case's config as ppl_jax reads a Hugging Face config.json (`rope.from_hf`)."""
    d = case["head_dim"]
    if name.startswith("gpt_neox"):
        return GPTNeoXConfig(
            vocab_size=8, embed_dim=4 * d, num_layers=1, num_heads=4, mlp_dim=8,
            max_positions=MAX, rotary_dim=int(d * case["partial_rotary_factor"]),
            rope_theta=case["theta"], rope_angles=angles,
        )  # fmt: skip
    fields = rope.from_hf(
        {"rope_theta": case["theta"], **case["rope"]}, {"model_type": "llama"}, d,
        case["max_positions"],
    )  # fmt: skip
    return LlamaConfig(
        vocab_size=8, embed_dim=4 * d, num_layers=1, num_heads=4, num_kv_heads=4, head_dim=d,
        mlp_dim=8, max_positions=MAX, rope_angles=angles, **fields,
    )  # fmt: skip


def runs(meta: dict, name: str):
    """(prefix, positions, long) of each golden run of a case."""
    yield "", meta["positions"], True
    if meta["cases"][name]["rope"].get("rope_type") == "longrope":
        yield "short_", meta["short_positions"], False


def cos_sin(cfg, positions: list[int]) -> tuple[np.ndarray, np.ndarray]:
    pos = jnp.asarray([positions], jnp.int32)
    cos, sin = jax.jit(lambda p: rope.cos_sin(p, jnp.ones_like(p), cfg))(pos)
    return np.asarray(cos[0]), np.asarray(sin[0])


CASES = ["llama3", "yarn", "yarn_mscale", "longrope", "linear", "default_1e6", "gpt_neox_partial"]


@pytest.mark.parametrize("name", CASES)
def test_float32_angles_equal_transformers_far_past_the_original_length(golden, name):
    meta, arrays = golden
    case = meta["cases"][name]
    cfg = config(name, case)
    for prefix, positions, long in runs(meta, name):
        want = arrays[f"{name}/{prefix}inv_freq"]
        got = rope.inv_freq(cfg, long=long)
        # The scalings' arithmetic is transformers' own, op for op: the same float32 bits
        # wherever the power `theta ** (2i / dim)` is; PyTorch's powf is not always correctly
        # rounded (theta 1e6 at dim 128, theta 1e4 at dim 96: one frequency each).
        same_power = rope.powers(cfg) == arrays[f"{name}/{prefix}powers"]
        ulps = np.abs(got.view(np.int32).astype(np.int64) - want.view(np.int32))
        assert (ulps[same_power] == 0).all() and ulps.max() <= 2, name
        assert same_power.mean() > 0.9
        scale = case[f"{prefix}attention_scaling"]
        assert cfg.rope_attention_factor == pytest.approx(scale, rel=1e-15)
        cos, sin = cos_sin(cfg, positions)
        # Equal frequencies give the same float32 angles, whose cosines two float32 libraries
        # take within 2 ulps; a frequency a unit apart drifts by p * |df| (and a unit of the
        # angle's own rounding).
        p = np.asarray(positions, np.float64)[:, None]
        differ = got != want
        drift = p * np.abs(got - want.astype(np.float64))
        drift += np.where(differ, np.spacing((p * want).astype(np.float32)), 0.0)
        bound = scale * (2.4e-7 + drift)
        assert (drift[:, ~differ] == 0).all()
        assert (np.abs(cos - arrays[f"{name}/{prefix}cos"]) <= bound).all(), name
        assert (np.abs(sin - arrays[f"{name}/{prefix}sin"]) <= bound).all(), name


@pytest.mark.parametrize("name", CASES)
def test_exact_angles_equal_the_float64_cosine(golden, name):
    meta, _ = golden
    case = meta["cases"][name]
    cfg = config(name, case, "exact")
    for _, positions, long in runs(meta, name):
        freq = rope.frequencies(cfg, long, np.float64)
        angles = np.asarray(positions, np.float64)[:, None] * freq
        scale = cfg.rope_attention_factor
        cos, sin = cos_sin(cfg, positions)
        np.testing.assert_allclose(cos, np.cos(angles) * scale, rtol=0, atol=4e-7 * scale)
        np.testing.assert_allclose(sin, np.sin(angles) * scale, rtol=0, atol=4e-7 * scale)
        # the float64 frequencies are the float32 ones within float32 rounding (1-3 ulps)
        np.testing.assert_allclose(freq, rope.inv_freq(cfg, long), rtol=4e-7, atol=0)


def test_float32_angles_drift_where_exact_ones_do_not():
    """What `model.rope_angles=exact` is for: at 1M positions the float32 angle of Llama 3.1's
    highest frequencies is off by hundredths of a radian; at short positions nothing changes."""
    case = {"head_dim": 128, "theta": 500000.0, "max_positions": 131072, "rope": {}}
    f32, exact = config("llama", case), config("llama", case, "exact")
    positions = [0, 1, 7, 100, 2047, 32768, 777777, 999999, 1048575]
    p = np.asarray(positions, np.float64)[:, None]
    truth = np.cos(p * rope.frequencies(exact, False, np.float64))
    error = np.abs(cos_sin(f32, positions)[0] - truth).max(axis=1)
    # float32: the frequency's and the angle's rounding, up to about p * 2^-23 rad
    assert (error <= 3e-7 + p[:, 0] * 2.0**-23).all()
    assert error[-3:].min() > 1e-2 and error[:2].max() < 3e-7
    assert np.abs(cos_sin(exact, positions)[0] - truth).max() < 4e-7


def test_the_angles_setting_is_checked_and_kept_out_of_default_descriptions():
    case = {"head_dim": 8, "theta": 10000.0, "max_positions": 64, "rope": {}}
    assert "rope_angles" not in config("llama", case).to_dict()
    assert config("llama", case, "exact").to_dict()["rope_angles"] == "exact"
    assert LlamaConfig.from_dict(config("llama", case, "exact").to_dict()).rope_angles == "exact"
    from ppl_jax.errors import CheckpointError

    with pytest.raises(CheckpointError, match="rope_angles 'float64' is not supported"):
        config("llama", case, "float64")
