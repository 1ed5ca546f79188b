"""The figures of the curves: perplexity by position in the window, and against context length.

They draw the strict-JSON curves of `ppl_jax.metrics.curves` (`position_curve`, `context_curve`)
in the house style of `ppl_jax.outputs.figures`, with each point's 95% interval as a band where
the curve holds one (`perplexity_interval: [lo, hi]` in a bucket or a row; see
`ppl_jax.metrics.uncertainty.curve_intervals`). Written by the run as `position_curve.<format>`
and `context_curve.<format>` (`output.figures`); redrawn from the JSON with

    from ppl_jax.outputs import curve_figures, figures
    curve = json.load(open("position_curve.json"))
    fig = curve_figures.position_figure(curve, "wiki", size=(3.5, 2.4))  # one column, inches
    figures.save_figure(fig, "position.pdf")

Each figure is laid out for the size it is drawn at (`size`, default `WIDTH` x `HEIGHT`): fonts
scaled to its width, titles and labels broken into lines that fit, x ticks thinned so that their
labels never touch, and the legend below the axes, outside the data
(`ppl_jax.outputs.figure_layout`). For a paper, `title=False` leaves the title and the line
under it to the caption, and `legend="right"` or `"none"` gives the data the figure's height.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from ppl_jax.outputs import figure_layout, figures
from ppl_jax.outputs.console import plural

WHAT = "the position and context-length curves"
WIDTH, HEIGHT = 7.0, 4.5  # inches
BUCKET_SHOWS = 9.0  # points: a bucket's bar shows beside its marker (3 points) from this width
INTERVAL = "perplexity_interval"  # a bucket's or a row's 95% interval of perplexity, [lo, hi]


def check_available() -> None:
    """Raises ConfigError (before any work) if matplotlib, which the figures need, is missing."""
    figures.check_available(WHAT)


def _interval(entry: Mapping[str, Any]) -> tuple[float | None, float | None]:
    pair = entry.get(INTERVAL)
    if isinstance(pair, (list, tuple)) and len(pair) == 2 and None not in pair:
        return float(pair[0]), float(pair[1])
    return None, None


def _interval_note(curve: Mapping[str, Any]) -> str:
    """The legend's name of the bands: `95% interval (bootstrap over 12 batches)`."""
    about = curve.get("intervals") or {}
    units, unit = about.get("units"), about.get("unit")
    if isinstance(units, list) and unit:  # per point (the sweep: each length's own windows)
        return f"95% interval (bootstrap over each point's {unit}s)"
    if isinstance(units, int) and unit:
        return f"95% interval (bootstrap over {plural(units, unit, unit + 'es' if unit.endswith('ch') else None)})"
    return "95% interval (bootstrap)"


def _inches(fig: Any, legend: str = "below") -> float:
    """About the width of the axes of `fig` in inches (its width less the y axis's labels, and
    less a legend `right` of them)."""
    share = figure_layout.RIGHT_SHARE if legend == "right" else 0.0
    return max(1.0, fig.get_figwidth() * (1 - share) - 0.75)


def _perplexity_axis(ax: Any, values: list[float]) -> None:
    """Log y axis when perplexity spans more than a factor of 10 (early positions often do)."""
    if figures.log_if_wide(values):
        ax.set_yscale("log")
    ax.set_ylabel("perplexity")
    ax.grid(True, **figures.GRID)


def _titles(fig: Any, ax: Any, what: str, label: str, tokens: int, title: bool) -> None:
    """What the plot shows as its title; the data (`label`: a dataset's name) and how many
    targets it holds below it; each broken into lines that fit the figure's width. Neither
    when not `title` (a paper's caption says them)."""
    import matplotlib

    if not title:
        return

    width = fig.get_figwidth() - 0.2
    fig.suptitle(figure_layout.fit_text(what, width, matplotlib.rcParams["figure.titlesize"]))
    sub = f"{label}: {tokens:,} scored tokens" if label else f"{tokens:,} scored tokens"
    ax.set_title(
        figure_layout.fit_text(sub, _inches(fig), matplotlib.rcParams["axes.titlesize"]),
        color=figures.SUBTITLE,
    )


