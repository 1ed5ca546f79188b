"""The decoders' layers run as scans over runs of identical layers
(`ppl_jax.models.decoders.stack`): how a stack is cut into segments, that the scanned decoder
computes what the layers one by one do, and that the compiled step neither grows nor keeps more
memory with depth."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from ppl_jax import testing
from ppl_jax.config.defaults import DEFAULT_RULES
from ppl_jax.models import LlamaConfig, registry
from ppl_jax.models.decoders.llama import Llama
from ppl_jax.models.decoders.stack import Segment, segments
from ppl_jax.models.layers.core import rms_norm
from ppl_jax.runtime import mesh as mesh_lib
from ppl_jax.scoring import Scorer, StepOptions


@pytest.mark.parametrize(
    "kinds,want",
    [
        ("aaaa", [Segment(0, 1, 4)]),
        ("a", [Segment(0, 1, 1)]),
        ("ab", [Segment(0, 1, 1), Segment(1, 1, 1)]),
        # Gemma 2: sliding and global alternate.
        ("ababab", [Segment(0, 2, 3)]),
        # Gemma 3 (26 layers): five sliding, one global, and two sliding left over.
        ("aaaaab" * 4 + "aa", [Segment(0, 6, 4), Segment(24, 1, 2)]),
        # DeepSeek-V3: dense layers first, then experts.
        ("dddmmmmmm", [Segment(0, 1, 3), Segment(3, 1, 6)]),
        # Nemotron-H-like: an irregular pattern runs layer by layer where nothing repeats.
        ("mem*m-me", [Segment(i, 1, 1) for i in range(8)]),
        # Qwen3-Next: three linear attention layers, then full attention.
        ("lllf" * 3, [Segment(0, 4, 3)]),
    ],
)
def test_segments(kinds, want):
    got = segments(list(kinds))
    assert got == want
    assert [i for s in got for i in range(s.start, s.stop)] == list(range(len(kinds)))


def test_scanned_decoder_equals_layer_by_layer():
    """The scanned decoder (Gemma-like sliding and global layers: a cycle of two) against the
    same layers called one after the other in Python."""
    cfg = LlamaConfig(
        **{
            **testing.TINY.__dict__,
            "num_layers": 6,
            "sliding_window": 3,
            "sliding_layers": (0, 2, 4),
        }
    )
    model = Llama(cfg, nnx.Rngs(0))
    rng = np.random.default_rng(0)
    tokens = jnp.asarray(rng.integers(0, cfg.vocab_size, (2, 16)), jnp.int32)
    positions = jnp.broadcast_to(jnp.arange(16, dtype=jnp.int32), (2, 16))
    segment_ids = jnp.ones((2, 16), jnp.int32)
    graphdef, state = nnx.split(model)

    @jax.jit
    def both(state):
        model = nnx.merge(graphdef, state)
        x = jnp.take(model.embedding[...], tokens, axis=0)
        for layer in model.layers:
            x = layer(x, positions, segment_ids)
        one_by_one = rms_norm(x, model.final_norm[...], cfg.norm_eps)
        return model(tokens, positions, segment_ids), one_by_one

    scanned, one_by_one = both(state)
    assert "while" in jax.jit(both).lower(state).as_text()
    np.testing.assert_allclose(np.asarray(scanned), np.asarray(one_by_one), rtol=1e-5, atol=1e-5)


def _compiled(num_layers: int, t: int):
    cfg = dict(
        vocab_size=512, embed_dim=64, num_layers=num_layers, num_heads=4, num_kv_heads=2,
        head_dim=16, mlp_dim=128, max_positions=t + 1,
    )  # fmt: skip
    model = registry.build(LlamaConfig(**cfg).to_dict(), jnp.float32, "xla")
    mesh = mesh_lib.make_mesh(1, 1, devices=jax.devices()[:1])
    shardings = mesh_lib.param_shardings(
        model.abstract_params, model.logical_axes, mesh, DEFAULT_RULES
    )
    return Scorer(model, mesh, shardings, StepOptions()).compiled(1, t + 1)


def test_depth_adds_no_memory_and_no_program():
    """The step of 2 and of 8 layers: the same temporaries (XLA's memory analysis; unrolled,
    each layer added a `[T, d]` buffer) and an optimised program of about the same size (one
    layer in a loop body)."""
    shallow, deep = _compiled(2, 512), _compiled(8, 512)
    temp = [c.memory_analysis().temp_size_in_bytes for c in (shallow, deep)]
    assert temp[1] <= temp[0] * 1.05, temp
    sizes = [len(c.as_text()) for c in (shallow, deep)]
    assert sizes[1] < sizes[0] * 1.3, sizes
    assert "while" in deep.as_text()
