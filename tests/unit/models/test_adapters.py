"""The one `from_nnx` and `from_linen` (`ppl_jax.models.adapters`): both forms, `logits` and
`hidden_states`, against the model computed by hand, and `ppl_jax.from_nnx` is that one."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn
from flax import nnx

import ppl_jax
from ppl_jax import testing
from ppl_jax.models import adapters, registry
from ppl_jax.models.decoders.llama import Llama
from ppl_jax.models.interface import HiddenStates, Logits

TOKENS = jnp.asarray(np.random.default_rng(0).integers(0, 256, (2, 12)), jnp.int32)
POSITIONS = jnp.broadcast_to(jnp.arange(12, dtype=jnp.int32), (2, 12))
SEGMENTS = jnp.ones((2, 12), jnp.int32)


def test_ppl_jax_from_nnx_is_the_one_adapter():
    assert ppl_jax.from_nnx is adapters.from_nnx
    assert ppl_jax.from_linen is adapters.from_linen


def test_hidden_states_form_is_the_registry_build():
    """`from_nnx(..., returns="hidden_states")` of ppl_jax's Llama module gives what the
    registry builds for its description: the same params tree, logical axes and outputs."""
    cfg = testing.TINY
    built = registry.build(cfg.to_dict(), jnp.float32)
    adapted = ppl_jax.from_nnx(
        lambda: Llama(cfg, nnx.Rngs(0)), cfg.vocab_size, cfg.max_positions, returns="hidden_states"
    )
    assert adapted.honours_segments and built.honours_segments
    assert jax.tree.structure(adapted.abstract_params) == jax.tree.structure(built.abstract_params)
    assert adapted.logical_axes == built.logical_axes
    params = testing.random_params(cfg)
    a = jax.jit(adapted.apply)(params, TOKENS, POSITIONS, SEGMENTS)
    b = jax.jit(built.apply)(params, TOKENS, POSITIONS, SEGMENTS)
    assert isinstance(a, HiddenStates) and isinstance(b, HiddenStates)
    np.testing.assert_array_equal(np.asarray(a.hidden), np.asarray(b.hidden))
    np.testing.assert_array_equal(np.asarray(a.unembedding), np.asarray(b.unembedding))


class _NnxLogits(nnx.Module):
    def __init__(self, rngs):
        self.embed = nnx.Embed(256, 16, rngs=rngs)
        self.out = nnx.Linear(16, 256, rngs=rngs)

    def __call__(self, tokens):
        return self.out(self.embed(tokens))


def test_logits_form_of_nnx():
    model = ppl_jax.from_nnx(lambda: _NnxLogits(nnx.Rngs(0)), 256, 64)
    assert not model.honours_segments and model.description["family"] == "nnx"
    concrete = _NnxLogits(nnx.Rngs(0))
    params = adapters.params_of_nnx(concrete)
    out = model.apply(params, TOKENS, POSITIONS, SEGMENTS)
    assert isinstance(out, Logits)
    np.testing.assert_allclose(np.asarray(out.logits), np.asarray(concrete(TOKENS)), rtol=1e-6)
    with pytest.raises(ValueError, match="returns='probabilities' is not one of"):
        ppl_jax.from_nnx(lambda: _NnxLogits(nnx.Rngs(0)), 256, 64, returns="probabilities")


class _LinenHidden(nn.Module):
    logit_softcap = 7.0

    def setup(self):
        self.embed = self.param("embed", nn.initializers.normal(1.0), (256, 16))
        self.head = self.param("head", nn.initializers.normal(1.0), (16, 256))

    def __call__(self, tokens, positions, segment_ids):
        return jnp.take(self.embed, tokens, axis=0) + positions[..., None] * 0.01

    def unembedding(self):
        return self.head


def test_hidden_states_form_of_linen():
    module = _LinenHidden()
    model = ppl_jax.from_linen(module, 256, 64, returns="hidden_states")
    assert model.honours_segments
    variables = module.init(jax.random.key(1), TOKENS, POSITIONS, SEGMENTS)
    out = model.apply(variables["params"], TOKENS, POSITIONS, SEGMENTS)
    assert isinstance(out, HiddenStates) and out.logit_softcap == 7.0
    p = variables["params"]
    want = np.asarray(jnp.take(p["embed"], TOKENS, axis=0) + POSITIONS[..., None] * 0.01)
    np.testing.assert_allclose(np.asarray(out.hidden), want, rtol=1e-6)
    np.testing.assert_array_equal(np.asarray(out.unembedding), np.asarray(p["head"]))
