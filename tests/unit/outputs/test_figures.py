"""Figures a paper can print: the format by the file's extension (PDF and SVG as vectors), size
and DPI, one style for every figure, 95% bands on the curves, and the same bytes for the same
figure; the curves' and the report's figures drawn from their JSON."""

from __future__ import annotations

import io
import math
import re
import subprocess
import sys

import numpy as np
import pytest

from ppl_jax.analysis import report, report_figure
from ppl_jax.errors import ConfigError
from ppl_jax.metrics import curves
from ppl_jax.outputs import curve_figures, figures

import helpers

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
LINE_BLUE = np.array([0x00, 0x72, 0xB2]) / 255  # Okabe-Ito blue, the curve's


def decode(png: bytes) -> np.ndarray:
    import matplotlib.image

    assert png[:8] == PNG_MAGIC
    return matplotlib.image.imread(io.BytesIO(png), format="png")


def curve_pixels(image: np.ndarray) -> int:
    return int((np.abs(image[..., :3] - LINE_BLUE).max(axis=-1) < 0.1).sum())


def position_sums(p: int, seed: int = 1) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    count = rng.integers(1, 1000, p).astype(np.int64)
    count[0] = 0
    return count * (2.0 + 3.0 / np.sqrt(np.arange(p) + 1.0)), count


def context() -> dict:
    return curves.context_curve(
        [(256, 3500.0, 1000), (512, 3200.0, 1000), (1024, 3000.0, 1000)], targets_per_window=64
    )


def with_bands(curve: dict, key: str, width: float = 0.05) -> dict:
    for entry in curve[key]:
        if entry["perplexity"] is not None:
            ppl = entry["perplexity"]
            entry[curve_figures.INTERVAL] = [ppl * (1 - width), ppl * (1 + width)]
    curve["intervals"] = {"unit": "batch", "units": 12}
    return curve


# ---- the format follows the extension ---------------------------------------------------------


def small_figure():
    @figures.styled
    def draw():
        fig = figures.new_figure(3.0, 2.0, "a test figure")
        ax = fig.add_subplot()
        ax.plot([1, 2, 3], [3, 1, 2], label="a line")
        ax.set_title("a title")
        ax.legend()
        return fig

    return draw()


@pytest.mark.parametrize(
    "name, magic",
    [("f.png", PNG_MAGIC), ("f.pdf", b"%PDF-"), ("F.PDF", b"%PDF-"), ("f.svg", b"<?xml")],
)
def test_save_figure_writes_the_format_its_extension_names(tmp_path, name, magic):
    path = figures.save_figure(small_figure(), str(tmp_path / name))
    data = open(path, "rb").read()
    assert data.startswith(magic)
    if name.lower().endswith(".svg"):
        assert b"<svg" in data and b"<image" not in data  # vector, no embedded raster
    if name.lower().endswith(".pdf"):
        assert b"/Type3" not in data  # text as TrueType (type 42), not Type 3 fonts


@pytest.mark.parametrize("name", ["f.jpg", "f", "f.png.txt", "f.eps"])
def test_another_extension_is_refused_in_one_sentence_and_nothing_is_written(tmp_path, name):
    with pytest.raises(ConfigError, match=r"\.png \(raster\), \.pdf or \.svg"):
        figures.save_figure(small_figure(), str(tmp_path / name))
    assert list(tmp_path.iterdir()) == []


def test_a_missing_folder_is_one_sentence(tmp_path):
    with pytest.raises(ConfigError, match="does not exist; create it first"):
        figures.save_figure(small_figure(), str(tmp_path / "no" / "f.pdf"))


@pytest.mark.parametrize("fmt", figures.FORMATS)
def test_the_same_figure_gives_the_same_bytes(fmt):
    a, b = (figures.figure_bytes(small_figure(), fmt) for _ in range(2))
    assert a == b
    if fmt != "png":
        assert not re.search(rb"20\d\d-\d\d-\d\d", a)  # no date written


def test_size_and_dpi_set_the_pixels_of_a_png():
    image = decode(figures.figure_bytes(small_figure(), "png", dpi=200, size=(2.5, 1.5)))
    assert image.shape[:2] == (300, 500)
    assert decode(figures.figure_bytes(small_figure(), "png")).shape[:2] == (200, 300)


def test_the_size_of_a_pdf_is_in_points():
    data = figures.figure_bytes(small_figure(), "pdf", size=(3.5, 2.0))
    box = re.search(rb"/MediaBox \[ *0 0 ([\d.]+) ([\d.]+) *\]", data)
    assert box and (float(box.group(1)), float(box.group(2))) == (252.0, 144.0)


@pytest.mark.parametrize(
    "text, expected",
    [("3.5x2.5", (3.5, 2.5)), ("7,3", (7.0, 3.0)), (" 2X2 ", (2.0, 2.0)), ("", None)],
)
def test_sizes_parse(text, expected):
    assert figures.parse_size(text, "--size") == expected


