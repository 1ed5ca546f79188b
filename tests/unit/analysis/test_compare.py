"""Intervals of real runs on the tiny checkpoint, their units.npz, and `ppl-jax compare`:
units that add up to the run, a run compared with itself, another model, and other data."""

import dataclasses
import json

import numpy as np
import pytest

from ppl_jax.analysis import compare
from ppl_jax.config.defaults import get_config
from ppl_jax.config.settings import from_config
from ppl_jax.evaluation import summary
from ppl_jax.evaluation.run import evaluate
from ppl_jax.metrics import uncertainty
from ppl_jax.outputs import console
from ppl_jax.outputs.folder import OutputDir

import helpers


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("corpus") / "text.txt"
    path.write_text(
        "\n".join(f"line {i}: " + "the quick brown fox é " * (i % 5 + 1) for i in range(40)),
        encoding="utf-8",
    )
    return str(path)


# The tiny Llama over the test BPE's 512 ids (which has <|endoftext|>, the prefix token that
# lm_eval_rolling needs), with two random draws of weights: two models to compare.
BPE_TINY = dataclasses.replace(helpers.TINY, vocab_size=512)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory, bpe_tokenizer) -> tuple[str, str]:
    paths = []
    for seed in (0, 1):
        path = str(tmp_path_factory.mktemp(f"ckpt{seed}") / "tiny")
        helpers.save_random_checkpoint(path, BPE_TINY, steps=(1,), seed=seed)
        paths.append(path)
    return tuple(paths)


def run(checkpoint, corpus, out, tokenizer, protocol="sliding", seq_len=32):
    """A run written as the command line writes it: results.json and units.npz in `out`."""
    c = get_config()
    c.checkpoint.dir = checkpoint
    c.data.path = corpus
    c.data.format = "lines"
    c.data.tokenizer = tokenizer
    c.eval.protocol = protocol
    c.eval.seq_len = seq_len
    c.eval.stride = 16 if protocol in ("sliding", "hf_strided") else None
    c.output.dir = out
    c.output.progress = False
    c.output.gzip_baseline = False
    c.metrics.bootstrap_samples = 400
    settings = from_config(c)
    with OutputDir.open(out) as o:
        ev = evaluate(settings, out=o)
        results = summary.results_dict(ev, c)
        o.write_json("results.json", results)
        o.write_bytes("units.npz", uncertainty.units_npz(ev))
        ev.recorder.discard()
    return ev, results


@pytest.fixture(scope="module")
def runs(checkpoints, bpe_tokenizer, corpus, tmp_path_factory):
    made = {}
    for name, ckpt, protocol in (
        ("a", checkpoints[0], "sliding"),
        ("b", checkpoints[1], "sliding"),
        ("docs", checkpoints[0], "lm_eval_rolling"),
        ("docs_b", checkpoints[1], "lm_eval_rolling"),
    ):
        out = str(tmp_path_factory.mktemp(name))
        made[name] = (out, *run(ckpt, corpus, out, bpe_tokenizer, protocol))
    return made


@pytest.mark.parametrize("name, unit", [("a", "window"), ("docs", "document")])
def test_the_units_add_up_to_the_run(runs, name, unit):
    out, ev, results = runs[name]
    units, identity = uncertainty.read_npz(f"{out}/units.npz")
    assert units.kind == unit
    assert int(units.tokens.sum()) == results["num_tokens"]
    assert int(units.bytes.sum()) == results["num_bytes"]
    if unit == "window":  # the very per-window array the run summed
        assert float(np.sum(units.nll)) == results["nll_sum"]
        assert units.count == results["num_windows"]
    else:  # per-document sums add in another order: equal to float64 rounding
        assert float(np.sum(units.nll)) == pytest.approx(results["nll_sum"], rel=1e-12)
        assert units.count == results["num_documents"] == 40
    assert identity["protocol"]["name"] == results["protocol"]["name"]


@pytest.mark.parametrize("name", ["a", "docs"])
def test_results_hold_intervals_around_the_point_estimate(runs, name):
    _, _, r = runs[name]
    iv = r["intervals"]
    assert iv["samples"] == 400 and iv["seed"] == 0
    assert iv["method"] == uncertainty.METHODS[iv["unit"]]
    for key in ("perplexity", "bits_per_byte"):
        lo, hi = iv[key]
        assert lo <= r[key] <= hi and lo < hi
    assert "95% interval" in console.summary_table(r)
    json.dumps(r, allow_nan=False)


def test_a_run_compared_with_itself_differs_by_exactly_zero(runs, capsys):
    out = runs["a"][0]
    assert compare.main([out, f"{out}/results.json"]) == 0
    text = capsys.readouterr().out
    assert "+0.0000   [+0.0000, +0.0000]" in text
    (record,) = compare.compare(out, out, None, None)
    for key in ("bits_per_byte", "nll_per_token"):
        assert record[key]["difference"] == 0.0 and record[key]["interval"] == [0.0, 0.0]
    assert record["samples"] == 400  # A's own metrics.bootstrap_samples


@pytest.mark.parametrize("pair", [("a", "b"), ("docs", "docs_b")])
def test_another_model_differs_by_its_metrics(runs, pair):
    (out_a, _, ra), (out_b, _, rb) = runs[pair[0]], runs[pair[1]]
    (record,) = compare.compare(out_a, out_b, 300, 5)
    for key in ("bits_per_byte", "nll_per_token"):
        d = record[key]["difference"]
        assert d == pytest.approx(rb[key] - ra[key], rel=1e-9, abs=1e-12)
        lo, hi = record[key]["interval"]
        assert lo <= d <= hi and lo < hi
    assert record["seed"] == 5 and record["samples"] == 300


def test_compare_refuses_runs_of_other_data(runs, checkpoints, bpe_tokenizer, tmp_path, capsys):
    assert compare.main([runs["a"][0], runs["docs"][0]]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("ppl-jax compare: error:") and "\n" not in err
    assert 'protocol.name: "sliding" -> "lm_eval_rolling"' in err
    # The same settings on other text: the units' bytes differ.
    other = tmp_path / "other.txt"
    other.write_text("\n".join(f"row {i}: lorem ipsum" for i in range(40)), encoding="utf-8")
    out = str(tmp_path / "run")
    run(checkpoints[0], str(other), out, bpe_tokenizer)
    assert compare.main([runs["a"][0], out]) == 2
    assert "not scored on the same data" in capsys.readouterr().err
    assert compare.main([runs["a"][0], str(tmp_path / "missing")]) == 2
    assert "does not exist" in capsys.readouterr().err