def _xlabel(fig: Any, ax: Any, text: str, legend: str) -> None:
    """The x axis's label, broken into lines that fit under the axes (`legend`: where the
    legend goes)."""
    import matplotlib

    width = _inches(fig, legend)
    ax.set_xlabel(figure_layout.fit_text(text, width, matplotlib.rcParams["axes.labelsize"]))


def _legend(fig: Any, ax: Any, where: str) -> None:
    """The legend of `ax`'s labelled artists, `where` (`figure_layout.LEGENDS`: below the axes
    by default, right of them, or none; never over the data)."""
    handles, labels = ax.get_legend_handles_labels()
    figure_layout.place_legend(fig, handles, labels, where="below" if where == "auto" else where)


def _shown_buckets(points: list[Mapping[str, Any]], log_x: bool, inches: float) -> list[Any]:
    """The buckets wider than one position whose span shows beside their marker: at least
    `BUCKET_SHOWS` points wide on an axis `inches` wide (log buckets of a long window are
    mostly a few points wide, hidden under the line: neither drawn nor named then)."""
    wide = [b for b in points if b["last"] > b["first"]]
    if not wide:
        return []
    f = math.log10 if log_x else float
    lo = f(min(b["first"] for b in points))
    span = f(max(b["last"] for b in points)) - lo
    scale = inches * 72.0 / span if span > 0 else 0.0
    return [b for b in wide if (f(b["last"]) - f(b["first"])) * scale >= BUCKET_SHOWS]


@figures.styled
def position_figure(
    curve: Mapping[str, Any],
    label: str,
    size: tuple[float, float] | None = None,
    title: bool = True,
    legend: str = "below",
) -> Any:
    """The Figure of perplexity against position in the window (`position_curve`'s result).

    One point per bucket, at its position (one-position buckets) or the geometric middle of its
    first and last position, with a light bar over the positions it covers where that shows
    beside the point (`_shown_buckets`; named in the legend only then); the buckets' 95%
    intervals as a band when the curve holds them; a log x axis with ticks `1, 10, 100, 1k` when
    the positions are bucketed; the overall perplexity as a dashed line. Null (infinite)
    perplexities are not drawn. Title: "Perplexity by position in the window", then `label`
    (the dataset's name) and the scored tokens. A curve by position in the document
    (`ppl_jax.metrics.position.document_curve`: `positions`) says so, and with context gains
    draws each bucket's gain per token (nats) in a panel below. Laid out for `size`
    (`(width, height)` inches; default `WIDTH` x `HEIGHT`); `title` False leaves out the
    title and the line under it, `legend` (`figure_layout.LEGENDS`) places the legend: below
    the axes by default, right of them, or none.

    Raises:
      ConfigError: matplotlib is not installed.
    """
    fig = figures.new_figure(*(size or (WIDTH, HEIGHT)), WHAT)
    gains = [b for b in curve["buckets"] if (b.get("context_gain") or {}).get("num_tokens")]
    ax = fig.add_subplot(2, 1, 1) if gains else fig.add_subplot()
    log_x = curve["bucketing"] == "log"
    points = [
        b for b in curve["buckets"] if b["perplexity"] is not None and (b["first"] > 0 or not log_x)
    ]
    x = [
        math.sqrt(b["first"] * b["last"]) if log_x else (b["first"] + b["last"]) / 2 for b in points
    ]
    y = [b["perplexity"] for b in points]
    blue = figures.COLORS[0]
    ax.plot(x, y, marker="o", markersize=3, color=blue, label="perplexity at position")
    lo, hi = zip(*(_interval(b) for b in points), strict=True) if points else ((), ())
    banded = figures.band(ax, x, lo, hi, blue, y, _interval_note(curve))
    wide = _shown_buckets(points, log_x, _inches(fig))
    if wide:
        ax.hlines(
            [b["perplexity"] for b in wide],
            [b["first"] for b in wide],
            [b["last"] for b in wide],
            linewidth=4,
            color=blue,
            alpha=0.25,
            label="positions of a bucket",
        )
    overall = curve["total"]["perplexity"]
    if overall is not None:
        ax.axhline(overall, linestyle="--", color=figures.GREY, label=f"overall {overall:.4g}")
    figures.count_axis(ax, "x", log_x)
    where = curve.get("positions", "window")
    xlabel = f"position in {where} (tokens of context)" + (", log scale" if log_x else "")
    _perplexity_axis(ax, y + ([v for v in lo + hi if v is not None] if banded else []))
    tokens = curve["total"]["num_tokens"]
    _titles(fig, ax, f"Perplexity by position in the {where}", label, tokens, title)
    if gains:
        _gain_panel(fig, ax, gains, log_x)
        ax.tick_params(labelbottom=False)
    _xlabel(fig, fig.axes[-1], xlabel, legend)
    _legend(fig, ax, legend)
    return fig