@pytest.mark.parametrize("text", ["3.5", "0x2", "-1x2", "axb", "1x2x3", "nanx1", "1000x1"])
def test_bad_sizes_are_one_sentence(text):
    with pytest.raises(ConfigError, match=r"--size=.*WIDTHxHEIGHT"):
        figures.parse_size(text, "--size")


@pytest.mark.parametrize("value", ["0", "-3", "abc", "1201", "2.5"])
def test_bad_dpis_are_one_sentence(value):
    with pytest.raises(ConfigError, match=r"--dpi=.*whole number"):
        figures.parse_dpi(value, "--dpi")


def test_the_run_settings_of_figures():
    spec = figures.FigureSpec.parse("PDF, png,pdf", "3.5x2", "300")
    assert spec == figures.FigureSpec(("pdf", "png"), (3.5, 2.0), 300)
    for bad in ("jpg", "", "png,tiff"):
        with pytest.raises(ConfigError, match=r"output\.figures="):
            figures.FigureSpec.parse(bad)


# ---- one style for every figure ---------------------------------------------------------------


def every_figure(tmp_path):
    nll, count = position_sums(200)
    store = helpers_store(tmp_path)
    return {
        "position": curve_figures.position_figure(curves.position_curve(nll, count), "wiki"),
        "context": curve_figures.context_figure(context(), "wiki"),
        "report": report.figure(report.load(store)[1], "bits_per_byte", "t"),
    }


def helpers_store(tmp_path) -> str:
    from ppl_jax.outputs import store

    s = store.ResultsStore.in_dir(str(tmp_path))
    for step in (10, 100, 1000):
        s.append(
            [
                store.dataset_record(
                    step=step,
                    dataset=name,
                    sums=_sums(step, k),
                    fingerprint="f",
                    tags={},
                    checkpoint="c",
                    wall_seconds=1.0,
                    details={},
                )
                for k, name in enumerate(("web", "code"))
            ]
        )
    return str(tmp_path)


def _sums(step: int, k: int):
    from ppl_jax.metrics.sums import Sums

    return Sums(nll_sum=1000.0 / math.log10(step) + 50 * k, num_tokens=500, num_bytes=2000)


def test_every_figure_is_drawn_in_one_style(tmp_path):
    for name, fig in every_figure(tmp_path).items():
        fig.draw_without_rendering()
        for ax in fig.axes:
            if not ax.axison:
                continue
            assert not ax.spines["top"].get_visible(), name
            assert not ax.spines["right"].get_visible(), name
            ticks = [t for t in ax.get_xticklabels() if t.get_text()]
            assert ticks and {t.get_fontsize() for t in ticks} == {8.0}, name
            assert ax.xaxis.label.get_fontsize() == 9.0, name
        for legend in fig.legends + [ax.get_legend() for ax in fig.axes if ax.get_legend()]:
            assert not legend.get_frame_on(), name
            assert {t.get_fontsize() for t in legend.get_texts()} == {8.0}, name
        assert fig.get_suptitle(), name


def test_the_style_does_not_leak_into_matplotlibs_defaults(tmp_path):
    import matplotlib

    before = dict(matplotlib.rcParams)
    every_figure(tmp_path)
    figures.figure_bytes(small_figure(), "pdf")
    assert dict(matplotlib.rcParams) == before


# ---- the curves' figures (moved from tests/unit/metrics/test_curves.py) ------------------------


@pytest.mark.parametrize("p", [33, 4097])
def test_position_figure_is_a_png_of_the_curve(p):
    nll, count = position_sums(p)
    curve = curves.position_curve(nll, count)
    image = decode(figures.figure_bytes(curve_figures.position_figure(curve, "by position"), "png"))
    assert image.shape == (450, 700, 4)
    assert curve_pixels(image) > 200  # the curve is drawn
    flat = curves.position_curve(count * 2.0, count)
    other = decode(figures.figure_bytes(curve_figures.position_figure(flat, "by position"), "png"))
    assert not np.array_equal(image, other)


def test_context_figure_is_a_png_of_the_curve():
    image = decode(figures.figure_bytes(curve_figures.context_figure(context(), "ctx"), "png"))
    assert image.shape == (450, 700, 4)
    assert curve_pixels(image) > 200
    assert image[..., :3].std() > 0.05


def test_figures_without_matplotlib_say_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)  # import fails
    curve = curves.position_curve(np.array([0.0, 1.0]), np.array([0, 1]))
    with pytest.raises(ConfigError, match=r"pip install 'ppl_jax\[diagnostics\]'"):
        curve_figures.position_figure(curve, "x")
    with pytest.raises(ConfigError, match=r"or pass --figure none"):
        report_figure._figure(1)


def tick_texts(axis) -> list[str]:
    """The labels of the major ticks in view."""
    lo, hi = sorted(axis.get_view_interval())
    return [
        t.get_text()
        for t, x in zip(axis.get_ticklabels(), axis.get_ticklocs(), strict=True)
        if lo <= x <= hi and t.get_text()
    ]


