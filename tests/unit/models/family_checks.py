"""Checks every family of issue 24 runs on its committed golden model (tests/golden/families/):
that turning a feature off moves the NLL past the tolerance, and that the NLL does not depend on
the batch, on packing, or on the experts (or heads) split over the `model` mesh axis."""

from __future__ import annotations

import ast
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

from ppl_jax.checkpoints.formats import safetensors
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
    sharded = safetensors.load_params(path, target)
    param = sharded
    for key in sharded_param:
        param = param[key]
    assert param.addressable_shards[0].data.shape[axis] == param.shape[axis] // 2
    np.testing.assert_allclose(
        score_rows(model, sharded, windows.rows(np.arange(ROWS)))[:n], base, rtol=rtol
    )


# Tables keyed by another program's own vocabulary, not by ppl_jax's families: file (relative to
# the package) -> the names of its module-level assignments that hold one. llama.cpp names its
# pre-tokenizers (`tokenizer.ggml.pre`) after the models that introduced them ("llama4",
# "qwen2", ...), but a GGUF of any architecture may carry any of them, and the table would stay
# right with the family gone.
FOREIGN_VOCABULARIES = {os.path.join("tokenizer", "gguf.py"): ("SPLITS",)}


def family_names(family: str) -> set[str]:
    """The names by which ppl_jax knows `family`: its own (the description's `family`), the
    Hugging Face model types it reads and the GGUF architectures it reads."""
    from ppl_jax.models import registry

    record = registry.families()[family]
    return {family, *record.hf_readers, *record.gguf}


def _without_foreign_tables(source: str, tables: tuple[str, ...]) -> str:
    """`source` with the module-level assignments to `tables` blanked out (lines kept)."""
    lines = source.splitlines()
    for node in ast.parse(source).body:
        targets = node.targets if isinstance(node, ast.Assign) else []
        if any(isinstance(t, ast.Name) and t.id in tables for t in targets):
            for i in range(node.lineno - 1, node.end_lineno):
                lines[i] = ""
    return "\n".join(lines)


def names_of(family: str) -> list[str]:
    """The package files that name `family` as a family: a string literal equal to one of its
    names (`family_names`: its own, its Hugging Face model types, its GGUF architectures: what a
    branch on a description, a `config.json` or a GGUF file would compare with), or its module
    (`families.<name>`, `from ppl_jax.models.families import <name>`). A family is one module,
    so the answer is its own.

    Not a family's name: prose (a docstring naming transformers' own classes is not a second
    room for the family) and a table keyed by another program's vocabulary
    (`FOREIGN_VOCABULARIES`: llama.cpp's pre-tokenizer names, among them "llama4", are data for
    every GGUF file). Only the assignment of such a table is left out, so any other use of the
    name in its file still counts."""
    import ppl_jax

    package = os.path.dirname(os.path.abspath(ppl_jax.__file__))
    quoted = "|".join(re.escape(n) for n in sorted(family_names(family)))
    naming = re.compile(
        rf"[\"'](?:{quoted})[\"']|families\.{family}\b|families import [^\n]*\b{family}\b"
    )
    found = []
    for folder, _, files in os.walk(package):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                relative = os.path.relpath(path, package)
                source = open(path, encoding="utf-8").read()
                if relative in FOREIGN_VOCABULARIES:
                    source = _without_foreign_tables(source, FOREIGN_VOCABULARIES[relative])
                if naming.search(source):
                    found.append(relative)
    return sorted(found)
