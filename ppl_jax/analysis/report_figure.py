"""The figure of `ppl-jax report`: a metric against the checkpoint step, as small multiples.

A panel per dataset (its stored 95% interval as a band), then a panel of the averages; at most
`MAX_DATASETS` dataset panels (`shown`: the first ones, in the table's order; the table and the
CSV hold every dataset), so that a store of hundreds of datasets draws in seconds and stays
legible. Drawing takes time linear in the panels: the panels show the same steps by holding
every step in their data limits, not through matplotlib's shared axes, whose every draw visits
each panel's siblings (quadratic: 100 panels took minutes on a busy machine).

Laid out for the size it is drawn at (`ppl_jax.outputs.figure_layout`), in the house style of
`ppl_jax.outputs.figures`.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

from ppl_jax.analysis.report_store import Column, by_cell, columns
from ppl_jax.outputs import figure_layout, figures

PANEL_COLUMNS, PANEL_WIDTH, PANEL_HEIGHT = 3, 3.6, 2.8  # small multiples: panels a row, inches
MAX_DATASETS = 24  # dataset panels at most (with the averages': 25, nine rows of three)
BAND = "95% interval (bootstrap)"
Series = list[tuple[int, float, "tuple[float, float] | None"]]  # (step, value, 95% interval)


def label(metric: str) -> str:
    """A metric's name for a figure: `bits per byte`, `NLL per token (nats)`, `perplexity`."""
    return "NLL per token (nats)" if metric == "nll_per_token" else metric.replace("_", " ")


def shown(records: Sequence[Mapping[str, Any]]) -> tuple[list[Column], int]:
    """`(the dataset columns the figure draws: the first MAX_DATASETS, the number of datasets)`."""
    datasets = [c for c in columns(records) if c[0] == "dataset"]
    return datasets[:MAX_DATASETS], len(datasets)


def cap_note(records: Sequence[Mapping[str, Any]]) -> str | None:
    """The sentence that says the figure leaves datasets out (`shown`), or None when it draws
    every one."""
    drawn, total = shown(records)
    if total <= len(drawn):
        return None
    return (
        f"The figure draws the first {len(drawn)} of the {total} datasets and their averages "
        f"(the table and the CSV hold every one); --figure none skips the figure."
    )


def grid(panels: int, size: tuple[float, float] | None) -> tuple[int, int]:
    """`(rows, columns)` of `panels` small multiples: at most `PANEL_COLUMNS` a row at the
    figure's own size, else `figure_layout.grid` for `size`."""
    return figure_layout.grid(panels, size, PANEL_COLUMNS)


def _figure(panels: int, size: tuple[float, float] | None = None) -> Any:
    """A bare matplotlib Figure for `panels` small multiples (`figures.new_figure`): `size`
    inches, or `PANEL_WIDTH` x `PANEL_HEIGHT` a panel."""
    rows, cols = grid(panels, size)
    width, height = size or (PANEL_WIDTH * cols, PANEL_HEIGHT * rows + 0.5)
    return figures.new_figure(width, height, "the report", "or pass --figure none")


def _interval(record: Mapping[str, Any], metric: str) -> tuple[float, float] | None:
    """The record's stored 95% interval of `metric` (`details.intervals`), or None."""
    intervals = (record.get("details") or {}).get("intervals") or {}
    pair = intervals.get(metric) if isinstance(intervals, Mapping) else None
    if (
        isinstance(pair, list)
        and len(pair) == 2
        and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in pair)
    ):
        return float(pair[0]), float(pair[1])
    return None


def _series(records: Sequence[Mapping[str, Any]], metric: str) -> dict[Column, Series]:
    """Each column's `(step, value, interval or None)` by step, in one pass over the records
    (one pass a column was quadratic too); a null step at 0, null values left out."""
    out: dict[Column, Series] = defaultdict(list)
    for (step, col), r in by_cell(records).items():
        value = r["metrics"].get(metric)
        if value is not None:
            out[col].append((0 if step is None else step, value, _interval(r, metric)))
    return {col: sorted(series) for col, series in out.items()}


