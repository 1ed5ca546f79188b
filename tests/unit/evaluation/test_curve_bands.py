"""95% bands on the position and context-length curves, end to end on the tiny checkpoint: the
per-batch bucket sums add up to the curve, each band is the NumPy bootstrap of those sums, the
figures are written in every format asked for, and the sweep shows its progress."""

from __future__ import annotations

import json

import numpy as np
import pytest
from test_curve_intervals import numpy_bootstrap
from test_diagnostics import corpus, run, settings  # noqa: F401  (corpus is a fixture)

from ppl_jax.metrics import curves, uncertainty

SAMPLES = 200


@pytest.fixture(scope="module")
def banded(tiny_checkpoint, corpus, tmp_path_factory):  # noqa: F811
    out = tmp_path_factory.mktemp("bands")
    s = settings(
        tiny_checkpoint,
        corpus,
        out,
        output__position_curve=True,
        eval__context_lengths="4,16,40",
        eval__context_targets=8,
        metrics__bootstrap_samples=SAMPLES,
        metrics__seed=3,
        output__figures="png,pdf,svg",
        output__figure_size="3.5x2.5",
        output__figure_dpi=200,
    )
    return run(s), out


def test_the_position_curve_has_a_band_from_its_batches(banded):
    ev, _ = banded
    b = ev.totals.batch_buckets
    assert b.shape[0] == ev.layout.num_batches and b.shape[1] == 2
    curve = ev.diagnostics["position_curve"]
    edges = curves.bucket_edges(curve["num_positions"], curve["max_points"])
    # The per-batch sums add up to the curve's buckets (float64 sums of the same values).
    for bucket in curve["buckets"]:
        k = int(np.searchsorted(edges, bucket["first"]))
        assert b[:, 1, k].sum() == bucket["num_tokens"]
        assert np.isclose(b[:, 0, k].sum(), bucket["nll_sum"], rtol=1e-12)
    expected = numpy_bootstrap(b[:, 0], b[:, 1], SAMPLES, 3, 1)
    assert curve["intervals"]["units"] == ev.layout.num_batches
    assert curve["intervals"]["unit"] == "batch" and curve["intervals"]["samples"] == SAMPLES
    banded = 0
    for bucket in curve["buckets"]:
        k = int(np.searchsorted(edges, bucket["first"]))
        if expected[k] is None:  # scored in one batch only (the first window's early positions)
            assert bucket["perplexity_interval"] is None
            continue
        lo, hi = bucket["perplexity_interval"]
        np.testing.assert_allclose([lo, hi], expected[k], rtol=1e-12)
        assert lo <= bucket["perplexity"] * (1 + 1e-12) and bucket["perplexity"] <= hi * (1 + 1e-12)
        banded += 1
    assert banded >= 20  # stride 20 of 48: positions 28..48 are scored in every window


def test_each_context_length_has_a_band_from_its_windows(banded, tiny_checkpoint, corpus):  # noqa: F811
    ev, _ = banded
    rows = ev.diagnostics["context_curve"]["context_lengths"]
    assert ev.diagnostics["context_curve"]["intervals"]["unit"] == "window"
    for row in rows:
        lo, hi = row["perplexity_interval"]
        assert lo < row["perplexity"] < hi
    # Turning the bootstrap off leaves no band.
    assert all(r["perplexity_interval"] is not None for r in rows)
    assert uncertainty.LEVEL == ev.diagnostics["context_curve"]["intervals"]["level"]


def test_the_figures_are_written_in_every_format_asked_for(banded):
    import matplotlib.image

    _, out = banded
    for name in ("position_curve", "context_curve"):
        assert (out / f"{name}.pdf").read_bytes().startswith(b"%PDF-")
        assert b"<svg" in (out / f"{name}.svg").read_bytes()
        assert matplotlib.image.imread(str(out / f"{name}.png")).shape[:2] == (500, 700)
        saved = json.loads((out / f"{name}.json").read_text())
        assert saved["intervals"]["samples"] == SAMPLES


def test_no_bootstrap_no_band(tiny_checkpoint, corpus, tmp_path):  # noqa: F811
    ev = run(
        settings(
            tiny_checkpoint,
            corpus,
            tmp_path,
            output__position_curve=True,
            eval__context_lengths="4,16",
            eval__context_targets=8,
        )
    )
    for key, entries in (("position_curve", "buckets"), ("context_curve", "context_lengths")):
        curve = ev.diagnostics[key]
        assert curve["intervals"] is None
        assert all(e["perplexity_interval"] is None for e in curve[entries])


def test_the_sweep_shows_its_progress(tiny_checkpoint, corpus, tmp_path):  # noqa: F811
    """The context-length sweep ran ~115 s without a word: it now feeds the run's progress bar
    with every length's windows."""
    from ppl_jax.evaluation.run import run as run_job
    from ppl_jax.outputs.folder import OutputDir

    s = settings(
        tiny_checkpoint, corpus, tmp_path, eval__context_lengths="4,16,40", eval__context_targets=8
    )
    bars = []

    class Bar:  # the run's progress observer (`ppl_jax.outputs.console.ProgressBar`'s interface)
        def __init__(self, num_windows: int, done: int, desc: str = ""):
            self.bar = {"total": num_windows, "windows": done, "tokens": 0, "desc": desc}
            bars.append(self.bar)

        def should_stop(self, i):
            return False

        def on_batch(self, i, rows, host):
            self.bar["windows"] += sum(len(row) for row in rows)
            self.bar["tokens"] += int(host.num_tokens.sum())

        def close(self):
            pass

    factory = Bar

    with OutputDir.open(s.output_dir) as out:
        ev = run_job(s, out, factory, printer=lambda line: None).evaluations[-1]
    rows = ev.diagnostics["context_curve"]["context_lengths"]
    run_bar, sweep_bar = bars
    assert run_bar["windows"] == run_bar["total"] == ev.sums.num_windows
    assert sweep_bar["windows"] == sweep_bar["total"] > 0
    assert sweep_bar["tokens"] == sum(r["num_tokens"] for r in rows)
    assert (run_bar["desc"], sweep_bar["desc"]) == ("scoring", "context sweep")
    timing = ev.timing
    assert timing["context_sweep_seconds"] > 0 and timing["scoring_seconds"] > 0
    assert timing["short_context_seconds"] is None
