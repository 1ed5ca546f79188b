"""float32 is float32 on every backend: a float32 step, as the scorer lowers it, asks for HIGHEST
on every matrix product (a Llama, Qwen3.5's Gated DeltaNet scan, and the KL step with its
reference model), a bfloat16 step for the backend's default; on CPU the numbers do not move."""

import functools
import os
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ppl_jax.checkpoints.formats import safetensors
from ppl_jax.config.defaults import DEFAULT_RULES
from ppl_jax.errors import ConfigError
from ppl_jax.models import registry
from ppl_jax.plans.layout import plan_layout
from ppl_jax.plans.windows import sliding
from ppl_jax.runtime import mesh as mesh_lib
from ppl_jax.scoring import precision
from ppl_jax.scoring.scorer import Scorer, StepOptions

import helpers

PRODUCT = re.compile(r"stablehlo\.(?:dot_general|convolution)\b.*")
PRECISION = re.compile(r"precision = \[(\w+), (\w+)\]")


def scorer(description: dict, dtype, options: StepOptions | None = None, reference=False):
    model = registry.build(description, dtype)
    mesh = mesh_lib.make_mesh(1, 1, devices=jax.devices()[:1])
    shardings = mesh_lib.param_shardings(
        model.abstract_params, model.logical_axes, mesh, DEFAULT_RULES
    )
    ref = (model, shardings) if reference else None
    return Scorer(model, mesh, shardings, options or StepOptions(), ref)


def products(s: Scorer) -> list[tuple[str, str]]:
    """The operand precisions of every matrix product in the step's StableHLO (its scans'
    bodies included), as lowered for a batch of 2 rows of 33 positions, 2 segments each."""
    text = s.lowered(2, 33, 2).as_text()
    found = []
    for line in PRODUCT.findall(text):
        m = PRECISION.search(line)
        found.append(m.groups() if m else ("none", "none"))
    return found


@functools.cache
def lowered_products(family: str, dtype, reference: bool = False) -> list[tuple[str, str]]:
    options = StepOptions(reference=reference)
    return products(scorer(FAMILIES[family](), dtype, options, reference))


FAMILIES = {
    "llama": lambda: helpers.TINY.to_dict(),
    "qwen3_5": lambda: safetensors.read_description(
        os.path.join(helpers.GOLDEN, "families", "qwen3_5")
    ),
}


@pytest.mark.parametrize("family", FAMILIES)
def test_float32_asks_for_highest_on_every_product(family):
    assert scorer(FAMILIES[family](), jnp.float32).matmul_precision == "highest"
    found = lowered_products(family, jnp.float32)
    # The products of one layer of each kind (the decoder scans its layers), its scans included.
    assert len(found) >= (90 if family == "qwen3_5" else 10)
    assert set(found) == {("HIGHEST", "HIGHEST")}


def test_a_long_windows_query_chunks_ask_for_highest_too():
    """A window longer than `model.token_chunk` runs each layer in two passes (keys and values
    per token, then the queries in chunks: `ppl_jax.models.decoders.llama.Block`); their
    products are lowered at HIGHEST as the one-pass step's are."""

    def lowered(token_chunk):
        s = scorer(helpers.TINY.to_dict(), jnp.float32, StepOptions(token_chunk=token_chunk))
        return s.lowered(1, 65, 1).as_text()

    text = lowered(16)
    assert text.count("stablehlo.while") > lowered(0).count("stablehlo.while")  # the chunks
    found = [m.groups() if (m := PRECISION.search(x)) else ("none", "none")
             for x in PRODUCT.findall(text)]  # fmt: skip
    assert len(found) >= 10
    assert set(found) == {("HIGHEST", "HIGHEST")}


def test_bfloat16_keeps_the_backend_default():
    assert scorer(FAMILIES["llama"](), jnp.bfloat16).matmul_precision == "default"
    found = lowered_products("llama", jnp.bfloat16)
    assert len(found) == len(lowered_products("llama", jnp.float32))
    assert set(found) == {("DEFAULT", "DEFAULT")}


def test_the_kl_step_asks_for_highest_in_both_models():
    found = lowered_products("llama", jnp.float32, reference=True)
    assert len(found) > len(lowered_products("llama", jnp.float32))  # the reference's too
    assert set(found) == {("HIGHEST", "HIGHEST")}


def test_a_setting_wins_over_auto():
    options = StepOptions(matmul_precision="bf16_3x")
    text = scorer(helpers.TINY.to_dict(), jnp.float32, options).lowered(2, 33).as_text()
    lines = PRODUCT.findall(text)
    assert lines and all("lhs_precision_type = bf16" in line for line in lines)
    s = scorer(helpers.TINY.to_dict(), jnp.bfloat16, StepOptions(matmul_precision="highest"))
    assert set(products(s)) == {("HIGHEST", "HIGHEST")}
    with pytest.raises(ConfigError, match="model.matmul_precision='fp32' is not one of"):
        scorer(helpers.TINY.to_dict(), jnp.float32, StepOptions(matmul_precision="fp32"))


def test_a_model_computes_in_the_dtype_of_most_of_its_params():
    big, small = jax.ShapeDtypeStruct((64, 64), jnp.bfloat16), jnp.zeros((8, 4), jnp.float32)
    assert not precision.computes_in_float32({"w": big, "router": small, "step": jnp.int32(0)})
    assert precision.computes_in_float32({"w": big}, {"w": np.zeros((8, 4), np.float64)})
    assert precision.resolve("auto", True) == "highest"
    assert precision.resolve("auto", False) == "default"


@pytest.mark.slow
def test_highest_does_not_move_a_number_on_cpu():
    """CPU computes float32 products in float32 at every precision: the scores are the same
    bits at `highest` and `default`."""
    params = helpers.random_params(helpers.TINY, seed=3)
    tokens = np.random.default_rng(0).integers(0, helpers.TINY.vocab_size, 70).astype(np.int32)
    windows = sliding(tokens, 32, 16)
    got = {}
    for setting in ("highest", "default"):
        s = scorer(helpers.TINY.to_dict(), jnp.float32, StepOptions(matmul_precision=setting))
        totals = s.score(params, windows, plan_layout(windows, 2))
        got[setting] = totals.window_nll
    np.testing.assert_array_equal(got["highest"], got["default"])
