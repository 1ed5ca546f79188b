"""Every figure of the package at the sizes a paper prints (one column, 3.5 x 2.5 in; two, 7 x 3
in) and at its own: rendered (Agg), then its text boxes checked. No two texts that are drawn
overlap, every text lies inside the figure, no axes collapsed, every legend entry names an artist
that is drawn, and no legend covers a point of the data."""

from __future__ import annotations

import math
import warnings
from unittest import mock

import numpy as np
import pytest

from ppl_jax.analysis import report, report_figure
from ppl_jax.metrics import curves
from ppl_jax.metrics.sums import Sums
from ppl_jax.outputs import curve_figures, figure_layout, figures, store

SIZES = [None, (3.5, 2.5), (7.0, 3.0)]
DPI = 72  # small, for speed; the boxes scale with it
SLACK = 1.0  # pixels


def render(fig):
    """Draws `fig` on its Agg canvas at `DPI`; returns the texts drawn (visible, not empty) and
    the renderer. constrained layout that gives up (axes collapsed to zero) warns: an error."""
    from matplotlib.text import Text

    fig.set_dpi(DPI)
    drawn = {}
    real = Text.draw

    def spy(self, renderer):
        real(self, renderer)
        if self.get_visible() and self.get_text().strip():
            drawn[id(self)] = self

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with mock.patch.object(Text, "draw", spy):
            fig.canvas.draw()
    return list(drawn.values()), fig.canvas.get_renderer()


def _drawn_artists(fig):
    """(label, artist) of every artist in the axes that draws something."""
    for ax in fig.axes:
        for a in [*ax.lines, *ax.collections, *ax.patches, *ax.containers]:
            label = a.get_label() or ""
            if label.startswith("_"):
                continue
            if hasattr(a, "get_xydata"):
                if not np.isfinite(np.asarray(a.get_xydata(), float)).all(axis=1).any():
                    continue
            elif hasattr(a, "get_paths") and not any(len(p.vertices) for p in a.get_paths()):
                continue
            elif hasattr(a, "get_visible") and not a.get_visible():
                continue
            yield label, a


def _data_points(fig) -> np.ndarray:
    """Every vertex of the data (lines, bands, bars) in display pixels."""
    points = []
    for ax in fig.axes:
        for line in ax.lines:
            xy = np.asarray(line.get_xydata(), float)
            points.append(line.get_transform().transform(xy[np.isfinite(xy).all(axis=1)]))
        for c in ax.collections:
            for path in c.get_paths():
                xy = path.vertices[np.isfinite(path.vertices).all(axis=1)]
                if len(xy):
                    points.append(c.get_transform().transform(xy))
    return np.concatenate(points) if points else np.zeros((0, 2))


def layout_faults(fig) -> list[str]:
    """What is wrong with the drawn figure's layout, in words (empty: nothing)."""
    texts, renderer = render(fig)
    faults = []
    w, h = fig.bbox.width, fig.bbox.height
    boxes = [(t, t.get_window_extent(renderer)) for t in texts]
    for t, b in boxes:
        if b.x0 < -SLACK or b.y0 < -SLACK or b.x1 > w + SLACK or b.y1 > h + SLACK:
            faults.append(f"{t.get_text()!r} leaves the figure: {b.bounds} in {w}x{h}")
    for i, (t, a) in enumerate(boxes):
        for u, b in boxes[i + 1 :]:
            dx = min(a.x1, b.x1) - max(a.x0, b.x0)
            dy = min(a.y1, b.y1) - max(a.y0, b.y0)
            if dx > SLACK and dy > SLACK:
                faults.append(f"{t.get_text()!r} overlaps {u.get_text()!r}")
    for ax in fig.axes:
        if ax.axison and (ax.bbox.width < 20 or ax.bbox.height < 20):
            faults.append(f"axes {ax.get_title()!r} collapsed to {ax.bbox.bounds}")
    drawn = {"".join(label.split()) for label, _ in _drawn_artists(fig)}
    points = _data_points(fig)
    legends = [*fig.legends, *(ax.get_legend() for ax in fig.axes if ax.get_legend())]
    for legend in legends:
        labels = [t.get_text() for t in legend.get_texts()]
        if len(legend.legend_handles) != len(labels):
            faults.append(f"legend {labels}: {len(legend.legend_handles)} handles")
        faults += [
            f"legend entry {label!r} names nothing drawn"
            for label in labels
            if "".join(label.split()) not in drawn
        ]
        box = legend.get_window_extent(renderer)
        inside = (
            (points[:, 0] > box.x0)
            & (points[:, 0] < box.x1)
            & (points[:, 1] > box.y0)
            & (points[:, 1] < box.y1)
        )
        if inside.any():
            faults.append(f"legend {labels} covers {int(inside.sum())} points of the data")
    return faults


