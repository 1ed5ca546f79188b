"""`ppl-jax report`: the table, the long CSV and the figure (PNG, PDF or SVG) of a results store."""

from __future__ import annotations

import csv
import json
import math
import os
import subprocess
import sys

import matplotlib.image
import numpy as np
import pytest

from ppl_jax.analysis import report
from ppl_jax.metrics.sums import Sums
from ppl_jax.outputs import figures, store

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
NAMES = ("web", "code", "books")


def make_store(folder) -> list[dict]:
    """Three steps of three datasets and their averages; `books` is missing at step 200 and
    `code` has no bytes (null bits per byte); one record of a checkpoint without a step."""
    rng = np.random.default_rng(1)
    tags = {"web": {"domain": "web"}, "code": {"domain": "code"}, "books": {"domain": "web"}}
    results = store.ResultsStore.in_dir(str(folder))
    for step in (None, 100, 200, 300):
        names = ("web",) if step is None else NAMES
        records = []
        for name in names:
            if name == "books" and step == 200:
                continue
            tokens = int(rng.integers(100, 5000))
            sums = Sums(
                nll_sum=float(tokens * rng.uniform(2, 6)),
                num_tokens=tokens,
                num_bytes=0 if name == "code" else 4 * tokens,
                num_words=tokens // 2,
            )
            records.append(
                store.dataset_record(
                    step=step, dataset=name, sums=sums, fingerprint="f", tags=tags[name]
                )
            )
        results.append(records + store.average_records(records))
    return results.records()


def exit_code(argv: list[str]) -> int:
    """`report.main`'s status, whether it returns it or argparse exits with it."""
    try:
        return report.main(argv)
    except SystemExit as e:
        return e.code


