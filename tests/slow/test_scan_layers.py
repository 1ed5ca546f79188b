"""ppl_jax's Gated DeltaNet and Mamba2 layers (`ppl_jax.models.layers.gated_delta`,
`ppl_jax.models.layers.ssd`) against transformers' own `Qwen3_5GatedDeltaNet`,
`Qwen3NextGatedDeltaNet`, `Mamba2Mixer`, `NemotronHMamba2Mixer` and `FalconH1Mixer` (their
PyTorch fallbacks, float32) on the same weights: golden files of
tests/golden/make_scan_golden.py (tests/reference/test_scans_live.py recomputes them live).
Also: the layers' own chunk size, packing, and bfloat16."""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from ppl_jax.checkpoints import mapping
from ppl_jax.checkpoints.mapping import blocks
from ppl_jax.models.layers import gated_delta, ssd

import helpers

CASES = ("qwen3_5", "qwen3_next", "mamba2", "nemotron_h", "falcon_h1", "falcon_h1_plain")
GDN_CASES = ("qwen3_5", "qwen3_next")


def load_golden(name: str) -> dict[str, np.ndarray]:
    with np.load(os.path.join(helpers.GOLDEN, "scans", f"{name}.npz")) as z:
        return {k: z[k] for k in z.files}


def _field(z, name, default=None):
    key = f"config/{name}"
    return z[key].tolist() if key in z else default


def gdn_layer(z: dict, model_type: str, chunk: int, dtype=jnp.float32):
    """A `GatedDeltaNet` holding a golden file's transformers-layout weights."""
    hk, dk = _field(z, "linear_num_key_heads"), _field(z, "linear_key_head_dim")
    hv, dv = _field(z, "linear_num_value_heads"), _field(z, "linear_value_head_dim")
    d = _field(z, "hidden_size")
    spec = gated_delta.GatedDeltaSpec(
        d, hk, dk, hv, dv, _field(z, "linear_conv_kernel_dim"), _field(z, "rms_norm_eps"), chunk
    )
    names = dict(embed_dim=d, gdn_key_heads=hk, gdn_key_dim=dk, gdn_value_heads=hv)
    names.update(gdn_value_dim=dv, gdn_conv=spec.conv_kernel)
    layer = gated_delta.GatedDeltaNet(spec, nnx.Rngs(0), dtype)
    return _filled(layer, gated_delta.hf_rules("", "", model_type), z, names)


def mamba_spec(z: dict, model_type: str, chunk: int | None = None) -> ssd.Mamba2Spec:
    """The `Mamba2Spec` of a golden file's config fields (transformers' names per model type)."""
    f = lambda name, default=None: _field(z, name, default)  # noqa: E731
    d = f("hidden_size")
    if model_type == "mamba2":
        heads, head_dim, groups = f("num_heads"), f("head_dim"), f("n_groups")
        state, kern, eps = f("state_size"), f("conv_kernel"), f("layer_norm_epsilon")
        limit = f("time_step_limit")
        fields = dict(conv_bias=f("use_conv_bias", True), norm="gated")
    elif model_type == "nemotron_h":
        heads, head_dim, groups = f("mamba_num_heads"), f("mamba_head_dim"), f("n_groups")
        state, kern, eps = f("ssm_state_size"), f("conv_kernel"), f("layer_norm_epsilon")
        limit = (f("time_step_min", 0.001), float("inf"))
        fields = dict(conv_bias=f("use_conv_bias", True), norm="gated")
    else:
        heads, groups, state = f("mamba_n_heads"), f("mamba_n_groups"), f("mamba_d_state")
        head_dim, kern, eps = f("mamba_d_ssm") // heads, f("mamba_d_conv"), f("rms_norm_eps")
        limit = (0.0, float("inf"))
        before = f("mamba_norm_before_gate", True)
        norm = ("gated_first_norm" if before else "gated") if f("mamba_rms_norm") else "none"
        scales = tuple(f("ssm_multipliers", [1.0] * 5))
        fields = dict(conv_bias=f("mamba_conv_bias", True), norm=norm, part_scales=scales)
    return ssd.Mamba2Spec(
        embed_dim=d,
        heads=heads,
        head_dim=head_dim,
        groups=groups,
        state_dim=state,
        conv_kernel=kern,
        chunk=chunk or f("chunk_size") or f("mamba_chunk_size"),
        norm_eps=eps,
        dt_limit=tuple(limit or (0.0, float("inf"))),
        **fields,
    )


