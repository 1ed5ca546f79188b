"""`ppl-jax report RESULTS_DIR`: a run's results store as a table, a CSV and a figure.

    ppl-jax report results/sweep                          # bits per byte by step
    ppl-jax report results/sweep --metric perplexity --figure ppl.pdf --size 7x3

Reads `RESULTS_DIR/results.jsonl` (`ppl_jax.outputs.store`: one record per checkpoint step and dataset,
plus the micro and macro averages of each step) and

- prints a table of one metric (default bits per byte): a row per step, a column per dataset,
  then the averages (micro, macro, macro/<key>=<value>); `null` where the metric is undefined
  (no bytes, overflow), `-` where that dataset was not evaluated at that step;
- writes a CSV of every metric in long form, `step,dataset,kind,metric,value` (default
  `RESULTS_DIR/report.csv`; a null step or value is an empty cell; values as Python's shortest
  repr of the stored float64, so they read back exactly);
- writes a figure of the metric against the step (default `RESULTS_DIR/report.png`; `figure`):
  small multiples, a panel per dataset with its stored 95% interval as a band and a panel of
  the averages, a null step (a checkpoint without one) drawn at step 0, as in TensorBoard. The
  file's extension picks the format (`--figure report.pdf` or `.svg`: vector; `.png`: raster at
  `--dpi`); `--size WIDTHxHEIGHT` in inches overrides the size (`ppl_jax.outputs.figures`).

Files are written atomically (temporary file, fsync, rename). The figure needs matplotlib (`pip
install 'ppl_jax[diagnostics]'`). A user's mistake (a record without `metrics` included: named
by its file and line) prints one line, `ppl-jax report: error: ...`, and exits with status 2.
"""

from __future__ import annotations

import argparse
import csv
import io
import os
import sys
from collections.abc import Mapping, Sequence
from typing import Any, NoReturn

from ppl_jax.errors import ConfigError, DataError, PplJaxError
from ppl_jax.outputs import figure_layout, figures, files
from ppl_jax.outputs.folder import OutputDir
from ppl_jax.outputs.store import FILENAME, ResultsStore

PROG = "ppl-jax report"
DEFAULT_METRIC = "bits_per_byte"
CSV_NAME, PNG_NAME = files.REPORT_CSV, files.REPORT_PNG
HEADER = ("step", "dataset", "kind", "metric", "value")

Column = tuple[str, str]  # (kind, dataset)
PANEL_COLUMNS, PANEL_WIDTH, PANEL_HEIGHT = 3, 3.6, 2.8  # small multiples: panels a row, inches


def load(path: str) -> tuple[str, list[dict[str, Any]]]:
    """The results store at `path` (a results folder or its results.jsonl) and its records.

    Raises:
      DataError: the folder or file does not exist, is malformed, or holds no record.
    """
    if not os.path.exists(path):
        raise DataError(f"{path} does not exist; give a run's output.dir or its {FILENAME}.")
    store = ResultsStore.in_dir(path) if os.path.isdir(path) else ResultsStore(path)
    if not os.path.exists(store.path):
        raise DataError(
            f"{store.path} does not exist; a run writes it into its output.dir, one record per "
            f"checkpoint step and dataset."
        )
    records = store.records()
    if not records:
        raise DataError(f"{store.path} holds no record; nothing to report.")
    bad = [i for i, r in enumerate(records) if not _has_metrics(r)]
    if bad:
        raise DataError(
            f"{store.path} line {_line_of(store.path, bad[0])} has no metrics (an object of "
            f"numbers or nulls); remove that line, or score that step and dataset again."
        )
    return store.path, records


def _has_metrics(record: Mapping[str, Any]) -> bool:
    metrics = record.get("metrics")
    return isinstance(metrics, dict) and all(
        v is None or (isinstance(v, (int, float)) and not isinstance(v, bool))
        for v in metrics.values()
    )


def _line_of(path: str, index: int) -> int:
    """The file line of the store's record `index` (the store skips blank lines)."""
    with open(path, encoding="utf-8") as f:
        filled = [n for n, line in enumerate(f, start=1) if line.strip()]
    return filled[index]


def _step_order(step: int | None) -> tuple[int, int]:
    return (0, 0) if step is None else (1, step)