# ---- the data ----------------------------------------------------------------------------------


def results_store(folder, datasets, steps, tags=True) -> str:
    s = store.ResultsStore.in_dir(str(folder))
    for step in steps:
        records = []
        for k, name in enumerate(datasets):
            nll = 1000.0 / math.log10((step or 0) + 20) + 50 * k
            bpb = nll / 2000 / math.log(2)
            records.append(
                store.dataset_record(
                    step=step,
                    dataset=name,
                    sums=Sums(nll_sum=nll, num_tokens=500, num_bytes=2000),
                    fingerprint="f",
                    tags={"domain": name} if tags else {},
                    checkpoint="c",
                    details={"intervals": {"bits_per_byte": [bpb * 0.97, bpb * 1.03]}},
                )
            )
        s.append(records + store.average_records(records))
    return str(folder)


def position(p: int, bands: bool = True, gains: bool = False) -> dict:
    rng = np.random.default_rng(1)
    count = rng.integers(1, 1000, p).astype(np.int64)
    count[0] = 0
    curve = curves.position_curve(count * (2.0 + 3.0 / np.sqrt(np.arange(p) + 1.0)), count)
    for b in curve["buckets"]:
        if bands and b["perplexity"] is not None:
            b[curve_figures.INTERVAL] = [b["perplexity"] * 0.95, b["perplexity"] * 1.05]
        if gains:
            b["context_gain"] = {"num_tokens": b["num_tokens"], "gain_per_token": 0.5 / b["last"]}
    if bands:
        curve["intervals"] = {"unit": "batch", "units": 12}
    return curve


def context(lengths: int, bands: bool = True) -> dict:
    rows = [(256 * 2**i, 3000.0 + 500.0 / (i + 1), 1000) for i in range(lengths)]
    curve = curves.context_curve(rows, targets_per_window=64)
    for r in curve["context_lengths"]:
        if bands:
            r[curve_figures.INTERVAL] = [r["perplexity"] * 0.97, r["perplexity"] * 1.03]
    if bands:
        curve["intervals"] = {"unit": "window", "units": [10] * lengths}
    return curve


def every_figure(tmp_path):
    """name -> a function of the size that draws that figure."""
    one = results_store(tmp_path / "one", ["wikitext-103-validation"], [1000, 2000, 3000], False)
    two = results_store(tmp_path / "two", ["web", "code"], [1000, 2000, 3000])
    many_steps = [None, 100, 200, 500, 1000, 2000, 5000, 10_000, 20_000, 50_000, 100_000]
    wide = results_store(tmp_path / "wide", ["web", "code"], many_steps)
    even = results_store(tmp_path / "even", ["web"], [0, 12_500, 25_000, 37_500, 50_000, 62_500])
    return {
        "report, one dataset": lambda size: _report(one, size),
        "report, two datasets and tags": lambda size: _report(two, size),
        "report, steps 0 to 100k": lambda size: _report(wide, size),
        "report, perplexity, 6 linear steps": lambda size: _report(even, size, "perplexity"),
        "position curve": lambda size: curve_figures.position_figure(
            position(4097), "wiki", size=size
        ),
        "position curve, 33 positions": lambda size: curve_figures.position_figure(
            position(33, bands=False), "a dataset with a long name", size=size
        ),
        "position curve with gains": lambda size: curve_figures.position_figure(
            position(1025, gains=True), "wiki", size=size
        ),
        "context curve": lambda size: curve_figures.context_figure(context(7), "wiki", size=size),
        "context curve, two lengths": lambda size: curve_figures.context_figure(
            context(2), "wiki", size=size
        ),
    }


def _report(folder, size, metric="bits_per_byte"):
    records = report.load(folder)[1]
    return report.figure(
        records, metric, f"{report.label(metric)} by checkpoint step: run", size=size
    )


# ---- the tests ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def drawers(tmp_path_factory):
    return every_figure(tmp_path_factory.mktemp("figures"))


# Every figure at a column (the hardest size); the main ones also at two columns and their own.
EVERYWHERE = ("report, two datasets and tags", "position curve with gains", "context curve")
TWO_COLUMNS = (*EVERYWHERE, "report, steps 0 to 100k", "position curve")


@pytest.mark.parametrize("size", SIZES, ids=["own size", "3.5x2.5", "7x3"])
def test_every_figure_lays_out_its_text_at_paper_sizes(drawers, size):
    chosen = {None: EVERYWHERE, (7.0, 3.0): TWO_COLUMNS}.get(size, tuple(drawers))
    faults = {}
    for name in chosen:
        fig = drawers[name](size)
        if size is not None:
            assert tuple(fig.get_size_inches()) == size, name
        found = layout_faults(fig)
        if found:
            faults[name] = found
    assert not faults, faults


