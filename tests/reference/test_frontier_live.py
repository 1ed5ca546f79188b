"""The golden numbers of GPT-OSS, Llama 4 and DeepSeek-V3 (tests/golden/make_frontier_golden.py)
are what the installed transformers computes today from the committed models; and each family's
tiny model saved afresh by the installed transformers is scored by ppl_jax as transformers scores
it (`test_families.check_matches`)."""

import json
import os
import sys

import numpy as np
import pytest
import test_families

import helpers

sys.path.insert(0, helpers.GOLDEN)
import make_family_golden as family  # noqa: E402
import make_frontier_golden as recipe  # noqa: E402


def test_the_families_are_those_of_the_golden_files():
    assert set(recipe.FAMILIES) <= set(os.listdir(recipe.OUT))


@pytest.mark.parametrize("name", sorted(recipe.FAMILIES))
def test_a_fresh_model_matches_transformers(name, tmp_path):
    path = str(tmp_path / name)
    recipe.save(name, path)
    numbers = family.numbers(family.load(path))
    for protocol in test_families.PROTOCOLS:
        test_families.check_matches(path, numbers, protocol)


@pytest.mark.parametrize("name", sorted(recipe.FAMILIES))
def test_golden_numbers_are_current(name):
    path = os.path.join(recipe.OUT, name)
    now = family.numbers(family.load(path))
    with open(os.path.join(path, "golden.json"), encoding="utf-8") as f:
        stored = json.load(f)
    for protocol, windows in stored["protocols"].items():
        for a, b in zip(windows, now["protocols"][protocol], strict=True):
            assert (a["row"], a["first"]) == (b["row"], b["first"])
            np.testing.assert_allclose(a["log_probs"], b["log_probs"], rtol=1e-6)