def columns(records: Sequence[Mapping[str, Any]]) -> list[Column]:
    """The datasets in order of first appearance, then micro, macro and the tag averages."""
    datasets = list(dict.fromkeys(r["dataset"] for r in records if r["kind"] == "dataset"))
    averages = {r["dataset"] for r in records if r["kind"] == "average"}
    first = [a for a in ("micro", "macro") if a in averages]
    rest = sorted(averages - set(first))
    return [("dataset", d) for d in datasets] + [("average", a) for a in first + rest]


def metric_names(records: Sequence[Mapping[str, Any]]) -> list[str]:
    """Every metric any record holds, in order of first appearance."""
    return list(dict.fromkeys(m for r in records for m in r["metrics"]))


def _by_cell(records: Sequence[Mapping[str, Any]]) -> dict[tuple[int | None, Column], Mapping]:
    # The store keeps one record per (kind, step, dataset); if a file holds more, the last wins.
    return {(r["step"], (r["kind"], r["dataset"])): r for r in records}


def _format(value: float | None) -> str:
    if value is None:
        return "null"
    return f"{value:.4f}" if abs(value) < 1e6 else f"{value:.4e}"


def table(records: Sequence[Mapping[str, Any]], metric: str) -> str:
    """The metric as text: a row per step (a null step first, as `none`), a column per dataset,
    then `|` and the averages; 4 decimals, `null` for a null value, `-` for no record."""
    cols = columns(records)
    cells = _by_cell(records)
    steps = sorted({r["step"] for r in records}, key=_step_order)
    header = ["step"] + [name for _, name in cols]
    rows = []
    for step in steps:
        row = ["none" if step is None else str(step)]
        for col in cols:
            record = cells.get((step, col))
            row.append("-" if record is None else _format(record["metrics"].get(metric)))
        rows.append(row)
    split = 1 + sum(kind == "dataset" for kind, _ in cols)
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]

    def line(cells: list[str]) -> str:
        parts = [c.rjust(w) for c, w in zip(cells, widths, strict=True)]
        if split < len(parts):
            parts.insert(split, "|")
        return "  ".join(parts)

    title = f"{metric} by checkpoint step (rows) and dataset (columns; averages after |)"
    return "\n".join([title, line(header), *(line(r) for r in rows)])


def long_rows(records: Sequence[Mapping[str, Any]]) -> list[tuple[Any, ...]]:
    """`(step, dataset, kind, metric, value)` for every metric of every record, ordered by step
    and then as the table's columns; value None for a null metric."""
    order = {col: i for i, col in enumerate(columns(records))}
    ordered = sorted(
        _by_cell(records).values(),
        key=lambda r: (_step_order(r["step"]), order[(r["kind"], r["dataset"])]),
    )
    return [
        (r["step"], r["dataset"], r["kind"], metric, value)
        for r in ordered
        for metric, value in r["metrics"].items()
    ]


def csv_bytes(records: Sequence[Mapping[str, Any]]) -> bytes:
    """The long-form CSV (`HEADER`, then `long_rows`); None is an empty cell."""
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(HEADER)
    for row in long_rows(records):
        writer.writerow(["" if v is None else repr(v) if isinstance(v, float) else v for v in row])
    return buf.getvalue().encode("utf-8")


def label(metric: str) -> str:
    """A metric's name for a figure: `bits per byte`, `NLL per token (nats)`, `perplexity`."""
    return "NLL per token (nats)" if metric == "nll_per_token" else metric.replace("_", " ")


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


def _series(
    records: Sequence[Mapping[str, Any]], col: Column, metric: str
) -> list[tuple[int, float, tuple[float, float] | None]]:
    """`(step, value, interval or None)` of one column by step; a null step at 0, null values
    left out."""
    return sorted(
        (0 if step is None else step, r["metrics"][metric], _interval(r, metric))
        for (step, c), r in _by_cell(records).items()
        if c == col and r["metrics"].get(metric) is not None
    )


def _step_axis(ax: Any, steps: list[int], label: bool) -> None:
    """Steps on a log axis when the positive ones span more than a factor of 10 (symmetric-log
    with a linear stretch below the first positive step when step 0 is drawn too); a tick at
    each step when they are few and linear; tick labels that never touch
    (`figures.count_axis`); tick labels and the axis's name only under the bottom panel of a
    column (`label`)."""
    positive = [s for s in steps if s > 0]
    log = figures.log_if_wide(positive)
    if log and len(positive) < len(steps):
        ax.set_xscale("symlog", linthresh=min(positive), linscale=0.5)
    at = steps if not log and len(steps) <= 12 else None
    figures.count_axis(ax, "x", log and len(positive) == len(steps), at=at)
    ax.tick_params(labelbottom=label)
    if label:
        ax.set_xlabel("checkpoint step" + (" (log scale)" if log else ""))