def test_table_csv_and_png(tmp_path, capsys):
    records = make_store(tmp_path)
    assert report.main([str(tmp_path)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("bits_per_byte by checkpoint step")
    assert out[-1] == f"report: {tmp_path}/report.csv, {tmp_path}/report.png"
    header, *rows = (line.split() for line in out[1:-1])
    columns = ["web", "code", "books", "micro", "macro", "macro/domain=code", "macro/domain=web"]
    assert header == ["step", *columns[:3], "|", *columns[3:]]
    assert [r[0] for r in rows] == ["none", "100", "200", "300"]
    for row in rows:
        step = None if row[0] == "none" else int(row[0])
        cells = dict(zip(columns, row[1:4] + row[5:], strict=True))
        assert row[4] == "|"
        for i, name in enumerate(columns):
            kind = "dataset" if i < 3 else "average"
            found = [
                r for r in records if (r["kind"], r["step"], r["dataset"]) == (kind, step, name)
            ]
            if not found:
                assert cells[name] == "-"
                continue
            value = found[0]["metrics"]["bits_per_byte"]
            assert cells[name] == ("null" if value is None else f"{value:.4f}")
    assert dict(zip(header, rows[2], strict=True))["books"] == "-"  # not evaluated at step 200
    assert dict(zip(header, rows[1], strict=True))["code"] == "null"  # no bytes

    # The CSV holds every metric of every record, exactly.
    with open(tmp_path / "report.csv", newline="") as f:
        reader = csv.reader(f)
        assert next(reader) == ["step", "dataset", "kind", "metric", "value"]
        got = [tuple(row) for row in reader]
    expected = [
        (
            "" if r["step"] is None else str(r["step"]),
            r["dataset"],
            r["kind"],
            metric,
            "" if value is None else value,
        )
        for r in records
        for metric, value in r["metrics"].items()
    ]
    parsed = [(s, d, k, m, "" if v == "" else float(v)) for s, d, k, m, v in got]
    assert sorted(parsed, key=str) == sorted(expected, key=str)
    assert len(got) == len(records) * len(store.MACRO_METRICS)
    assert got[0][0] == ""  # the null step first

    # The PNG: a valid image of the figure's size.
    data = (tmp_path / "report.png").read_bytes()
    assert data[:8] == PNG_MAGIC
    image = matplotlib.image.imread(str(tmp_path / "report.png"))
    assert image.shape == (610, 1080, 4) and image.std() > 0  # 2 rows of 3 panels


def test_another_metric_and_paths(tmp_path, capsys):
    records = make_store(tmp_path)
    (tmp_path / "out").mkdir()
    csv_path, png_path = tmp_path / "out" / "a.csv", tmp_path / "out" / "a.png"
    argv = [str(tmp_path / "results.jsonl"), "--metric", "perplexity"]
    assert report.main([*argv, "--csv", str(csv_path), "--png", str(png_path)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("perplexity by checkpoint step")
    micro300 = [r for r in records if r["step"] == 300 and r["dataset"] == "micro"][0]
    assert out[-2].split()[5] == f"{micro300['metrics']['perplexity']:.4f}"
    assert csv_path.exists() and png_path.read_bytes()[:8] == PNG_MAGIC
    assert sorted(os.listdir(tmp_path)) == ["out", "results.jsonl"]  # nothing else written
    # --png none: no plot.
    assert report.main([str(tmp_path), "--png", "none"]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == f"report: {tmp_path}/report.csv"
    assert not (tmp_path / "report.png").exists()


@pytest.mark.parametrize("flag", ["--figure", "--png"])
@pytest.mark.parametrize("ext, magic", [("pdf", b"%PDF-"), ("svg", b"<?xml"), ("png", PNG_MAGIC)])
def test_the_figure_is_written_in_the_format_of_its_extension(tmp_path, capsys, flag, ext, magic):
    """`--png report.pdf` wrote PNG bytes into a .pdf; the extension now picks the format."""
    make_store(tmp_path)
    path = tmp_path / f"report.{ext}"
    assert report.main([str(tmp_path), flag, str(path)]) == 0
    assert path.read_bytes().startswith(magic)
    assert capsys.readouterr().out.splitlines()[-1].endswith(f", {path}")


def test_size_and_dpi_of_the_figure(tmp_path):
    make_store(tmp_path)
    path = tmp_path / "small.png"
    assert report.main([str(tmp_path), "--figure", str(path), "--size", "4x3", "--dpi", "150"]) == 0
    assert matplotlib.image.imread(str(path)).shape[:2] == (450, 600)


def test_large_values_and_the_table_function():
    record = store.dataset_record(
        step=1, dataset="x", sums=Sums(nll_sum=20.0 * 10, num_tokens=10), fingerprint="f"
    )
    text = report.table([record], "perplexity")
    assert text.splitlines()[2].split() == ["1", f"{math.exp(20.0):.4e}"]


def test_mistakes_exit_2_with_one_line(tmp_path, capsys, monkeypatch):
    (tmp_path / "empty").mkdir()
    (tmp_path / "blank").mkdir()
    (tmp_path / "blank" / "results.jsonl").write_text("\n")
    (tmp_path / "run").mkdir()
    make_store(tmp_path / "run")
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "results.jsonl").write_text('{"kind": "dataset"}\n')
    for argv, words in (
        ([str(tmp_path / "missing")], "missing does not exist; give a run's output.dir"),
        ([str(tmp_path / "empty")], "results.jsonl does not exist; a run writes it"),
        ([str(tmp_path / "blank")], "results.jsonl holds no record; nothing to report."),
        ([str(tmp_path / "bad")], "results.jsonl line 1 is not a results record"),
        ([str(tmp_path / "run"), "--metric", "ppl"], "--metric=ppl is not in"),
        ([str(tmp_path / "run"), "--csv", str(tmp_path / "no" / "a.csv")], "create it first"),
        ([str(tmp_path / "run"), "--bogus"], "unrecognized arguments: --bogus"),
        ([str(tmp_path / "run"), "--figure", str(tmp_path / "r.jpg")], ".png (raster), .pdf"),
        ([str(tmp_path / "run"), "--png", str(tmp_path / "r.eps")], ".png (raster), .pdf"),
        ([str(tmp_path / "run"), "--size", "7"], "--size='7': give the width and height"),
        ([str(tmp_path / "run"), "--dpi", "0"], "--dpi='0': give a whole number"),
    ):
        assert exit_code(argv) == 2
        err = capsys.readouterr().err
        assert err.startswith("ppl-jax report: error:") and err.count("\n") == 1, err
        assert words in err, err
    assert "'bits_per_byte'" in exit_message(capsys, [str(tmp_path / "run"), "--metric", "x"])
    # Without matplotlib: the pip hint, and nothing written.
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)  # import fails
    err = exit_message(capsys, [str(tmp_path / "run")])
    assert "needs matplotlib" in err and "pip install 'ppl_jax[diagnostics]'" in err
    assert sorted(os.listdir(tmp_path / "run")) == ["results.jsonl"]


def exit_message(capsys, argv: list[str]) -> str:
    assert exit_code(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    return err


def test_the_command_line_entry_point(tmp_path):
    make_store(tmp_path)
    cmd = [sys.executable, "-m", "ppl_jax", "report"]
    ok = subprocess.run([*cmd, str(tmp_path), "--png", "none"], capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.splitlines()[-1] == f"report: {tmp_path}/report.csv"
    bad = subprocess.run([*cmd, str(tmp_path / "nowhere")], capture_output=True, text=True)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "Traceback" not in bad.stderr
    assert bad.stderr.startswith("ppl-jax report: error:")


@pytest.mark.parametrize("step", [None, 5])
def test_plot_draws_a_single_point(tmp_path, step):
    record = store.dataset_record(
        step=step, dataset="x", sums=Sums(nll_sum=3.0, num_tokens=1, num_bytes=1), fingerprint="f"
    )
    fig = report.figure([record], "bits_per_byte", "t")
    assert figures.figure_bytes(fig, "png")[:8] == PNG_MAGIC


def test_a_record_without_metrics_is_one_sentence_naming_the_line(tmp_path, capsys):
    make_store(tmp_path)
    lines = (tmp_path / "results.jsonl").read_text().splitlines()
    broken = json.loads(lines[2])
    del broken["metrics"]
    lines[2] = json.dumps(broken)
    (tmp_path / "results.jsonl").write_text("\n".join(["", *lines]) + "\n")  # a blank line 1
    err = exit_message(capsys, [str(tmp_path)])
    assert err.startswith(f"ppl-jax report: error: {tmp_path}/results.jsonl line 4 has no metrics")
    cmd = [sys.executable, "-m", "ppl_jax", "report", str(tmp_path)]
    bad = subprocess.run(cmd, capture_output=True, text=True)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr and "line 4" in bad.stderr


def intervals_store(folder, steps) -> list[dict]:
    """Two datasets with stored 95% intervals (`details.intervals`) and their averages."""
    os.makedirs(folder, exist_ok=True)
    results = store.ResultsStore.in_dir(str(folder))
    for step in steps:
        records = []
        for k, name in enumerate(("web", "code")):
            sums = Sums(
                nll_sum=1000.0 * (2 + k + 100 / (step + 10)), num_tokens=1000, num_bytes=4000
            )
            record = store.dataset_record(step=step, dataset=name, sums=sums, fingerprint="f")
            bpb = record["metrics"]["bits_per_byte"]
            details = {"intervals": {"bits_per_byte": [bpb - 0.1 * (k + 1), bpb + 0.05]}}
            records.append({**record, "details": details})
        results.append(records + store.average_records(records))
    return results.records()


def test_the_plot_is_small_multiples_with_interval_bands_and_a_log_step_axis(tmp_path):
    from matplotlib.collections import PolyCollection

    steps = (0, 10, 100, 1000, 10000)
    records = intervals_store(tmp_path, steps)
    fig = report.figure(records, "bits_per_byte", "t")
    drawn = [ax for ax in fig.axes if ax.lines]
    assert [ax.get_title() for ax in drawn] == ["web", "code", "averages"]
    for ax, name in zip(drawn[:2], ("web", "code"), strict=True):
        (line,) = ax.lines
        mine = [r for r in records if r["dataset"] == name]
        np.testing.assert_array_equal(line.get_xdata(), steps)
        np.testing.assert_array_equal(
            line.get_ydata(), [r["metrics"]["bits_per_byte"] for r in mine]
        )
        (band,) = [c for c in ax.collections if isinstance(c, PolyCollection)]
        ys = band.get_paths()[0].vertices[:, 1]
        lo = [r["details"]["intervals"]["bits_per_byte"][0] for r in mine]
        hi = [r["details"]["intervals"]["bits_per_byte"][1] for r in mine]
        assert np.isclose(ys.min(), min(lo)) and np.isclose(ys.max(), max(hi))
        assert ax.get_xscale() == "symlog"  # steps span decades, and step 0 is drawn
    averages = drawn[2]
    assert [line.get_label() for line in averages.lines] == ["micro", "macro"]
    assert len({line.get_color() for line in averages.lines}) == 2
    assert not [c for c in averages.collections if isinstance(c, PolyCollection)]
    labels = [
        t.get_text()
        for t in fig.legends + [a.get_legend() for a in fig.axes if a.get_legend()]
        for t in t.get_texts()
    ]
    assert labels == ["micro", "macro", "95% interval (bootstrap)"]
    # Steps within a factor of 10: a linear axis; all positive and spanning decades: log.
    assert (
        report.figure(intervals_store(tmp_path / "lin", (100, 200, 300)), "bits_per_byte", "t")
        .axes[0]
        .get_xscale()
        == "linear"
    )
    assert (
        report.figure(intervals_store(tmp_path / "log", (10, 100, 1000)), "bits_per_byte", "t")
        .axes[0]
        .get_xscale()
        == "log"
    )


# ---- many datasets: a figure drawn in time linear in its panels, capped ------------------------


def many_datasets(folder, n: int, steps=(100, 200, 300)) -> list[dict]:
    """`n` datasets at `steps` (the first one missing at the last step) and their averages."""
    results = store.ResultsStore.in_dir(str(folder))
    for step in steps:
        records = [
            store.dataset_record(
                step=step,
                dataset=f"set-{k:03d}",
                sums=Sums(nll_sum=1000.0 + 10 * k + step, num_tokens=500, num_bytes=2000),
                fingerprint="f",
            )
            for k in range(n)
            if k or step != steps[-1]
        ]
        results.append(records + store.average_records(records))
    return results.records()


def test_panels_show_the_same_steps_without_matplotlibs_shared_axes(tmp_path):
    """matplotlib's shared axes visit every sibling at each draw (100 panels: minutes); each panel
    now holds every step in its range instead, so a dataset missing a step is drawn on the
    others' axis all the same."""
    fig = report.figure(many_datasets(tmp_path, 5), "bits_per_byte", "t")
    fig.draw_without_rendering()
    drawn = [ax for ax in fig.axes if ax.lines]
    assert len(drawn) == 6
    for ax in drawn:
        assert ax.get_shared_x_axes().get_siblings(ax) == [ax]
        assert ax.get_xlim() == drawn[1].get_xlim()
    assert drawn[0].get_xlim()[0] < 100 and drawn[0].get_xlim()[1] > 300  # its data ends at 200
    labelled = [ax for ax in drawn if any(t.get_text() for t in ax.get_xticklabels())]
    assert labelled == drawn[-3:]  # the bottom panel of each column


def test_the_figure_draws_the_first_datasets_and_says_so(tmp_path, capsys):
    from ppl_jax.analysis import report_figure

    n = report_figure.MAX_DATASETS + 3
    records = many_datasets(tmp_path, n, steps=(100, 200))
    fig = report.figure(records, "bits_per_byte", "t")
    titles = [ax.get_title() for ax in fig.axes if ax.lines]
    assert titles == [f"set-{k:03d}" for k in range(report_figure.MAX_DATASETS)] + ["averages"]
    assert report.main([str(tmp_path)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[-2] == (
        f"The figure draws the first {report_figure.MAX_DATASETS} of the {n} datasets and their "
        "averages (the table and the CSV hold every one); --figure none skips the figure."
    )
    assert out[1].split()[-n - 3 : -2] == [f"set-{k:03d}" for k in range(n)] + ["|"]  # the table
    assert report.main([str(tmp_path), "--figure", "none"]) == 0
    assert "The figure" not in capsys.readouterr().out
    few = many_datasets(tmp_path / "few", 2)
    assert report_figure.cap_note(few) is None


def test_a_tool_starts_without_jax(tmp_path):
    """`ppl-jax report` imported the config, and so JAX, before reading a line (5 s of a 6 s
    report of 500 datasets); the tools now start from the command line's light module."""
    make_store(tmp_path)
    code = (
        "import sys; from ppl_jax.cli import main\n"
        f"sys.argv = ['ppl-jax', 'report', {str(tmp_path)!r}, '--figure', 'none']\n"
        "try:\n    main.run()\nexcept SystemExit as e:\n    assert e.code == 0, e.code\n"
        "print('jax' in sys.modules, 'ppl_jax.config.defaults' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "False False"