def mamba_layer(z: dict, model_type: str, chunk: int | None = None, dtype=jnp.float32):
    """A `Mamba2Mixer` holding a golden file's transformers-layout weights."""
    spec = mamba_spec(z, model_type, chunk)
    names = dict(embed_dim=spec.embed_dim, ssm_heads=spec.heads, ssm_head_dim=spec.head_dim)
    names.update(ssm_groups=spec.groups, ssm_state=spec.state_dim, ssm_conv=spec.conv_kernel)
    layer = ssd.Mamba2Mixer(spec, nnx.Rngs(0), dtype)
    return _filled(layer, ssd.hf_rules("", ""), z, names)


class _Arrays:
    """The golden file's tensors as the mapping's storage."""

    def __init__(self, z: dict):
        self.z = z

    def read(self, name, index):
        return self.z[name][index]


def _filled(module, rules: list, z: dict, names: dict):
    """`module` with the golden file's transformers-layout weights, mapped by the layer's own
    rules (`hf_rules`): every stored weight taken, every param given."""
    stored = {k: (v.shape, v.dtype) for k, v in z.items() if "/" not in k and k not in "xy"}
    params = dict(nnx.to_flat_state(nnx.state(module, nnx.Param)))
    target = {"/".join(map(str, k)): v for k, v in params.items()}
    sources = mapping.resolve(rules, stored, target, names, "golden")
    for key, param in params.items():
        name, shape = "/".join(map(str, key)), param.get_value().shape
        block = tuple(range(n) for n in shape)
        value = blocks.read_block(sources[name], stored, shape, block, _Arrays(z), names,
                                  np.float32)  # fmt: skip
        param.set_value(jnp.asarray(value, param.get_value().dtype))
    return module


def layer_of(name: str, z: dict, chunk: int | None = None, dtype=jnp.float32):
    """(the ppl_jax layer of a golden case, the factor its input is scaled by)."""
    model_type = "falcon_h1" if name.startswith("falcon_h1") else name
    if name in GDN_CASES:
        return gdn_layer(z, model_type, chunk or gated_delta.DEFAULT_CHUNK, dtype), 1.0
    return mamba_layer(z, model_type, chunk, dtype), _field(z, "ssm_in_multiplier", 1.0)


def run(layer, x, segment_ids, scale=1.0):
    x = jnp.asarray(x) * scale
    return np.asarray(nnx.jit(lambda m, x, s: m(x, s))(layer, x, jnp.asarray(segment_ids)))


def rel_diff(a, b) -> float:
    return float(np.max(np.abs(np.asarray(a, np.float64) - b)) / np.max(np.abs(b)))


@pytest.mark.parametrize("name", CASES)
def test_equals_transformers_layer(name):
    """Within 5e-6 of the largest output: measured 2.7e-7 to 3.9e-7 (Mamba2 layers), 9.6e-7
    (Qwen3-Next) and 2.0e-6 (Qwen3.5, where one head's output at token 29 has a mean square of
    5e-9 against the gated norm's epsilon of 1e-6, so the norm multiplies float32's rounding
    by about 1000)."""
    z = load_golden(name)
    layer, scale = layer_of(name, z)
    y = run(layer, z["x"], np.ones(z["x"].shape[:2], np.int32), scale)
    assert rel_diff(y, z["y"]) < 5e-6


@pytest.mark.parametrize("name", ["qwen3_5", "mamba2"])
def test_chunk_size_and_packing_change_no_number(name):
    """Chunks of 5, 16 and 64 tokens give the same outputs; a row packed with two documents
    gives each document's outputs alone (within float32 rounding: 2e-6 of the largest output,
    where float32's epsilon is 1.2e-7; the NLL's invariance is tested on the families)."""
    z = load_golden(name)
    x = z["x"]
    ones = np.ones(x.shape[:2], np.int32)
    base = run(layer_of(name, z, 64)[0], x, ones)
    for chunk in (5, 16):
        assert rel_diff(run(layer_of(name, z, chunk)[0], x, ones), base) < 2e-6
    layer = layer_of(name, z, 8)[0]
    packed = np.concatenate([x[0, :30], x[1, :40]])[None]
    y = run(layer, packed, np.array([[1] * 30 + [2] * 40]))
    assert rel_diff(y[0, :30], base[0, :30]) < 2e-6
    assert rel_diff(y[0, 30:], base[1, :40]) < 2e-6