def _draw(ax: Any, series: list, name: str, j: int, hollow: bool, band_label: str | None) -> Any:
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


BAND = "95% interval (bootstrap)"


@figures.styled
def figure(
    records: Sequence[Mapping[str, Any]],
    metric: str,
    title: str,
    size: tuple[float, float] | None = None,
) -> Any:
    """The matplotlib Figure of `metric` against the step, as small multiples: a panel per
    dataset, with its 95% interval as a band where the records store one (`details.intervals`,
    for perplexity and bits per byte), then one panel of the averages (micro, macro, macro per
    tag), each in its own Okabe-Ito colour and marker (hollow, so that equal values show both).
    The legend names the averages and, when one is drawn, the datasets' band (`BAND`); it sits
    in the grid's first free cell when it fits there, else below the panels. Panels share the
    step axis (log when the steps span more than a factor of 10); each has its own value axis
    (log for a perplexity spanning more than a factor of 10). A null step (a checkpoint
    without one) is drawn at step 0; null values are not drawn.

    Laid out for `size` (`(width, height)` inches; default `PANEL_WIDTH` x `PANEL_HEIGHT` a
    panel, `PANEL_COLUMNS` a row): the grid (`grid`), fonts, titles broken to fit their panel,
    x ticks thinned so that their labels never touch (`ppl_jax.outputs.figure_layout`).

    Raises:
      ConfigError: matplotlib is not installed.
    """
    from matplotlib import rcParams

    cols = columns(records)
    averages = [c for c in cols if c[0] == "average"]
    panels = [[c] for c in cols if c[0] == "dataset"] + ([averages] if averages else [])
    fig = _figure(len(panels), size)
    nrows, ncols = grid(len(panels), size)
    axes = fig.subplots(nrows, ncols, sharex=True, squeeze=False).ravel()
    steps = sorted({0 if r["step"] is None else r["step"] for r in records})
    panel_width = fig.get_figwidth() / ncols - 0.45  # less the value axis's labels
    title_size = rcParams["axes.titlesize"]
    band_artist = None
    for i, (ax, group) in enumerate(zip(axes, panels, strict=False)):
        fitted = (panel_width, title_size)
        band_artist = _panel(ax, group, group is averages, records, metric, band_artist, fitted)
        if i % ncols == 0 and nrows == 1:
            ax.set_ylabel(label(metric))
        _step_axis(ax, steps, label=i + ncols >= len(panels))
    for ax in axes[len(panels) :]:
        ax.axis("off")
    handles, labels = axes[len(panels) - 1].get_legend_handles_labels() if averages else ([], [])
    if band_artist is not None and BAND not in labels:  # drawn in a dataset's panel
        handles, labels = [*handles, band_artist], [*labels, BAND]
    if nrows > 1:  # one name for the value axes of every row
        fig.supylabel(label(metric), fontsize=rcParams["axes.labelsize"])
    if handles:
        free = axes[len(panels)] if len(panels) < len(axes) else None
        figure_layout.place_legend(fig, handles, labels, cell=free)
    fig.suptitle(
        figure_layout.fit_text(title, fig.get_figwidth() - 0.2, rcParams["figure.titlesize"])
    )
    return fig


def _panel(ax, group: list[Column], is_averages, records, metric: str, band_artist, fitted) -> Any:
    """One panel of `figure`: each column's series, its title fitted (`fitted`: width in inches,
    font size), a log axis for a wide perplexity, "no value" when nothing was drawn; returns the
    band's artist once one is drawn (`band_artist` until then: the legend's band)."""
    drawn: list[float] = []
    for j, col in enumerate(group):
        series = _series(records, col, metric)
        if series:
            values, band = _draw(ax, series, col[1], j, is_averages, None if band_artist else BAND)
            drawn += values
            band_artist = band_artist or band
    name = "averages" if is_averages else group[0][1]
    ax.set_title(figure_layout.fit_text(name, *fitted, max_lines=2))
    if "perplexity" in metric and figures.log_if_wide(drawn):
        ax.set_yscale("log")
    ax.grid(True, **figures.GRID)
    if not drawn:
        ax.text(0.5, 0.5, "no value", transform=ax.transAxes, ha="center", color="gray")
    return band_artist


