"""LongPPL against its reference implementation (PKU-ML/LongPPL, run by
tests/golden/make_longppl_golden.py in a side environment on two tiny random Llamas with their own
tokenizers): the aggregate to 1e-6, every document's LongPPL, and the very key tokens."""

from __future__ import annotations

import json
import math
import os

import numpy as np
import pytest

from ppl_jax.config.defaults import get_config
from ppl_jax.config.settings import from_config
from ppl_jax.evaluation.run import evaluate
from ppl_jax.outputs.folder import OutputDir

import helpers

FOLDER = os.path.join(helpers.GOLDEN, "longppl")


@pytest.fixture(scope="module")
def golden() -> dict:
    with open(os.path.join(FOLDER, "golden.json"), encoding="utf-8") as f:
        return json.load(f)


def run(tmp_path, golden: dict, scenario: str):
    s = golden["scenarios"][scenario]
    c = get_config()
    c.checkpoint.dir = os.path.join(FOLDER, "model")
    c.data.path = os.path.join(FOLDER, "documents.jsonl")
    c.data.format = "jsonl"
    c.eval.protocol = "whole_documents"
    c.eval.seq_len = 768
    c.eval.add_bos = "false"  # the reference scores the model without special tokens
    c.eval.batch_size = 8
    c.eval.short_context = golden["trunc_len"]
    c.eval.short_targets = golden["sliding_window"]
    c.longppl.alpha, c.longppl.beta = s["alpha"], s["beta"]
    if scenario == "evaluator":
        c.longppl.evaluator.dir = os.path.join(FOLDER, "evaluator")
    c.output.dir = str(tmp_path / scenario)
    c.output.tokens = True
    c.output.progress = False
    c.output.gzip_baseline = False
    c.metrics.bootstrap_samples = 0
    out = OutputDir.open(c.output.dir)
    try:
        ev = evaluate(from_config(c), out=out)
    finally:
        out.close()
    return ev, s


# The evaluator scenario (another model finds the key tokens, matched by character offsets) in the
# default tiers; the model as its own evaluator in the slow tier.
@pytest.mark.parametrize("scenario", [pytest.param("self", marks=pytest.mark.slow), "evaluator"])
def test_longppl_equals_the_reference(tmp_path, golden, scenario):
    ev, want = run(tmp_path, golden, scenario)
    got = ev.diagnostics["long_context"]["longppl"]
    assert got["num_key_tokens"] == want["num_key_tokens"] > 50
    assert got["longppl"] == pytest.approx(want["longppl"], rel=1e-6)
    assert (got["alpha"], got["beta"]) == (want["alpha"], want["beta"])  # the settings, read
    keys = ev.diagnostics["longppl_keys"]
    starts = ev.plan.doc_starts
    for d, doc in enumerate(want["documents"]):
        rows = helpers.token_rows(ev.diagnostics["tokens_file"], d)
        offsets = rows.offset
        key = keys[starts[d] + offsets]
        # The reference lists key tokens by loss index: token i's loss is at i - 1.
        assert offsets[key].tolist() == [k + 1 for k in doc["key_loss_indices"]], d
        assert int(key.sum()) == (doc["n_key_token"] or 0)
        if doc["longppl"] is not None:
            mean = math.fsum(rows.nll[key].astype(np.float64)) / int(key.sum())
            assert math.exp(mean) == pytest.approx(doc["longppl"], rel=1e-6), d
    # The model's perplexity over the documents' scored tokens, as the reference's mean loss.
    assert got["num_tokens"] == sum(doc["n_token"] - 1 for doc in want["documents"])