def test_the_docs_snippet_at_a_column(tmp_path):
    """docs/diagnostics.md: the position curve redrawn from its JSON at 3.5 x 2.4 in."""
    fig = curve_figures.position_figure(position(4097), "wiki", size=(3.5, 2.4))
    assert layout_faults(fig) == []
    path = figures.save_figure(fig, str(tmp_path / "position.png"), dpi=200)
    import matplotlib.image

    assert matplotlib.image.imread(path).shape[:2] == (480, 700)


def test_a_column_uses_smaller_fonts_and_the_own_size_the_house_style():
    small = curve_figures.context_figure(context(3), "wiki", size=(3.5, 2.5))
    own = curve_figures.context_figure(context(3), "wiki")
    sizes = [
        {t.get_fontsize() for t in fig.axes[0].get_xticklabels()}
        | {fig.axes[0].xaxis.label.get_fontsize()}
        for fig in (small, own)
    ]
    assert sizes == [{7.0, 8.0}, {8.0, 9.0}]
    assert figure_layout.style_for(figures.STYLE, (4.75, 3))["xtick.labelsize"] == 7.5


def test_the_report_legend_names_the_band_only_when_one_is_drawn(tmp_path):
    """The averages hold no interval: the band in the legend is a dataset's, drawn in its panel;
    without intervals in the records the legend names none."""
    folder = results_store(tmp_path, ["web", "code"], [10, 100, 1000])
    records = report.load(folder)[1]
    fig = _report(folder, None)
    (legend,) = fig.legends or [ax.get_legend() for ax in fig.axes if ax.get_legend()]
    assert report.BAND in [t.get_text() for t in legend.get_texts()]
    assert layout_faults(fig) == []
    for r in records:
        r.get("details", {}).pop("intervals", None)
    bare = report.figure(records, "bits_per_byte", "t")
    (legend,) = bare.legends or [ax.get_legend() for ax in bare.axes if ax.get_legend()]
    assert report.BAND not in [t.get_text() for t in legend.get_texts()]


def test_the_checker_sees_the_faults_it_looks_for():
    """The old layout's faults, made on purpose: overlapping titles, text out of the figure, a
    legend entry for nothing drawn, a legend over the data."""
    from matplotlib.patches import Patch

    fig = figures.new_figure(3.5, 2.5, "a test figure")
    left, right = fig.subplots(1, 2)
    left.plot([0, 1, 2], [0, 1, 2], label="a line")
    left.set_title("a title far too long for its panel")
    right.set_title("the next panel's title")
    right.text(2.5, 0.5, "outside", transform=right.transAxes)
    left.legend(
        [left.lines[0], Patch(color="grey")], ["a line", "a band never drawn"], loc="center"
    )
    faults = "\n".join(layout_faults(fig))
    assert "overlaps" in faults
    assert "'outside' leaves the figure" in faults
    assert "'a band never drawn' names nothing drawn" in faults
    assert "covers 1 points of the data" in faults


@pytest.mark.parametrize(
    "text, width, expected",
    [
        ("web", 1.0, "web"),
        ("perplexity by checkpoint step: run", 1.2, "perplexity by\ncheckpoint step: run"),
        ("perplexity by checkpoint step: run", 0.9, "perplexity by\ncheckpoint\nstep: run"),
        ("wikitext-103-validation", 0.9, "wikitext-103-\nvalidation"),
        ("a" * 40, 0.5, "aaaaa…"),
        ("one two three four five six seven", 0.5, "one two\nthree\nfour fi…"),
    ],
)
def test_fit_text_breaks_lines_where_they_fit(text, width, expected):
    out = figure_layout.fit_text(text, width, 8.0)
    assert out == expected
    assert all(figure_layout.text_width(line, 8.0) <= width * 72 for line in out.split("\n"))


def test_ppl_jax_report_at_a_column(tmp_path):
    """`ppl-jax report RUN --figure=report.png --size 3.5x2.5 --dpi 200` draws the figure at that
    size (not drawn at its own and shrunk)."""
    import matplotlib.image

    folder = results_store(tmp_path, ["web", "code"], [1000, 2000, 3000])
    drawn = []
    real = report.figure
    with mock.patch.object(
        report, "figure", lambda *a, **k: drawn.append(real(*a, **k)) or drawn[-1]
    ):
        _, _, path = report.report(
            folder, figure_path=str(tmp_path / "r.png"), size=(3.5, 2.5), dpi=200
        )
    assert matplotlib.image.imread(path).shape[:2] == (500, 700)
    (fig,) = drawn
    assert tuple(fig.get_size_inches()) == (3.5, 2.5)
    assert layout_faults(fig) == []


