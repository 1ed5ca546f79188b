"""The rest of the grids whose first cases run in the default tiers (tests/unit/models/
test_attention.py, test_context.py, tests/slow/test_context_scoring.py): every block
size of every mask against float64, attention over every mesh of the context axis, every
state pass, every golden model on every mesh, every layout option."""

import json
import os

import pytest
import test_attention
import test_context
import test_context_scoring

BLOCKS = [(16, 16), (8, 24), (128, 256)]


@pytest.mark.parametrize(
    "mask,blocks",
    [
        (m, b)
        for m in test_attention.MASKS
        for b in BLOCKS
        if (m, b) not in test_attention.REFERENCE_CASES
    ],
    ids=str,
)
def test_xla_equals_float64_reference(mask, blocks):
    test_attention.test_xla_equals_float64_reference(mask, blocks)


@pytest.mark.parametrize(
    "data,context,ring,mask",
    [
        (d, c, r, m)
        for d, c in test_context.MESHES
        for r in (False, True)
        for m in test_context.CONTEXT_MASKS
        if (d, c, r, m) not in test_context.CONTEXT_CASES
    ],
    ids=str,
)
def test_attend_over_context_equals_one_device(data, context, ring, mask):
    test_context.test_attend_over_context_equals_one_device(data, context, ring, mask)


@pytest.mark.parametrize(
    "how,data,context",
    [
        (h, d, c)
        for h in ("pass_state", "prefix_state")
        for d, c in [(8, 1), (1, 8), (2, 4)]
        if (h, d, c) not in test_context.STATE_CASES
    ],
)
def test_state_passes_through_the_chunks_in_row_order(how, data, context):
    test_context.test_state_passes_through_the_chunks_in_row_order(how, data, context)


@pytest.mark.parametrize("name,mesh_shape", [("llama", (2, 4, 1)), ("mistral", (1, 8, 1))], ids=str)
def test_one_window_over_the_context_axis_equals_transformers(name, mesh_shape):
    path = os.path.join(test_context_scoring.CONTEXT_GOLDEN, "log_probs.json")
    with open(path, encoding="utf-8") as f:
        golden = json.load(f)
    test_context_scoring.test_one_window_over_the_context_axis_equals_transformers(
        golden, name, mesh_shape
    )


@pytest.mark.parametrize("mesh_shape,options", test_context_scoring.PACKED_CASES[2:], ids=str)
def test_packed_rows_and_every_output_in_row_order(mesh_shape, options):
    test_context_scoring.test_packed_rows_and_every_output_in_row_order(mesh_shape, options)