def _step_axis(ax: Any, steps: list[int], label: bool) -> None:
    """Steps on a log axis when the positive ones span more than a factor of 10 (symmetric-log
    with a linear stretch below the first positive step when step 0 is drawn too); a tick at
    each step when they are few and linear; tick labels that never touch
    (`figures.count_axis`); every step within the panel's range, so that all panels show the
    same steps; tick labels only under the bottom panel of a column (`label`)."""
    positive = [s for s in steps if s > 0]
    log = figures.log_if_wide(positive)
    if log and len(positive) < len(steps):
        ax.set_xscale("symlog", linthresh=min(positive), linscale=0.5)
    at = steps if not log and len(steps) <= 12 else None
    figures.count_axis(ax, "x", log and len(positive) == len(steps), at=at)
    ax.update_datalim([(steps[0], 0.0), (steps[-1], 0.0)], updatey=False)
    ax.tick_params(labelbottom=label)


def _draw(ax: Any, series: Series, name: str, j: int, hollow: bool, band_label: str | None) -> Any:
    """One column's line (colour and marker `j`), its interval band (a bar for a lone point,
    labelled `band_label`); returns `(the values drawn, for the value axis's scale; the band's
    artist or None)`."""
    x = [s for s, _, _ in series]
    y = [v for _, v, _ in series]
    color, marker = figures.COLORS[j % 8], figures.MARKERS[j % 8]
    face, size = ("white", max(3.5, 7.0 - 0.7 * j)) if hollow else (color, 4.5)  # nested
    ax.plot(x, y, color=color, marker=marker, markersize=size, mfc=face, linewidth=1.5, label=name)
    lo = [iv[0] if iv else None for _, _, iv in series]
    hi = [iv[1] if iv else None for _, _, iv in series]
    drawn = figures.band(ax, x, lo, hi, color, y, band_label)
    return y + [v for v in lo + hi if v is not None], drawn


