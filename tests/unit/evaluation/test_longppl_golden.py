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


class Bar:
    """A progress bar of the run (`ppl_jax.outputs.console.ProgressBar`'s interface)."""

    made: list[Bar] = []
    scenario = ""

    def __init__(self, num_windows: int, done: int, desc: str = ""):
        self.total, self.windows, self.desc, self.closed = num_windows, done, desc, False
        self.scenario = Bar.scenario
        Bar.made.append(self)

    def should_stop(self, i):
        return False

    def on_batch(self, i, rows, host):
        self.windows += sum(len(row) for row in rows)

    def close(self):
        self.closed = True


@pytest.fixture(scope="module")
def scored(tmp_path_factory, golden):
    """scenario -> (its Evaluation, its golden), each run once."""
    found = {}

    def get(scenario: str):
        if scenario not in found:
            Bar.scenario = scenario
            found[scenario] = run(tmp_path_factory.mktemp(scenario), golden, scenario)
        return found[scenario]

    return get


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
        ev = evaluate(from_config(c), Bar, out=out)
    finally:
        out.close()
    return ev, s


# The evaluator scenario (another model finds the key tokens, matched by character offsets) in the
# default tiers; the model as its own evaluator in the slow tier.
@pytest.mark.parametrize("scenario", [pytest.param("self", marks=pytest.mark.slow), "evaluator"])
def test_longppl_equals_the_reference(scored, scenario):
    ev, want = scored(scenario)
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


def test_every_pass_has_its_progress_bar_and_its_seconds(scored):
    """A long document with a short context and an evaluator model spent 478 of 527 s in those
    passes with the run's bar at 0 and no word of it: each pass now has its bar, started when it
    starts, and its seconds in results.json's `timing` and in the summary."""
    from ppl_jax.evaluation import summary
    from ppl_jax.outputs import console

    ev, _ = scored("evaluator")
    bars = [b for b in Bar.made if b.scenario == "evaluator"]
    names = [b.desc for b in bars]
    assert names == [
        "short context", "LongPPL evaluator", "LongPPL evaluator, short context", "scoring"
    ]  # fmt: skip
    assert all(b.closed and b.windows == b.total > 0 for b in bars)
    assert bars[-1].total == ev.sums.num_windows
    timing = ev.timing
    ran = ["setup", "restore", "short_context", "longppl_evaluator", "compile", "scoring"]
    assert all(timing[f"{k}_seconds"] > 0 for k in ran), timing
    assert timing["context_sweep_seconds"] is timing["reference_restore_seconds"] is None
    assert sum(timing[f"{k}_seconds"] for k in ran) <= ev.wall_seconds
    results = summary.results_dict(ev)
    assert results["timing"] == timing
    table = console.summary_table(results)
    assert "short context " in table and "LongPPL evaluator " in table and "scoring " in table
