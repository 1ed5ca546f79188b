"""`ppl-jax compare` on any two steps of a sweep and any dataset of a suite, with the digits a
precision study needs, and the tools' common error prefix."""

from __future__ import annotations

import json
import math
import os
import re

import numpy as np
import pytest
from ml_collections import config_dict

from ppl_jax.analysis import compare
from ppl_jax.config.defaults import get_config
from ppl_jax.config.settings import from_config
from ppl_jax.evaluation import run as run_lib
from ppl_jax.metrics import uncertainty
from ppl_jax.outputs import store
from ppl_jax.outputs.folder import OutputDir

import helpers

STEPS = (1, 2)


@pytest.fixture(scope="module")
def sweep(tmp_path_factory) -> str:
    """A tiny Llama at steps 1 and 2 (other weights at each), scored on a suite of two datasets
    at both steps, as the command line writes it."""
    root = tmp_path_factory.mktemp("sweep")
    ckpt = str(root / "ckpt")
    for step in STEPS:
        helpers.save_random_checkpoint(ckpt, steps=(step,), seed=step)
    text = helpers.stdlib_text(1600)
    suite = [
        {"name": "prose", "path": helpers.corpus_files(root, [text[:500], text[500:900]], "p")},
        {"name": "code", "path": helpers.corpus_files(root, [text[900:]], "c")},
    ]
    c = get_config()
    c.checkpoint.dir = ckpt
    c.checkpoint.step = "all"
    c.eval.seq_len = 32
    c.eval.batch_size = 8
    c.output.dir = str(root / "out")
    c.output.progress = False
    c.output.gzip_baseline = False
    c.metrics.bootstrap_samples = 200
    c.metrics.seed = 4
    c.suite = tuple(config_dict.ConfigDict(e) for e in suite)
    s = from_config(c)
    with OutputDir.open(s.output_dir) as out:
        found = run_lib.run(s, out, None, lambda line: None, None)
        out.write_json("results.json", found.results)
    return str(root / "out")


def stored(folder: str, step: int, dataset: str) -> dict:
    (r,) = [
        r
        for r in store.ResultsStore.in_dir(folder).records()
        if (r["kind"], r["step"], r["dataset"]) == ("dataset", step, dataset)
    ]
    return r


def test_a_sweep_keeps_the_units_of_every_step_and_dataset(sweep):
    names = sorted(n for n in os.listdir(sweep) if n.startswith("units"))
    assert names == [f"units-step{s}-{d}.npz" for s in STEPS for d in ("code", "prose")]
    for s in STEPS:
        for d in ("code", "prose"):
            units, identity = uncertainty.read_npz(f"{sweep}/units-step{s}-{d}.npz")
            assert (identity["step"], identity["dataset"]) == (s, d)
            assert int(units.tokens.sum()) == stored(sweep, s, d)["sums"]["num_tokens"]


def test_two_steps_of_one_sweep_compare(sweep, capsys):
    (record,) = compare.compare(sweep, sweep, None, None, 1, 2, ["prose"])
    a, b = stored(sweep, 1, "prose"), stored(sweep, 2, "prose")
    assert record["steps"] == {"a": 1, "b": 2}
    assert (record["samples"], record["seed"]) == (200, 4)  # the run's own
    for key in ("bits_per_byte", "nll_per_token"):
        d = record[key]["difference"]
        assert d == pytest.approx(b["metrics"][key] - a["metrics"][key], rel=1e-9)
        lo, hi = record[key]["interval"]
        assert lo <= d <= hi and lo < hi
    # The command line: B defaults to A, --step_a/--step_b, every shared dataset by default.
    assert compare.main([sweep, "--step_a", "1", "--step_b", "2"]) == 0
    text = capsys.readouterr().out
    assert text.count("data: ") == 2 and "data: code" in text and "data: prose" in text
    assert f"A: {sweep}/units-step1-code.npz (step 1)" in text
    assert f"B: {sweep}/units-step2-code.npz (step 2)" in text


