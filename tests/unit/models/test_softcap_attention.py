"""The attention soft-cap (Gemma 2's `attn_logit_softcapping`): XLA and splash (interpreted on
CPU) equal a NumPy float64 reference of transformers' eager attention; cuDNN, which cannot
soft-cap, is refused by name and avoided by `auto` (tokamax takes those layers on a GPU where it is
installed: tests/unit/models/test_tokamax_kernel.py)."""

import jax.numpy as jnp
import numpy as np
import pytest
from test_attention import packed_inputs

from ppl_jax.errors import ConfigError
from ppl_jax.models.layers.attention import attend, resolve, resolve_for

import helpers


def reference(q, k, v, seg, pos, window, cap, scale):
    """softmax(cap * tanh(scale * q.k / cap) + mask) v, in float64, grouped-query heads."""
    q, k, v = (np.asarray(a, np.float64) for a in (q, k, v))
    group = q.shape[2] // k.shape[2]
    k, v = np.repeat(k, group, axis=2), np.repeat(v, group, axis=2)
    s = np.einsum("bqhd,bkhd->bhqk", q, k) * scale
    s = cap * np.tanh(s / cap)
    seg, pos = np.asarray(seg), np.asarray(pos)
    t = q.shape[1]
    mask = (seg[:, :, None] == seg[:, None, :]) & np.tril(np.ones((t, t), bool))
    if window is not None:
        mask &= pos[:, :, None] - pos[:, None, :] < window
    s = np.where(mask[:, None], s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    return np.einsum("bhqk,bkhd->bqhd", p, v)


@pytest.mark.parametrize("impl", ["xla", "splash"])
@pytest.mark.parametrize("window", [None, 16])
def test_softcap_equals_reference(impl, window):
    rng, seg, pos = packed_inputs()
    q = jnp.asarray(3 * rng.standard_normal((2, 128, 4, 16)), jnp.float32)
    k = jnp.asarray(3 * rng.standard_normal((2, 128, 2, 16)), jnp.float32)
    v = jnp.asarray(rng.standard_normal((2, 128, 2, 16)), jnp.float32)
    cap, scale = 2.0, 0.3  # scores reach ~10: the cap bites
    out = attend(
        q,
        k,
        v,
        segment_ids=seg,
        positions=pos,
        window=window,
        scale=scale,
        softcap=cap,
        implementation=impl,
    )
    ref = reference(q, k, v, seg, pos, window, cap, scale)
    uncapped = reference(q, k, v, seg, pos, window, 1e9, scale)
    real = np.asarray(seg) != 0
    np.testing.assert_allclose(np.asarray(out)[real], ref[real], atol=2e-5)
    assert np.abs(uncapped - ref)[real].max() > 0.1


def test_cudnn_cannot_softcap(monkeypatch):
    """`auto` on a GPU: tokamax for soft-caps where installed, else `xla`; cuDNN otherwise."""
    desc = {"embed_dim": 64, "num_heads": 4, "head_dim": 16, "attn_softcap": 50.0}
    helpers.tokamax_installed(monkeypatch, False)
    assert resolve("auto", jnp.bfloat16, 16, platform="gpu", softcap=True) == "xla"
    helpers.tokamax_installed(monkeypatch, True)
    assert resolve("auto", jnp.bfloat16, 16, platform="gpu", softcap=True) == "tokamax"
    assert resolve("auto", jnp.bfloat16, 16, platform="gpu") == "cudnn"
    assert resolve_for("auto", jnp.float32, desc) == "xla"
    with pytest.raises(ConfigError, match="model.attention=cudnn cannot soft-cap"):
        resolve_for("cudnn", jnp.bfloat16, desc)
    rng, seg, pos = packed_inputs()
    q = jnp.zeros((2, 128, 4, 16), jnp.bfloat16)
    with pytest.raises(ConfigError, match="cannot soft-cap"):
        attend(q, q, q, segment_ids=seg, positions=pos, softcap=1.0, implementation="cudnn")