@figures.styled
def figure(
    records: Sequence[Mapping[str, Any]],
    metric: str,
    title: str | None,
    size: tuple[float, float] | None = None,
    legend: str = "auto",
    share_y: bool = False,
) -> Any:
    """The matplotlib Figure of `metric` against the step, as small multiples: a panel per
    dataset (the first `MAX_DATASETS`: `shown`), with its 95% interval as a band where the
    records store one (`details.intervals`, for perplexity and bits per byte), then one panel
    of the averages (micro, macro, macro per tag), each in its own Okabe-Ito colour and marker
    (hollow, so that equal values show both). The legend names the averages and, when one is
    drawn, the datasets' band (`BAND`); `legend` (`figure_layout.LEGENDS`) places it: "auto"
    in the grid's first free cell when it fits there, else "below" the panels; "right" of
    them; "none". `title` None draws no title (a paper's caption says it). Panels show the
    same steps (log when they span more than a factor of 10); each has its own value axis, or
    with `share_y` one range for all (tick labels on the first column only); log for a
    perplexity spanning more than a factor of 10. A null step (a checkpoint without one) is
    drawn at step 0; null values are not drawn.

    Laid out for `size` (`(width, height)` inches; default `PANEL_WIDTH` x `PANEL_HEIGHT` a
    panel, `PANEL_COLUMNS` a row): the grid (`grid`), fonts, titles broken to fit their panel,
    x ticks thinned so that their labels never touch (`ppl_jax.outputs.figure_layout`).

    Raises:
      ConfigError: matplotlib is not installed.
    """
    from matplotlib import rcParams

    averages = [c for c in columns(records) if c[0] == "average"]
    panels = [[c] for c in shown(records)[0]] + ([averages] if averages else [])
    fig = _figure(len(panels), size)
    nrows, ncols = grid(len(panels), size)
    axes = fig.subplots(nrows, ncols, squeeze=False).ravel()
    steps = sorted({0 if r["step"] is None else r["step"] for r in records})
    series = _series(records, metric)
    panel_width = fig.get_figwidth() / ncols - 0.45  # less the value axis's labels
    title_size = rcParams["axes.titlesize"]
    band_artist, values = None, []
    for i, (ax, group) in enumerate(zip(axes, panels, strict=False)):
        drawn = [(col, series.get(col, [])) for col in group]
        band_artist, panel_values = _panel(ax, drawn, group is averages, band_artist)
        values.append(panel_values)
        ax.set_title(figure_layout.fit_text(ax.get_title(), panel_width, title_size, max_lines=2))
        if i % ncols == 0 and nrows == 1:
            ax.set_ylabel(label(metric))
        _step_axis(ax, steps, label=i + ncols >= len(panels))
    _value_axes(axes[: len(panels)], values, metric, ncols if share_y else 0)
    for ax in axes[len(panels) :]:
        ax.axis("off")
    handles, labels = axes[len(panels) - 1].get_legend_handles_labels() if averages else ([], [])
    if band_artist is not None and BAND not in labels:  # drawn in a dataset's panel
        handles, labels = [*handles, band_artist], [*labels, BAND]
    if nrows > 1:  # one name for the value axes of every row
        fig.supylabel(label(metric), fontsize=rcParams["axes.labelsize"])
    _step_name(axes, len(panels), ncols, figures.log_if_wide([s for s in steps if s > 0]))
    free = axes[len(panels)] if len(panels) < len(axes) else None
    if handles:
        figure_layout.place_legend(fig, handles, labels, cell=free, where=legend)
    if title is not None:
        width, size = fig.get_figwidth() - 0.2, rcParams["figure.titlesize"]
        fig.suptitle(figure_layout.fit_text(title, width, size))
    return fig


def _step_name(axes: Sequence[Any], panels: int, ncols: int, log: bool) -> None:
    """The step axis's name, once: under the first column's bottom panel (a name under each
    column ran into the next one's, or into a legend at the right)."""
    first = max(i for i in range(0, panels, ncols))
    axes[first].set_xlabel("checkpoint step" + (" (log scale)" if log else ""))


def _value_axes(axes: Sequence[Any], values: list[list[float]], metric: str, shared: int) -> None:
    """Each panel's value axis: log for a perplexity spanning more than a factor of 10. With
    `shared` (the grid's columns; 0: not shared), one range for every panel (each holds all
    the values in its data limits: no matplotlib shared axes, whose draws visit every
    sibling) and tick labels on the first column only."""
    every = [v for panel in values for v in panel]
    for i, (ax, own) in enumerate(zip(axes, values, strict=True)):
        if "perplexity" in metric and figures.log_if_wide(every if shared else own):
            ax.set_yscale("log")
        if shared and every:
            ax.update_datalim([(0.0, min(every)), (0.0, max(every))], updatex=False)
            ax.tick_params(labelleft=i % shared == 0)


def _panel(ax: Any, group: list[tuple[Column, Series]], is_averages, band_artist) -> Any:
    """One panel of `figure`: each column's series, its title (the dataset, or "averages"),
    "no value" when nothing was drawn; returns `(the band's artist once one is drawn
    (`band_artist` until then: the legend's band), the values drawn)`."""
    drawn: list[float] = []
    for j, (col, series) in enumerate(group):
        if series:
            values, band = _draw(ax, series, col[1], j, is_averages, None if band_artist else BAND)
            drawn += values
            band_artist = band_artist or band
    ax.set_title("averages" if is_averages else group[0][0][1])
    ax.grid(True, **figures.GRID)
    if not drawn:
        ax.text(0.5, 0.5, "no value", transform=ax.transAxes, ha="center", color="gray")
    return band_artist, drawn
