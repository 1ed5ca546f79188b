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
  the averages (the first `report_figure.MAX_DATASETS` datasets: the table's last line says
  so when there are more), a null step (a checkpoint without one) drawn at step 0, as in
  TensorBoard (`ppl_jax.analysis.report_figure`). The
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

from ppl_jax.analysis.report_figure import BAND, cap_note, figure, label  # noqa: F401 (BAND)
from ppl_jax.analysis.report_store import by_cell, columns, load, metric_names, step_order
from ppl_jax.errors import ConfigError, PplJaxError
from ppl_jax.outputs import figure_layout, figures, files
from ppl_jax.outputs.folder import OutputDir

PROG = "ppl-jax report"
DEFAULT_METRIC = "bits_per_byte"
CSV_NAME, PNG_NAME = files.REPORT_CSV, files.REPORT_PNG
HEADER = ("step", "dataset", "kind", "metric", "value")


def _format(value: float | None) -> str:
    if value is None:
        return "null"
    return f"{value:.4f}" if abs(value) < 1e6 else f"{value:.4e}"


def table(records: Sequence[Mapping[str, Any]], metric: str) -> str:
    """The metric as text: a row per step (a null step first, as `none`), a column per dataset,
    then `|` and the averages; 4 decimals, `null` for a null value, `-` for no record."""
    cols = columns(records)
    cells = by_cell(records)
    steps = sorted({r["step"] for r in records}, key=step_order)
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
        by_cell(records).values(),
        key=lambda r: (step_order(r["step"]), order[(r["kind"], r["dataset"])]),
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
    title: str | None = None,
    legend: str = "auto",
    share_y: bool = False,
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
      title: the figure's title (default: the metric by checkpoint step and the folder's
        name); "none" for no title.
      legend, share_y: where the legend goes and whether the panels share one value range
        (`report_figure.figure`).

    Returns:
      `(the table, the CSV's path, the figure's path or None)`; the table ends with a sentence
      when the figure leaves datasets out (`report_figure.cap_note`).

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
        title = f"{label(metric)} by checkpoint step: {name}" if title is None else title
        heading = None if title.lower() == "none" else title
        fig = figure(records, metric, heading, size=size, legend=legend, share_y=share_y)
        figure_out = figures.save_figure(fig, figure_path, dpi, size, "--figure")
        note = cap_note(records)
        text += f"\n{note}" if note else ""
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
    parser.add_argument(
        "--title", help="the figure's title (default: the metric and the folder); 'none': no title"
    )
    parser.add_argument(
        "--legend",
        default="auto",
        choices=figure_layout.LEGENDS,
        help="where the figure's legend goes (default %(default)s: a free cell, else below)",
    )
    parser.add_argument(
        "--share-y",
        action="store_true",
        help="one value range for every panel (tick labels on the first column)",
    )
    args = parser.parse_args(argv)
    try:
        size = figures.parse_size(args.size, "--size")
        dpi = figures.parse_dpi(args.dpi, "--dpi")
        text, csv_out, figure_out = report(
            args.results,
            args.metric,
            args.csv,
            args.figure,
            size,
            dpi,
            args.title,
            args.legend,
            args.share_y,
        )
    except PplJaxError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2
    print(text)
    print(f"report: {csv_out}" + (f", {figure_out}" if figure_out else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
