"""Layout of a figure at the size it is printed: text that fits, ticks that thin out, legends
outside the data.

A paper prints a figure at one column (about 3.5 inches wide) or two (about 7 inches). What
fits at 7 inches overlaps at 3.5, so every figure of `ppl_jax.outputs.figures` is laid out for
its size with these helpers:

- `style_for(size)`: the house style's font sizes scaled to the figure's width (9 pt text at 6
  inches and wider, 8 pt at 3.5 inches and narrower, linear between);
- `fit_text(text, width, fontsize)`: a title or label broken into lines (at spaces, then after
  `-`, `_`, `/`, `=`) so that each line fits `width` inches;
- `thinned_locator(base)`: the x ticks of another locator, thinned at draw time so that no two tick
  labels touch, whatever size the figure is drawn at;
- `grid`: the rows and columns of small multiples that give each panel the most room;
- `place_legend`: a legend in a free cell of a grid of panels when it fits there, else outside
  the axes, below them, in as many columns as the figure's width holds (never over the data);
  or right of them, or none (`LEGENDS`: a paper's figure keeps its height for the data).

Widths of text are measured with matplotlib's own font metrics (`matplotlib.textpath`), the same
for every output format, so the layout does not depend on the backend. matplotlib is imported
only inside these functions (it is optional).
"""

from __future__ import annotations

import functools
import itertools
import re
from collections.abc import Mapping, Sequence
from typing import Any

NARROW, WIDE = 3.5, 6.0  # inches: a column's width, and the width from which the full sizes hold
# The sizes (points) at NARROW and narrower; at WIDE and wider, the house style's own.
NARROW_SIZES = {
    "font.size": 8.0,
    "axes.titlesize": 8.0,
    "axes.labelsize": 8.0,
    "figure.titlesize": 9.0,
    "xtick.labelsize": 7.0,
    "ytick.labelsize": 7.0,
    "legend.fontsize": 7.0,
}
TICK_GAP = 4.0  # points between two x tick labels, at the least
_BREAK = re.compile(r"(?<=[\s\-_/=,])")  # where a line may break: after these


def style_for(style: Mapping[str, Any], size: tuple[float, float] | None) -> dict[str, Any]:
    """`style` (an rcParams dict) with its font sizes for a figure `size` inches wide: the
    style's own at `WIDE` inches and wider (or `size` None: a figure's own size), `NARROW_SIZES`
    at `NARROW` and narrower, linear between, rounded to a quarter point."""
    out = dict(style)
    if size is None or size[0] >= WIDE:
        return out
    k = max(0.0, (size[0] - NARROW) / (WIDE - NARROW))
    for key, small in NARROW_SIZES.items():
        out[key] = round(4 * (small + k * (float(style[key]) - small))) / 4
    return out


@functools.lru_cache(maxsize=4096)
def text_width(text: str, fontsize: float) -> float:
    """The width in points of one line of `text` at `fontsize` points (matplotlib's default
    font, its own metrics)."""
    from matplotlib.font_manager import FontProperties
    from matplotlib.textpath import text_to_path

    if not text:
        return 0.0
    width, _, _ = text_to_path.get_text_width_height_descent(
        text, FontProperties(size=fontsize), ismath=False
    )
    return float(width)


def fit_text(text: str, width: float, fontsize: float, max_lines: int = 3) -> str:
    """`text` broken into lines of at most `width` inches at `fontsize` points: at spaces, else
    after `-`, `_`, `/`, `=` or `,`; a word wider than a line is cut with `…` (so is a last line
    when more than `max_lines` would be needed)."""
    limit = width * 72.0
    lines: list[str] = []
    for word in (w for w in _BREAK.split(text) if w):
        if lines and text_width(lines[-1] + word.rstrip(), fontsize) <= limit:
            lines[-1] += word
        else:
            lines.append(word.lstrip() if lines else word)
    lines = [_cut(line.rstrip(), limit, fontsize) for line in lines]
    if len(lines) > max_lines:
        lines = lines[: max_lines - 1] + [_cut(lines[max_lines - 1] + " …", limit, fontsize)]
    return "\n".join(lines)


def _cut(line: str, limit: float, fontsize: float) -> str:
    if text_width(line, fontsize) <= limit:
        return line
    while len(line) > 1 and text_width(line + "…", fontsize) > limit:
        line = line[:-1]
    return line + "…"


def thinned_locator(base: Any) -> Any:
    """The x ticks of the matplotlib locator `base` in view, thinned left to right when the
    figure is drawn (so it holds at any size): a tick is kept when its label (from the axis's
    formatter, at its font size) keeps `TICK_GAP` points from the last kept one's."""
    cls = _thinned_class()
    return base if isinstance(base, cls) else cls(base)