def test_the_latest_step_by_default_and_one_dataset_of_a_suite(sweep, capsys):
    records = compare.compare(sweep, sweep, 100, 0, 1, compare.LATEST, ["code"])
    assert [(r["dataset"], r["steps"]["b"]) for r in records] == [("code", 2)]
    assert compare.main([sweep, "--step", "2", "--dataset", "code"]) == 0
    text = capsys.readouterr().out
    assert "+0.0000   [+0.0000, +0.0000]" in text  # a step with itself: exactly zero


@pytest.mark.parametrize(
    "argv, words",
    [
        (["--step_a", "7"], "holds per-unit sums of steps 1, 2, not of step 7"),
        (
            ["--dataset", "web"],
            "has no dataset 'web' at step 2; its datasets there are code, prose",
        ),
        (["--step", "x"], "'x' is not a step"),
        (["--digits", "40"], "--digits=40 must be 0 to 15"),
        (["--bogus"], "unrecognized arguments: --bogus"),
    ],
)
def test_mistakes_are_one_line_with_the_tools_prefix(sweep, capsys, argv, words):
    try:
        code = compare.main([sweep, *argv])
    except SystemExit as e:
        code = e.code
    assert code == 2
    err = capsys.readouterr().err
    assert err.startswith("ppl-jax compare: error:") and err.count("\n") == 1, err
    assert words in err, err


def test_a_folder_without_units_says_what_a_run_writes(tmp_path, capsys):
    (tmp_path / "results.json").write_text("{}")
    assert compare.main([str(tmp_path), str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "holds no units.npz" in err and "predates" not in err


# ---- digits for precision studies -------------------------------------------------------------


def write_run(folder, nll: np.ndarray, tokens: np.ndarray) -> str:
    os.makedirs(folder, exist_ok=True)
    units = uncertainty.Units("window", nll, tokens, tokens * 4, uncertainty.block_length(nll.size))
    identity = {"protocol": {"name": "sliding", "seq_len": 64}, "data": {}, "tokenizer": "t"}
    identity.update(step=None, dataset="wiki")
    with open(os.path.join(folder, "units.npz"), "wb") as f:
        f.write(uncertainty.to_npz(units, identity))
    return str(folder)


def test_a_tiny_difference_is_printed_with_enough_digits(tmp_path, capsys):
    """bfloat16 against float32 moves bits per byte by about 1e-6: four decimals printed
    `+0.0000`; the table now shows the difference to three significant digits."""
    rng = np.random.default_rng(0)
    tokens = rng.integers(50, 64, 400)
    nll = tokens * rng.uniform(2.0, 3.0, 400)
    a = write_run(tmp_path / "a", nll, tokens)
    b = write_run(tmp_path / "b", nll * (1 + 1e-6 + 1e-7 * rng.standard_normal(400)), tokens)
    assert compare.main([a, b, "--samples", "200"]) == 0
    line = [x for x in capsys.readouterr().out.splitlines() if x.startswith("bits per byte")][0]
    (record,) = compare.compare(a, b, 200, 0)
    d = record["bits_per_byte"]["difference"]
    assert 1e-7 < abs(d) < 1e-5
    printed = float(line.split()[5])
    assert printed == pytest.approx(d, rel=5e-3)  # three significant digits at least
    lo, hi = (float(v) for v in re.findall(r"[+-]\d\.\d+", line.split("[")[1]))
    assert lo < hi and lo == pytest.approx(record["bits_per_byte"]["interval"][0], rel=5e-3)
    # --digits fixes the decimals; --json gives every float in full.
    assert compare.main([a, b, "--samples", "200", "--digits", "4"]) == 0
    assert "+0.0000" in capsys.readouterr().out
    assert compare.main([a, b, "--samples", "200", "--json"]) == 0
    (parsed,) = json.loads(capsys.readouterr().out)
    assert parsed["bits_per_byte"]["difference"] == d
    assert math.isfinite(parsed["nll_per_token"]["interval"][1])