def _write(path: str, data: bytes, flag: str) -> str:
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise ConfigError(f"{flag}={path}: the folder {folder} does not exist; create it first.")
    try:
        return OutputDir(folder, None).write_bytes(os.path.basename(path), data)
    except OSError as e:
        raise ConfigError(
            f"{flag}={path} cannot be written ({e.strerror}); choose another path."
        ) from None


def report(
    path: str,
    metric: str = DEFAULT_METRIC,
    csv_path: str | None = None,
    figure_path: str | None = None,
    size: tuple[float, float] | None = None,
    dpi: int | None = None,
) -> tuple[str, str, str | None]:
    """Reads the results store at `path` and writes its CSV and figure (see the module
    docstring).

    Args:
      path: a results folder (`output.dir`) or its results.jsonl.
      metric: the metric of the table and the figure.
      csv_path: the CSV (default `report.csv` beside results.jsonl).
      figure_path: the figure (default `report.png` beside it), its format by its extension
        (`.png`, `.pdf`, `.svg`); "none" for no figure.
      size: `(width, height)` in inches, or None for the figure's own (3.6 x 2.8 per panel).
      dpi: a PNG's pixels per inch (default `figures.DEFAULT_DPI`).

    Returns:
      `(the table, the CSV's path, the figure's path or None)`.

    Raises:
      DataError: the store is missing, empty or malformed.
      ConfigError: an unknown metric or figure extension, matplotlib missing, or an output that
        cannot be written (checked before anything is written).
    """
    store_path, records = load(path)
    known = metric_names(records)
    if metric not in known:
        raise ConfigError(f"--metric={metric} is not in {store_path}; choose one of {known}.")
    folder = os.path.dirname(os.path.abspath(store_path))
    want_figure = figure_path is None or figure_path.lower() != "none"
    if want_figure:  # stop before writing anything
        figure_path = figure_path or os.path.join(folder, PNG_NAME)
        figures.format_of(figure_path, "--figure")
        figures.check_available("the report", "or pass --figure none")
    text = table(records, metric)
    csv_out = _write(csv_path or os.path.join(folder, CSV_NAME), csv_bytes(records), "--csv")
    figure_out = None
    if want_figure:
        name = os.path.basename(folder) or folder
        fig = figure(records, metric, f"{label(metric)} by checkpoint step: {name}", size=size)
        figure_out = figures.save_figure(fig, figure_path, dpi, size, "--figure")
    return text, csv_out, figure_out


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line, as for every other mistake
        self.exit(2, f"{PROG}: error: {message} (see --help)\n")


def main(argv: list[str] | None = None) -> int:
    parser = _Parser(
        prog="ppl-jax report",
        description="A run's results store (results.jsonl: every checkpoint step and dataset, "
        "and their averages) as a table of one metric, a CSV of all metrics and a figure.",
    )
    parser.add_argument(
        "results", metavar="RESULTS_DIR", help="the run's output.dir (or its results.jsonl)"
    )
    parser.add_argument(
        "--metric",
        default=DEFAULT_METRIC,
        help="the metric of the table and the figure (default %(default)s)",
    )
    parser.add_argument(
        "--csv", metavar="PATH", help=f"every metric in long form (default RESULTS_DIR/{CSV_NAME})"
    )
    parser.add_argument(
        "--figure",
        "--png",
        dest="figure",
        metavar="PATH",
        help=f"the metric against the step (default RESULTS_DIR/{PNG_NAME}): .pdf or .svg "
        f"(vector) or .png, by the extension; 'none': no figure (--png: the same flag)",
    )
    parser.add_argument(
        "--size", metavar="WxH", help="the figure's width and height in inches, e.g. 7x3"
    )
    parser.add_argument(
        "--dpi",
        metavar="N",
        default=str(figures.DEFAULT_DPI),
        help="a PNG figure's pixels per inch (default %(default)s)",
    )
    args = parser.parse_args(argv)
    try:
        size = figures.parse_size(args.size, "--size")
        dpi = figures.parse_dpi(args.dpi, "--dpi")
        text, csv_out, figure_out = report(
            args.results, args.metric, args.csv, args.figure, size, dpi
        )
    except PplJaxError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2
    print(text)
    print(f"report: {csv_out}" + (f", {figure_out}" if figure_out else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