@functools.cache
def _thinned_class() -> type:
    from matplotlib.ticker import Locator

    class ThinnedLocator(Locator):
        def __init__(self, base: Any) -> None:
            self.base = base

        def set_axis(self, axis: Any) -> None:
            super().set_axis(axis)
            self.base.set_axis(axis)

        def __call__(self) -> Sequence[float]:
            return self.thin(self.base())

        def tick_values(self, vmin: float, vmax: float) -> Sequence[float]:
            return self.base.tick_values(vmin, vmax)

        def thin(self, locs: Sequence[float]) -> list[float]:
            axis = self.axis
            lo, hi = sorted(axis.get_view_interval())
            shown = sorted(float(x) for x in locs if lo <= x <= hi)
            if len(shown) < 2:
                return shown
            ticks = axis.get_major_ticks(1)
            size = ticks[0].label1.get_fontsize() if ticks else 8.0
            labels = axis.get_major_formatter().format_ticks(shown)
            to_points = 72.0 / axis.axes.figure.dpi
            x = axis.axes.transData.transform([(v, 0.0) for v in shown])[:, 0] * to_points
            kept = [0]
            for i in range(1, len(shown)):
                j = kept[-1]
                need = (text_width(labels[i], size) + text_width(labels[j], size)) / 2
                if abs(x[i] - x[j]) >= need + TICK_GAP:
                    kept.append(i)
            return [shown[i] for i in kept]

    return ThinnedLocator


def grid(panels: int, size: tuple[float, float] | None, columns: int) -> tuple[int, int]:
    """`(rows, columns)` of `panels` small multiples: `columns` a row at most at the figure's own
    size (`size` None); at a given `size` (inches), the columns that give each panel the most
    room (its width / 1.3 or its height, whichever is the smaller; fewer columns on a tie)."""
    if size is None:
        cols = min(columns, panels)
        return -(-panels // cols), cols

    def room(cols: int) -> float:
        rows = -(-panels // cols)
        return min(size[0] / cols / 1.3, (size[1] - 0.4) / rows)

    cols = max(range(1, panels + 1), key=lambda c: (room(c), -c))
    return -(-panels // cols), cols


LEGENDS = ("auto", "below", "right", "none")  # where a figure's legend goes (`place_legend`)
RIGHT_SHARE = 0.4  # of the figure's width, at most, for a legend right of the axes


def place_legend(
    fig: Any,
    handles: Sequence[Any],
    labels: Sequence[str],
    cell: Any = None,
    fontsize: float | None = None,
    where: str = "auto",
) -> Any:
    """Draws the legend of `handles` and `labels` where it covers nothing (`where`, one of
    `LEGENDS`): "auto", in the empty axes `cell` (a free cell of a grid of panels, its frame
    turned off) when it fits there, else as "below": below the axes, outside them
    (`fig.legend(loc="outside lower center")`; constrained layout makes room), in the columns
    that make it lowest within the figure's width, a label broken into two lines where that
    saves height (`_columns`); "right": one column right of the axes, outside them, at most
    `RIGHT_SHARE` of the figure's width, level with the x axis (the data keeps the figure's
    height); "none": no legend (a free `cell` is removed). Returns the Legend, or None.

    Raises:
      ValueError: `where` is not one of `LEGENDS` (the command lines offer only those).
    """
    import matplotlib

    if where not in LEGENDS:
        raise ValueError(f"legend {where!r}: one of {LEGENDS}")

    size = fontsize or float(matplotlib.rcParams["legend.fontsize"])
    handle = 2.0 + 0.8  # handle length and its gap to the text, in font sizes
    widths = [text_width(label, size) + handle * size for label in labels]
    pad = 2.0 * size  # the space between two columns
    if where in ("right", "none"):
        if cell is not None:
            cell.remove()
        if where == "none":
            return None
        room = RIGHT_SHARE * fig.get_figwidth() * 72.0 - handle * size - size
        labels = [fit_text(label, room / 72.0, size) for label in labels]
        return fig.legend(handles, labels, loc="outside right lower", fontsize=size)
    if cell is not None and widths and where == "auto":
        spec = cell.get_subplotspec()  # the cell's share of the grid, less a margin
        grid = spec.get_gridspec()
        wide = len(spec.colspan) / grid.ncols * fig.get_figwidth() * 72.0 - size
        high = len(spec.rowspan) / grid.nrows * fig.get_figheight() * 72.0 - 2 * size
        if max(widths) <= wide and 1.7 * size * len(labels) <= high:
            return cell.legend(handles, labels, loc="center", fontsize=size)
    labels, ncol = _columns(labels, fig.get_figwidth() * 72.0 - 2 * size, size, handle, pad)
    for ax in fig.axes:  # the free cells of a grid hold nothing
        if cell is ax:
            ax.remove()
    return fig.legend(handles, labels, loc="outside lower center", ncol=ncol, fontsize=size)


def _columns(
    labels: Sequence[str], room: float, size: float, handle: float, pad: float
) -> tuple[list[str], int]:
    """The labels (each broken into at most two lines when that saves rows) and the number of
    columns that give the lowest legend within `room` points; ties go to fewer columns."""
    n = len(labels)
    one = [fit_text(label, (room - handle * size) / 72.0, size) for label in labels]
    best: tuple[float, int, list[str]] = (float("inf"), 1, one)  # else: one column, cut
    for cols in sorted({-(-n // rows) for rows in range(1, n + 1)}):
        width = (room - pad * (cols - 1)) / cols - handle * size  # a column's text, points
        fitted = [fit_text(label, width / 72.0, size, max_lines=2) for label in labels]
        if any("…" in f and "…" not in label for f, label in zip(fitted, labels, strict=True)):
            continue
        # matplotlib fills columns first, the first n % cols of them one entry longer
        bounds = [c * (n // cols) + min(c, n % cols) for c in range(cols + 1)]
        lines = [sum(f.count("\n") + 1 for f in fitted[a:b]) for a, b in itertools.pairwise(bounds)]
        if max(lines) < best[0]:
            best = (max(lines), cols, fitted)
    return best[2], best[1]
