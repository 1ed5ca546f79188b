"""GPT-OSS, Llama 4 and DeepSeek-V3 under a context axis (`mesh.context`, ATTENTION.md section 2)
on 8 CPU devices: the golden `sliding` windows (tests/golden/families/) packed two to a row,
each row's tokens split over `context` in the load-balanced order, give per-token NLLs within
1e-6 of one device and within 1e-5 of transformers float32: sinks and windows, chunks and the
NoPE layers' temperature (by position within the segment), MLA's narrower values, and the routed
blocks (per `(data, context)` shard) are right in that order."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from test_context_scoring import score
from test_families import FAMILY_DIR, golden, ppl_windows

from ppl_jax.checkpoints.formats import safetensors
from ppl_jax.config.defaults import DEFAULT_RULES
from ppl_jax.models import registry
from ppl_jax.plans.layout import plan_layout
from ppl_jax.runtime import mesh as mesh_lib


@pytest.mark.parametrize("options", [{}, {"context_attention": "ring", "token_chunk": 8}], ids=str)
@pytest.mark.parametrize("family", ["gpt_oss", "llama4", "deepseek_v3"])
def test_a_context_axis_scores_as_one_device_and_transformers(family, options):
    path = f"{FAMILY_DIR}/{family}"
    model = registry.build(safetensors.read_description(path), jnp.float32, "xla")
    assert model.context_parallel
    target, _ = mesh_lib.param_targets(
        model.abstract_params, model.logical_axes, mesh_lib.make_mesh(-1, 1), DEFAULT_RULES
    )
    params = jax.device_get(safetensors.load_params(path, target))
    g = golden(family)
    wins = ppl_windows(g, "sliding")
    layout = plan_layout(wins, 4, pack=True)
    totals, ours = score(model, params, wins, layout, (2, 2, 2), **options)
    _, single = score(model, params, wins, layout, (2, 1, 4))
    # GPT-OSS within 5e-6, as for the batch (tests/unit/models/test_gpt_oss.py)
    rtol = 5e-6 if family == "gpt_oss" else 1e-6
    np.testing.assert_allclose(ours["nll"], single["nll"], rtol=rtol, atol=1e-6)
    ref = np.concatenate([-np.asarray(w["log_probs"]) for w in g["protocols"]["sliding"]])
    np.testing.assert_allclose(totals.nll_sum, ref.sum(), rtol=1e-6)