@pytest.mark.parametrize("name", ["qwen3_next", "nemotron_h"])
def test_bfloat16_close_to_float32(name):
    z = load_golden(name)
    ones = np.ones(z["x"].shape[:2], np.int32)
    y32 = run(layer_of(name, z)[0], z["x"], ones)
    y16 = run(layer_of(name, z, dtype=jnp.bfloat16)[0], jnp.asarray(z["x"], jnp.bfloat16), ones)
    assert y16.dtype == jnp.bfloat16
    assert 1e-4 < rel_diff(y16.astype(np.float32), y32) < 3e-2


def test_each_feature_moves_the_output():
    """The dt clamp (Mamba2's limit, Nemotron-H's floor), Falcon-H1's multipliers and norm
    placement, and the grouped value heads each change the layer's output well past the
    tolerance of test_equals_transformers_layer."""
    import dataclasses

    def off(name, **change):
        z = load_golden(name)
        layer, scale = layer_of(name, z)
        layer.spec = dataclasses.replace(layer.spec, **change)
        y = run(layer, z["x"], np.ones(z["x"].shape[:2], np.int32), scale)
        return rel_diff(y, z["y"])

    assert off("mamba2", dt_limit=(0.0, float("inf"))) > 1e-3
    assert off("nemotron_h", dt_limit=(0.0, float("inf"))) > 1e-3
    assert off("falcon_h1", part_scales=(1.0,) * 5) > 1e-2
    assert off("falcon_h1", norm="gated") > 1e-2
    assert off("mamba2", norm="gated_first_norm") > 1e-2


def test_no_chunk_by_chunk_buffer():
    """The compiled Mamba2 layer over 512 tokens in chunks of 16 holds no `[T, T]` buffer."""
    z = load_golden("mamba2")
    layer = layer_of("mamba2", z, 16)[0]
    x = jnp.zeros((1, 512, z["x"].shape[-1]), jnp.float32)
    seg = jnp.ones((1, 512), jnp.int32)
    graphdef, state = nnx.split(layer)
    fn = jax.jit(lambda s, x, seg: nnx.merge(graphdef, s)(x, seg))
    text = fn.lower(state, x, seg).compile().as_text()
    assert "512,512" not in text.replace(" ", "")


def _run_in_parts(cuts, forget=False):
    """A `recurrence.run` that cuts each row at `cuts` and runs the parts one after the other,
    each from the state the previous one left (as the context axis's `pass_state` does), or
    from the initial state (`forget`)."""

    def run(scan_chunk, inputs, state):
        bounds = [0, *cuts, inputs[-1].shape[1]]
        outs, initial = [], state
        for begin, end in zip(bounds[:-1], bounds[1:], strict=True):
            out, state = scan_chunk(tuple(x[:, begin:end] for x in inputs), state)
            outs.append(out)
            state = initial if forget else state
        return jnp.concatenate(outs, axis=1), state

    return run


@pytest.mark.parametrize("name", ["qwen3_next", "falcon_h1"])
def test_a_row_cut_in_parts_scores_as_one(name, monkeypatch):
    """Parts cut inside a document (2 tokens after its start, inside the convolution's reach)
    and at a document start: the convolution's tail, the segment id and the recurrent state
    cross each cut."""
    from ppl_jax.models.layers import recurrence

    z = load_golden(name)
    layer, scale = layer_of(name, z, 8)
    x = z["x"]
    segments = np.array([[1] * 30 + [2] * 40, [1] * 70])
    whole = run(layer, x, segments, scale)
    monkeypatch.setattr(recurrence, "run", _run_in_parts([13, 30, 32]))
    assert rel_diff(run(layer, x, segments, scale), whole) < 1e-6
    monkeypatch.setattr(recurrence, "run", _run_in_parts([13, 30, 32], forget=True))
    assert rel_diff(run(layer, x, segments, scale), whole) > 1e-3
