"""tests/unit/models/test_families.py's comparisons with transformers, live: each family's tiny
model saved by the installed transformers 5 (so that a change in what `save_pretrained` writes, or
in the modeling code, shows), its protocol windows scored by transformers and by ppl_jax; and the
committed golden numbers recomputed from the committed models."""

import json
import os
import sys

import numpy as np
import pytest
import test_families

import helpers

sys.path.insert(0, os.path.join(helpers.GOLDEN))
import make_family_golden as recipe  # noqa: E402
import make_frontier_golden as frontier  # noqa: E402
import make_hybrid_golden  # noqa: E402


@pytest.fixture(scope="module")
def live(tmp_path_factory) -> dict:
    """family -> (its freshly saved directory, transformers' numbers for it)."""
    root = tmp_path_factory.mktemp("families")
    out = {}
    for name in recipe.FAMILIES:
        path = str(root / name)
        recipe.save_family(name, path)
        out[name] = (path, recipe.numbers(recipe.load(path)))
    return out


def test_the_families_are_those_of_the_golden_files():
    """Every golden directory is written by a recipe: the softmax-attention families' here,
    the 2025-26 attention families' by make_frontier_golden.py, the hybrids' (Gated DeltaNet,
    Mamba2) by make_hybrid_golden.py."""
    families = [*recipe.FAMILIES, *frontier.FAMILIES, *make_hybrid_golden.FAMILIES]
    assert sorted(families) == test_families.FAMILIES


@pytest.mark.parametrize("protocol", test_families.PROTOCOLS)
@pytest.mark.parametrize("family", sorted(recipe.FAMILIES))
def test_matches_transformers_live(live, family, protocol):
    path, numbers = live[family]
    test_families.check_matches(path, numbers, protocol)


@pytest.mark.parametrize("family", sorted(recipe.FAMILIES))
def test_golden_numbers_are_current(family):
    path = os.path.join(test_families.FAMILY_DIR, family)
    now = recipe.numbers(recipe.load(path))
    with open(os.path.join(path, "golden.json"), encoding="utf-8") as f:
        stored = json.load(f)
    for protocol, windows in stored["protocols"].items():
        for a, b in zip(windows, now["protocols"][protocol], strict=True):
            assert (a["row"], a["first"]) == (b["row"], b["first"])
            np.testing.assert_allclose(a["log_probs"], b["log_probs"], rtol=1e-6)
