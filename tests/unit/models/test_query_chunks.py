"""A long window's layers in chunks of queries (`ppl_jax.models.layers.attention.query_chunk`: the
keys and values of every token first, then the rest of each layer chunk by chunk of queries) score
every token as the layer over the whole row does, for each kind of attention and norm layout, on
packed rows whose length is no multiple of the chunk; and the per-token chunks keep 16-bit values as
they are."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from test_families import golden, loaded, ppl_windows

from ppl_jax.models.layers import context as context_lib
from ppl_jax.scoring.nll import token_nll

# Gemma 2: norms around the sublayers, soft-caps, sliding layers; OLMo 2: norms after; GPT-OSS:
# sinks and routed experts; Llama 4: chunked and NoPE layers; DeepSeek-V3: latent attention.
FAMILIES = ["gemma2"] + [
    pytest.param(f, marks=pytest.mark.slow) for f in ("gpt_oss", "deepseek_v3", "olmo2", "llama4")
]


def _nll(model, params, rows, token_chunk: int) -> tuple[np.ndarray, str]:
    """The NLL of every target of `rows` (0 where not scored), and the step's program."""
    tokens = jnp.asarray(rows["tokens"])
    read = tuple(map(jnp.asarray, (tokens[:, :-1], rows["positions"][:, :-1],
                                   rows["segment_ids"][:, :-1])))  # fmt: skip

    def fn(params, *read):
        return token_nll(model.apply(params, *read), tokens[:, 1:])

    with context_lib.settings(context_lib.Settings(token_chunk=token_chunk)):
        lowered = jax.jit(fn).lower(params, *read)
    nll = lowered.compile()(params, *read)
    return np.where(rows["target_mask"][:, 1:], np.asarray(nll, np.float64), 0.0), lowered.as_text()


@pytest.mark.parametrize("family", FAMILIES)
def test_queries_in_chunks_score_as_the_whole_row(family):
    model, params = loaded(family)
    windows = ppl_windows(golden(family), "lm_eval_rolling")
    lengths = windows.row_lengths()
    order = np.argsort(lengths)
    pairs = [(int(order[0]), int(order[-1])), (int(order[1]), int(order[-2]))]
    rows = windows.fill(pairs, int(lengths[order[-1]] + lengths[order[0]]))
    whole, program = _nll(model, params, rows, 0)
    chunked, chunked_program = _nll(model, params, rows, 7)
    # The layers' queries ran apart from their keys: more loops (the chunks) in the program.
    assert chunked_program.count("stablehlo.while") > program.count("stablehlo.while")
    np.testing.assert_allclose(chunked, whole, rtol=2e-6, atol=1e-7)


def test_per_token_keeps_bfloat16():
    """bfloat16 inputs and results go through the chunks as their bits, unchanged."""
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal((2, 50, 3)), jnp.bfloat16)
    out = jax.jit(lambda x: context_lib.per_token(lambda a: (a * 3, a[..., 0] > 0), x, 8))(x)
    assert out[0].dtype == jnp.bfloat16
    np.testing.assert_array_equal(np.asarray(out[0]), np.asarray(x * 3))
    np.testing.assert_array_equal(np.asarray(out[1]), np.asarray(x[..., 0] > 0))