def test_position_ticks_read_as_counts_and_its_title_says_what_it_shows():
    rng = np.random.default_rng(2)
    count = rng.integers(1, 1000, 4097)
    count[0] = 0
    nll = count * rng.uniform(0.5, 8.0, 4097)
    fig = curve_figures.position_figure(curves.position_curve(nll, count), "wiki")
    fig.draw_without_rendering()
    (ax,) = fig.axes
    assert ax.get_xscale() == "log"
    labels = tick_texts(ax.xaxis)
    assert {"1", "10", "100", "1k"} <= set(labels), labels
    assert not any("." in t for t in labels), labels  # not 1.0, 10.0, 100.0
    assert fig.get_suptitle() == "Perplexity by position in the window"
    assert ax.get_title() == f"wiki: {int(count.sum()):,} scored tokens"


def test_context_figure_draws_one_line_and_the_ranges_as_named_bars():
    from matplotlib.collections import LineCollection

    fig = curve_figures.context_figure(context(), "wiki")
    fig.draw_without_rendering()
    (ax,) = fig.axes
    (line,) = ax.lines  # the curve, and no other line
    np.testing.assert_array_equal(line.get_xdata(), [256, 512, 1024])
    np.testing.assert_allclose(line.get_ydata(), [math.exp(s) for s in (3.5, 3.2, 3.0)])
    (bars,) = [c for c in ax.collections if isinstance(c, LineCollection)]
    spans = [seg[:, 0].tolist() for seg in bars.get_segments()]
    assert spans == [[256, 319], [512, 575], [1024, 1087]]
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert legend == ["context the scored tokens saw", "perplexity"]
    assert tick_texts(ax.xaxis) == ["256", "512", "1,024"]
    assert fig.get_suptitle() == "Perplexity against context length"


# ---- 95% bands --------------------------------------------------------------------------------


def band_polygons(ax) -> list[np.ndarray]:
    from matplotlib.collections import PolyCollection  # fill_between's

    polys = [c for c in ax.collections if isinstance(c, PolyCollection)]
    return [p.vertices for c in polys for p in c.get_paths()]


@pytest.mark.parametrize("banded", [False, True])
def test_context_figure_draws_the_intervals_as_a_band(banded):
    curve = with_bands(context(), "context_lengths") if banded else context()
    fig = curve_figures.context_figure(curve, "wiki")
    (ax,) = fig.axes
    polygons = band_polygons(ax)
    assert bool(polygons) == banded
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert ("95% interval (bootstrap over 12 batches)" in legend) == banded
    if banded:  # the band spans each point's interval
        ys = np.concatenate(polygons)[:, 1]
        lows = [r[curve_figures.INTERVAL][0] for r in curve["context_lengths"]]
        highs = [r[curve_figures.INTERVAL][1] for r in curve["context_lengths"]]
        assert np.isclose(ys.min(), min(lows)) and np.isclose(ys.max(), max(highs))


def test_position_figure_draws_the_buckets_intervals_as_a_band():
    nll, count = position_sums(4097)
    curve = with_bands(curves.position_curve(nll, count), "buckets")
    (ax,) = curve_figures.position_figure(curve, "wiki").axes
    (polygon,) = band_polygons(ax)
    assert polygon[:, 1].max() > max(b["perplexity"] for b in curve["buckets"])
    # Two lengths only: error bars, not a band.
    two = with_bands(
        curves.context_curve([(4, 350.0, 100), (8, 300.0, 100)], targets_per_window=4),
        "context_lengths",
    )
    (ax,) = curve_figures.context_figure(two, "wiki").axes
    assert not band_polygons(ax) and len(ax.containers) == 2  # two error bars


@pytest.mark.parametrize(
    "x, text",
    [
        (0, "0"),
        (1, "1"),
        (512, "512"),
        (1000, "1k"),
        (1024, "1,024"),
        (4096, "4,096"),
        (10_000, "10k"),
        (131_072, "131k"),
        (2_000_000, "2M"),
        (0.5, "0.5"),
        (2.0, "2"),
    ],
)
def test_count_labels(x, text):
    assert figures.count_label(x) == text


def test_nothing_in_metrics_draws_or_imports_matplotlib():
    """REVIEW 3.3: metrics/ is NumPy only; the figures live in outputs/."""
    import os

    folder = os.path.join(helpers.REPO, "ppl_jax", "metrics")
    for name in os.listdir(folder):
        if name.endswith(".py"):
            text = open(os.path.join(folder, name), encoding="utf-8").read()
            assert "matplotlib" not in text and "def plot" not in text, name
    code = "import sys, ppl_jax.outputs.figures, ppl_jax.outputs.curve_figures; "
    code += "assert 'matplotlib' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=helpers.REPO)
