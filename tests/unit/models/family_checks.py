"""Checks every family of issue 24 runs on its committed golden model (tests/golden/families/):
that turning a feature off moves the NLL past the tolerance, and that the NLL does not depend on
the batch, on packing, or on the experts (or heads) split over the `model` mesh axis."""

from __future__ import annotations

import json
import os
import re

import numpy as np
from test_families import (
    FAMILY_DIR,
    ROWS,
    golden,
    load_dir,
    loaded,
    ppl_windows,
    protocol_nll,
    score_rows,
)

from ppl_jax.checkpoints import hf
from ppl_jax.config.defaults import DEFAULT_RULES
from ppl_jax.runtime import mesh as mesh_lib

# The default rules with the experts (not their hidden dims) over the `model` axis.
EXPERTS_OVER_MODEL = tuple(r for r in DEFAULT_RULES if r[0] not in ("mlp", "experts")) + (
    ("experts", "model"),
    ("mlp", None),
)


def reference(family: str, protocol: str = "sliding") -> np.ndarray:
    """transformers' float32 NLL of every scored target of the protocol."""
    return np.concatenate(
        [-np.asarray(w["log_probs"]) for w in golden(family)["protocols"][protocol]]
    )


def largest_change(family: str, change: dict) -> float:
    """The largest per-token NLL difference from transformers with `change` applied to the
    family's description (a feature turned off)."""
    model, params = loaded(family, description=json.dumps(change))
    ours = np.concatenate(protocol_nll(golden(family), "sliding", model, params))
    return float(np.max(np.abs(ours - reference(family))))


def check_invariance(
    family: str, sharded_param: tuple[str, ...], axis: int, rtol: float = 1e-6
) -> None:
    """Every window's NLL is the same within `rtol` relative scored in batches of 1, 4 or 16 rows,
    packed two windows to a row (and then equal to transformers' within 1e-5), and with the
    experts over the `model` axis of a data=4, model=2 mesh (`sharded_param`: the path of a
    param whose `axis` must then be split in two)."""
    g = golden(family)
    path = os.path.join(FAMILY_DIR, family)
    model, params = load_dir(path)
    windows = ppl_windows(g, "sliding")
    n = windows.num_windows
    base = score_rows(model, params, windows.rows(np.arange(ROWS)))[:n]
    for batch in (1, 4, 16):
        got = np.concatenate(
            [
                score_rows(model, params, windows.rows(np.arange(i, i + batch)))
                for i in range(0, n, batch)
            ]
        )[:n]
        np.testing.assert_allclose(got, base, rtol=rtol)
    pairs = [tuple(range(i, min(i + 2, n))) for i in range(0, n, 2)]
    packed = windows.fill(pairs + [()] * (16 - len(pairs)), 2 * (g["seq_len"] + 1))
    nll = score_rows(model, params, packed)
    ref = g["protocols"]["sliding"]
    for row, ids in enumerate(pairs):
        expected = np.concatenate([-np.asarray(ref[k]["log_probs"]) for k in ids])
        np.testing.assert_allclose(nll[row][packed["target_mask"][row, 1:]], expected, rtol=1e-5)
    target, _ = mesh_lib.param_targets(
        model.abstract_params, model.logical_axes, mesh_lib.make_mesh(4, 2), EXPERTS_OVER_MODEL
    )
    sharded = hf.load_params(path, target)
    param = sharded
    for key in sharded_param:
        param = param[key]
    assert param.addressable_shards[0].data.shape[axis] == param.shape[axis] // 2
    np.testing.assert_allclose(
        score_rows(model, sharded, windows.rows(np.arange(ROWS)))[:n], base, rtol=rtol
    )


def names_of(family: str) -> list[str]:
    """The package files that name `family` as ppl_jax knows it (`"name"` or
    `families.name`; a docstring naming transformers' own classes is not a second room): a
    family is one module, so only its own."""
    import ppl_jax

    package = os.path.dirname(os.path.abspath(ppl_jax.__file__))
    naming = re.compile(rf"[\"']{family}[\"']|families\.{family}\b")
    found = []
    for folder, _, files in os.walk(package):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                if naming.search(open(path, encoding="utf-8").read()):
                    found.append(os.path.relpath(path, package))
    return found
