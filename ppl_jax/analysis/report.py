"""`python -m ppl_jax.report RESULTS_DIR`: a run's results store as a table, a CSV and a plot.

    python -m ppl_jax.report results/sweep                       # bits per byte by step
    python -m ppl_jax.report results/sweep --metric perplexity --png ppl.png

Reads `RESULTS_DIR/results.jsonl` (`ppl_jax.outputs.store`: one record per checkpoint step and dataset,
plus the micro and macro averages of each step) and

- prints a table of one metric (default bits per byte): a row per step, a column per dataset,
  then the averages (micro, macro, macro/<key>=<value>); `null` where the metric is undefined
  (no bytes, overflow), `-` where that dataset was not evaluated at that step;
- writes a CSV of every metric in long form, `step,dataset,kind,metric,value` (default
  `RESULTS_DIR/report.csv`; a null step or value is an empty cell; values as Python's shortest
  repr of the stored float64, so they read back exactly);
- writes a PNG of the metric against the step (default `RESULTS_DIR/report.png`): a line per
  dataset, the averages dashed; a null step (a checkpoint without one) is drawn at step 0, as
  in TensorBoard; a log y axis for a perplexity spanning more than a factor of 10.

Files are written atomically (temporary file, fsync, rename). The plot needs matplotlib (`pip
install 'ppl_jax[diagnostics]'`), drawn on a bare Figure by Agg. A user's mistake prints one line,
`ppl-jax report: error: ...`, and exits with status 2.
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
from ppl_jax.outputs import files
from ppl_jax.outputs.folder import OutputDir
from ppl_jax.outputs.store import FILENAME, ResultsStore

PROG = "ppl-jax report"
DEFAULT_METRIC = "bits_per_byte"
CSV_NAME, PNG_NAME = files.REPORT_CSV, files.REPORT_PNG
HEADER = ("step", "dataset", "kind", "metric", "value")

Column = tuple[str, str]  # (kind, dataset)


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
    return store.path, records


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


def _figure() -> Any:
    """A bare matplotlib Figure (Agg renders it on save; pyplot and displays are never used)."""
    try:
        from matplotlib.figure import Figure
    except ImportError:
        raise ConfigError(
            "Plotting the report needs matplotlib, which is not installed; run pip install "
            "'ppl_jax[diagnostics]' (or pass --png none)."
        ) from None
    return Figure(figsize=(8.0, 5.0), dpi=100, layout="constrained")


def plot(records: Sequence[Mapping[str, Any]], metric: str, title: str) -> bytes:
    """PNG of `metric` against the step: a line per dataset, the averages dashed; a null step
    at 0; null values not drawn.

    Raises:
      ConfigError: matplotlib is not installed.
    """
    fig = _figure()
    ax = fig.add_subplot()
    cells = _by_cell(records)
    drawn: list[float] = []
    for kind, name in columns(records):
        points = sorted(
            (0 if step is None else step, r["metrics"].get(metric))
            for (step, col), r in cells.items()
            if col == (kind, name) and r["metrics"].get(metric) is not None
        )
        if not points:
            continue
        x, y = zip(*points, strict=True)
        drawn += y
        style = {"linestyle": "--", "linewidth": 1.5} if kind == "average" else {"linewidth": 1}
        label = name if kind == "dataset" else f"{name} (average)"
        ax.plot(x, y, marker="o", markersize=3, label=label, **style)
    if "perplexity" in metric and drawn and min(drawn) > 0 and max(drawn) > 10 * min(drawn):
        ax.set_yscale("log")
    ax.set_xlabel("checkpoint step")
    ax.set_ylabel(metric)
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    if drawn:
        ax.legend(fontsize="small")
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()


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
    path: str, metric: str = DEFAULT_METRIC, csv_path: str | None = None, png: str | None = None
) -> tuple[str, str, str | None]:
    """Reads the results store at `path` and writes its CSV and PNG (see the module docstring).

    Args:
      path: a results folder (`output.dir`) or its results.jsonl.
      metric: the metric of the table and the plot.
      csv_path: the CSV (default `report.csv` beside results.jsonl).
      png: the PNG (default `report.png` beside it); "none" for no plot.

    Returns:
      `(the table, the CSV's path, the PNG's path or None)`.

    Raises:
      DataError: the store is missing, empty or malformed.
      ConfigError: an unknown metric, matplotlib missing, or an output that cannot be written.
    """
    store_path, records = load(path)
    known = metric_names(records)
    if metric not in known:
        raise ConfigError(f"--metric={metric} is not in {store_path}; choose one of {known}.")
    folder = os.path.dirname(os.path.abspath(store_path))
    want_png = png is None or png.lower() != "none"
    if want_png:
        _figure()  # matplotlib missing: stop before writing anything
    text = table(records, metric)
    csv_out = _write(csv_path or os.path.join(folder, CSV_NAME), csv_bytes(records), "--csv")
    png_out = None
    if want_png:
        image = plot(records, metric, f"{metric}: {os.path.basename(folder) or folder}")
        png_out = _write(png or os.path.join(folder, PNG_NAME), image, "--png")
    return text, csv_out, png_out


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line, as for every other mistake
        self.exit(2, f"{PROG}: error: {message} (see --help)\n")


def main(argv: list[str] | None = None) -> int:
    parser = _Parser(
        prog="ppl-jax report",
        description="A run's results store (results.jsonl: every checkpoint step and dataset, "
        "and their averages) as a table of one metric, a CSV of all metrics and a plot.",
    )
    parser.add_argument(
        "results", metavar="RESULTS_DIR", help="the run's output.dir (or its results.jsonl)"
    )
    parser.add_argument(
        "--metric",
        default=DEFAULT_METRIC,
        help="the metric of the table and the plot (default %(default)s)",
    )
    parser.add_argument(
        "--csv", metavar="PATH", help=f"every metric in long form (default RESULTS_DIR/{CSV_NAME})"
    )
    parser.add_argument(
        "--png",
        metavar="PATH",
        help=f"the metric against the step (default RESULTS_DIR/{PNG_NAME}; 'none': no plot)",
    )
    args = parser.parse_args(argv)
    try:
        text, csv_out, png_out = report(args.results, args.metric, args.csv, args.png)
    except PplJaxError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2
    print(text)
    print(f"report: {csv_out}" + (f", {png_out}" if png_out else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