def _gain_panel(fig: Any, ax: Any, gains: list[Mapping[str, Any]], log_x: bool) -> None:
    """Each bucket's context gain per token (short-context NLL - full NLL, nats) in a panel
    under `ax`, on its x axis."""
    low = fig.add_subplot(2, 1, 2, sharex=ax)
    x = [
        math.sqrt(b["first"] * b["last"]) if log_x else (b["first"] + b["last"]) / 2 for b in gains
    ]
    y = [b["context_gain"]["gain_per_token"] for b in gains]
    low.plot(x, y, marker="o", markersize=3, color=figures.COLORS[1])
    low.axhline(0.0, color=figures.GREY, linewidth=0.8)
    low.set_title("context gain per token (nats)", loc="left", color=figures.SUBTITLE)
    low.grid(True, **figures.GRID)


@figures.styled
def context_figure(
    curve: Mapping[str, Any],
    label: str,
    size: tuple[float, float] | None = None,
    title: bool = True,
    legend: str = "below",
) -> Any:
    """The Figure of perplexity against context length (`context_curve`'s result), log2 x axis.

    Each point sits at its context length, joined by a line; its 95% interval (when the curve
    holds one) as a band (error bars for fewer than three lengths); when the curve gives the
    context range, the range of context its targets saw (`min_context` to `max_context`) is a
    light, thick bar under the point, named in the legend (not a second line). Null
    perplexities are not drawn. Title: "Perplexity against context length", then `label` and
    the scored tokens. Laid out for `size` (`(width, height)` inches; default `WIDTH` x
    `HEIGHT`): a tick at each length whose label has room; `title` and `legend` as in
    `position_figure`.

    Raises:
      ConfigError: matplotlib is not installed.
    """
    fig = figures.new_figure(*(size or (WIDTH, HEIGHT)), WHAT)
    ax = fig.add_subplot()
    rows = [r for r in curve["context_lengths"] if r["perplexity"] is not None]
    x = [r["context_length"] for r in rows]
    y = [r["perplexity"] for r in rows]
    blue = figures.COLORS[0]
    if rows and "max_context" in rows[0]:
        ax.hlines(
            y,
            [r["min_context"] for r in rows],
            [r["max_context"] for r in rows],
            linewidth=7,
            color=figures.COLORS[3],
            alpha=0.35,
            label="context the scored tokens saw",
            zorder=1,
        )
    ax.plot(x, y, marker="o", markersize=5, color=blue, label="perplexity", zorder=2)
    lo, hi = zip(*(_interval(r) for r in rows), strict=True) if rows else ((), ())
    banded = figures.band(ax, x, lo, hi, blue, y, _interval_note(curve))
    figures.count_axis(ax, "x", True, base=2, at=x)
    _xlabel(fig, ax, "context length (tokens), log scale", legend)
    _perplexity_axis(ax, y + ([v for v in lo + hi if v is not None] if banded else []))
    _titles(fig, ax, "Perplexity against context length", label, curve["num_targets"], title)
    _legend(fig, ax, legend)
    return fig