# ---- figures for a paper: title and legend off or placed, one value range ---------------------


def _data_height(fig) -> float:
    """The share of the figure's height that the drawn axes get (their heights added up)."""
    fig.draw_without_rendering()
    return sum(ax.get_position().height for ax in fig.axes if ax.axison)


@pytest.mark.parametrize(
    "options, least",
    [
        ({}, 0.40),
        ({"title": False, "legend": "right"}, 0.65),
        ({"title": False, "legend": "none"}, 0.78),
    ],
)
@pytest.mark.parametrize("draw", ["position", "context"])
def test_at_a_column_the_data_gets_the_height_the_title_and_legend_leave(draw, options, least):
    """At 3.5 x 2.5 in, the title, the line under it, a two-line x label and a three-row legend
    left the data 43% of the height; without the title and with the legend right of the axes
    it gets 70%, with no legend 82%, and nothing overlaps or leaves the figure."""
    curve = position(4097) if draw == "position" else context(7)
    fig = getattr(curve_figures, f"{draw}_figure")(curve, "wiki", size=(3.5, 2.5), **options)
    assert _data_height(fig) >= least
    assert layout_faults(fig) == []
    assert bool(fig.get_suptitle()) == options.get("title", True)
    assert bool(fig.legends) == (options.get("legend") != "none")


def test_the_legend_names_the_buckets_bars_only_where_they_show():
    """A long window's log buckets are a few points wide, under the line: their bars were drawn
    unseen and named in the legend ('positions of a bucket'); now neither. Eight buckets over
    4,096 positions show, and are named."""

    def labels(fig):
        return [t.get_text().replace("\n", " ") for lg in fig.legends for t in lg.get_texts()]

    for size in [(3.5, 2.5), None]:
        fig = curve_figures.position_figure(position(4097), "wiki", size=size)
        assert "positions of a bucket" not in labels(fig)
        assert layout_faults(fig) == []
    count = np.arange(4097)
    coarse = curves.position_curve(3.0 * count, count, max_points=8)
    fig = curve_figures.position_figure(coarse, "wiki", size=(3.5, 2.5))
    assert "positions of a bucket" in labels(fig)
    assert layout_faults(fig) == []


def test_the_report_without_title_and_legend_with_one_value_range(tmp_path):
    folder = results_store(tmp_path, ["web", "code"], [1000, 2000, 3000])
    records = report.load(folder)[1]
    fig = report.figure(records, "bits_per_byte", None, (3.5, 2.5), legend="none", share_y=True)
    fig.draw_without_rendering()
    drawn = [ax for ax in fig.axes if ax.lines]
    assert len(drawn) == 3 and not fig.get_suptitle() and not fig.legends
    assert not [ax for ax in fig.axes if ax.get_legend()]
    assert {ax.get_ylim() for ax in drawn} == {drawn[0].get_ylim()}
    values = [v for ax in drawn for line in ax.lines for v in line.get_ydata()]
    low, high = drawn[0].get_ylim()
    assert low < min(values) and max(values) < high
    cols = report_figure.grid(3, (3.5, 2.5))[1]
    for i, ax in enumerate(drawn):
        assert any(t.get_text() for t in ax.get_yticklabels()) == (i % cols == 0)
        assert ax.get_shared_y_axes().get_siblings(ax) == [ax]
    assert layout_faults(fig) == []
    with pytest.raises(ValueError, match="legend 'left'"):
        report.figure(records, "bits_per_byte", "t", legend="left")
    right = report.figure(records, "bits_per_byte", "t", (3.5, 2.5), legend="right")
    assert len(right.legends) == 1 and layout_faults(right) == []
    assert _data_height(right) > _data_height(
        report.figure(records, "bits_per_byte", "t", (3.5, 2.5))
    )


def test_ppl_jax_report_takes_the_title_legend_and_value_range(tmp_path, capsys):
    folder = results_store(tmp_path, ["web", "code"], [1000, 2000, 3000])
    drawn = []
    real = report.figure
    argv = [folder, "--title", "none", "--legend", "right", "--share-y", "--size", "3.5x2.5"]
    with mock.patch.object(report, "figure", lambda *a, **k: drawn.append((a, k)) or real(*a, **k)):
        assert report.main(argv) == 0
    ((args, kwargs),) = drawn
    assert args[2] is None and kwargs["legend"] == "right" and kwargs["share_y"] is True
    with pytest.raises(SystemExit) as e:
        report.main([folder, "--legend", "left"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("ppl-jax report: error: argument --legend: invalid choice: 'left'")
    assert err.count("\n") == 1
