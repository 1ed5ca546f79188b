"""Figures: one style for every plot, and one way to save them (PNG, PDF or SVG by extension).

Every figure of ppl_jax (the report's small multiples, the position and context-length curves,
and any a later module adds) is drawn the same way:

    from ppl_jax.outputs import figures

    @figures.styled                      # draws under the house style (`STYLE`)
    def my_figure(data) -> Figure:
        fig = figures.new_figure(7.0, 4.5, "my figure")   # ConfigError without matplotlib
        ax = fig.add_subplot()
        ...
        return fig

    figures.save_figure(my_figure(data), "out/fig.pdf")    # the extension picks the format
    data = figures.figure_bytes(fig, "svg")                # or bytes, for `OutputDir.write_bytes`

A figure is laid out for the size it is drawn at, so the package's figures take `size=(width,
height)` inches and are drawn at it (a column is 3.5 inches wide, two are 7): `styled` scales
the fonts to the width, and `ppl_jax.outputs.figure_layout` fits titles and labels, thins the x
ticks when the figure is drawn and puts legends outside the data. Resizing a drawn figure
(`size` of `figure_bytes`) keeps its fonts and legend as they were chosen.

The format follows the file's extension: `.pdf` and `.svg` are vector files (text kept as
TrueType type 42 in PDF, as paths in SVG, so journals' checks for Type 3 fonts pass), `.png` is
raster at `dpi` (default `DEFAULT_DPI`). Another extension is refused in one sentence, never
written as PNG bytes under another name. The bytes depend only on the figure: no date, creator
or random id is written (PNG `Software`, PDF `CreationDate`/`Creator`/`Producer`, SVG `Date` and
a fixed `svg.hashsalt`), so the same data gives the same file.

The style (`STYLE`): the Okabe-Ito palette (Okabe & Ito, *Color Universal Design*, 2008; the one
Wong recommends in *Nature Methods* 8:441, 2011), distinguishable with the common colour-vision
deficiencies, as the colour cycle (blue first, yellow last: it is the faintest on white); sizes
for a figure printed at its own size (9 pt text, 8 pt ticks and legends); no top or right spine;
a light major grid. 95% intervals are drawn as bands of their line's colour at `BAND_ALPHA`
(`band`), or as error bars where there are fewer than three points.

matplotlib is optional (`pip install 'ppl_jax[diagnostics]'`): it is imported only inside these
functions, and a figure is a bare `matplotlib.figure.Figure` rendered when saved (no pyplot, no
display, no global state beyond `matplotlib.rc_context` while a figure is drawn or saved).
"""

from __future__ import annotations

import dataclasses
import functools
import io
import math
import os
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from ppl_jax.errors import ConfigError
from ppl_jax.outputs import figure_layout
from ppl_jax.outputs.folder import OutputDir

FORMATS = ("png", "pdf", "svg")  # by file extension
DEFAULT_DPI = 100  # PNG pixels per inch (a 7 x 4.5 inch figure is 700 x 450 pixels)
MAX_DPI = 1200
# Okabe-Ito: blue, vermillion, bluish green, orange, reddish purple, sky blue, black, yellow.
COLORS = ("#0072B2", "#D55E00", "#009E73", "#E69F00", "#CC79A7", "#56B4E9", "#000000", "#F0E442")
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")
GREY = "#777777"
SUBTITLE = "#444444"
BAND_ALPHA = 0.25
GRID = {"which": "major", "alpha": 0.3, "linewidth": 0.6}
STYLE: dict[str, Any] = {
    "font.size": 9,
    "axes.titlesize": 9,
    "axes.labelsize": 9,
    "figure.titlesize": 10.5,
    "xtick.labelsize": 8,
    "ytick.labelsize": 8,
    "legend.fontsize": 8,
    "legend.frameon": False,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.linewidth": 0.8,
    "lines.linewidth": 1.5,
    "lines.markersize": 4,
    "grid.alpha": GRID["alpha"],
    "grid.linewidth": GRID["linewidth"],
    "pdf.fonttype": 42,  # TrueType, not Type 3
    "ps.fonttype": 42,
    "svg.fonttype": "path",
    "svg.hashsalt": "ppl_jax",  # the SVG's element ids, without randomness
}
_METADATA = {
    "png": {"Software": None},
    "pdf": {"Creator": None, "Producer": None, "CreationDate": None},
    "svg": {"Creator": None, "Date": None},
}
F = TypeVar("F", bound=Callable[..., Any])


@dataclasses.dataclass(frozen=True)
class FigureSpec:
    """How a run writes its figures (`output.figures`, `output.figure_size`, `output.figure_dpi`).

    Attributes:
      formats: the files written for each figure, among `FORMATS` (e.g. `("png", "pdf")`).
      size: `(width, height)` in inches, or None for each figure's own size.
      dpi: pixels per inch of a PNG (PDF and SVG are vector files).
    """

    formats: tuple[str, ...] = ("png",)
    size: tuple[float, float] | None = None
    dpi: int = DEFAULT_DPI

    @staticmethod
    def parse(
        formats: str, size: str = "", dpi: Any = DEFAULT_DPI, where: str = "output"
    ) -> FigureSpec:
        """From the config's strings: `formats` like `"png"` or `"pdf,png"`, `size` like
        `"3.5x2.5"` (inches; `""`: each figure's own), `dpi` a whole number.

        Raises:
          ConfigError: an unknown format, a malformed or non-positive size, a DPI outside
            1..`MAX_DPI` (naming the `where.figures`, `.figure_size`, `.figure_dpi` key).
        """
        names = tuple(dict.fromkeys(f.strip().lower().lstrip(".") for f in str(formats).split(",")))
        bad = [f for f in names if f not in FORMATS]
        if not names or bad or names == ("",):
            raise ConfigError(
                f"{where}.figures={formats!r}: choose one or more of {', '.join(FORMATS)} "
                f"(comma-separated, e.g. 'pdf,png')."
            )
        return FigureSpec(
            names, parse_size(size, f"{where}.figure_size"), parse_dpi(dpi, f"{where}.figure_dpi")
        )


def parse_size(text: str | None, flag: str) -> tuple[float, float] | None:
    """`"3.5x2.5"` (also `3.5,2.5`) as `(3.5, 2.5)` inches; `""` or None as None.

    Raises:
      ConfigError: not two positive finite numbers of at most 100 inches each.
    """
    if text is None or str(text).strip() == "":
        return None
    parts = str(text).lower().replace(",", "x").split("x")
    try:
        w, h = (float(p) for p in parts)
    except ValueError:
        w = h = math.nan
    if not (0 < w <= 100 and 0 < h <= 100):
        raise ConfigError(
            f"{flag}={text!r}: give the width and height in inches as WIDTHxHEIGHT, e.g. 3.5x2.5 "
            f"(each above 0 and at most 100)."
        )
    return w, h


def parse_dpi(value: Any, flag: str) -> int:
    """A PNG's pixels per inch, a whole number in 1..`MAX_DPI`.

    Raises:
      ConfigError: anything else.
    """
    try:
        dpi = int(str(value).strip())
    except ValueError:
        dpi = 0
    if not 1 <= dpi <= MAX_DPI:
        raise ConfigError(
            f"{flag}={value!r}: give a whole number of pixels per inch, 1 to {MAX_DPI}."
        )
    return dpi


def format_of(path: str, flag: str = "the figure") -> str:
    """The format of a figure file, from its extension: `png`, `pdf` or `svg`.

    Raises:
      ConfigError: another extension (or none).
    """
    ext = os.path.splitext(path)[1].lower().lstrip(".")
    if ext not in FORMATS:
        raise ConfigError(
            f"{flag}={path}: a figure is written as .png (raster), .pdf or .svg (vector), "
            f"chosen by the file's extension; name the file with one of these."
        )
    return ext


def check_available(what: str, hint: str = "") -> None:
    """Raises ConfigError (one sentence with the pip command) if matplotlib is missing; call it
    before any work whose result is a figure.

    Args:
      what: what is plotted, for the error ("the report", "the position curve").
      hint: appended to the error's fix (e.g. "or pass --figure none").
    """
    try:
        from matplotlib.figure import Figure  # noqa: F401
    except ImportError:
        raise ConfigError(
            f"Plotting {what} needs matplotlib, which is not installed; run pip install "
            f"'ppl_jax[diagnostics]'{f' ({hint})' if hint else ''}."
        ) from None


def styled(fn: F) -> F:
    """Decorates a function that builds a figure so that it draws under `STYLE` (every artist
    takes its defaults from the style as it is made), its font sizes scaled to the figure's
    width when the function is called with `size=(width, height)` inches
    (`figure_layout.style_for`: 8 pt text at a column's 3.5 inches, 9 pt from 6 inches)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        import matplotlib

        with matplotlib.rc_context(figure_layout.style_for(STYLE, kwargs.get("size"))):
            return fn(*args, **kwargs)

    return wrapper  # type: ignore[return-value]


def new_figure(width: float, height: float, what: str, hint: str = "") -> Any:
    """A bare matplotlib Figure of `width` x `height` inches, constrained layout, on an Agg
    canvas (no pyplot: `fig.canvas.draw()` renders it); draw on it inside a `styled` function.

    Raises:
      ConfigError: matplotlib is not installed (`check_available`).
    """
    check_available(what, hint)
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=DEFAULT_DPI, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def figure_bytes(
    fig: Any, fmt: str, dpi: int | None = None, size: tuple[float, float] | None = None
) -> bytes:
    """The figure as the bytes of a `fmt` file (`FORMATS`), under `STYLE`, with no date or
    creator in it (the same figure, the same bytes).

    Args:
      fig: a matplotlib Figure.
      fmt: `png`, `pdf` or `svg`.
      dpi: a PNG's pixels per inch (default `DEFAULT_DPI`); also the resolution of any raster
        part of a vector file.
      size: `(width, height)` in inches to draw it at, or None for its own size.

    Raises:
      ValueError: an unknown format (`format_of` gives users their sentence).
    """
    if fmt not in FORMATS:
        raise ValueError(f"figure format {fmt!r}: one of {FORMATS}")
    import matplotlib

    if size is not None:
        fig.set_size_inches(*size)
    buf = io.BytesIO()
    with matplotlib.rc_context(STYLE):
        fig.savefig(buf, format=fmt, dpi=dpi or DEFAULT_DPI, metadata=_METADATA[fmt])
    return buf.getvalue()


def save_figure(
    fig: Any,
    path: str,
    dpi: int | None = None,
    size: tuple[float, float] | None = None,
    flag: str = "the figure",
) -> str:
    """Writes `fig` to `path` atomically (a temporary file, fsync, rename), in the format of its
    extension (`format_of`); returns the path.

    Args:
      fig: a matplotlib Figure; dpi, size: as in `figure_bytes`.
      path: a local `.png`, `.pdf` or `.svg` file whose folder exists.
      flag: how the caller names the path in an error (`--figure`, `the figure`).

    Raises:
      ConfigError: another extension, a missing folder, or a file that cannot be written.
    """
    fmt = format_of(path, flag)
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise ConfigError(f"{flag}={path}: the folder {folder} does not exist; create it first.")
    data = figure_bytes(fig, fmt, dpi, size)
    try:
        return OutputDir(folder, None).write_bytes(os.path.basename(path), data)
    except (OSError, ConfigError) as e:
        why = e.strerror if isinstance(e, OSError) else "no space or no permission"
        raise ConfigError(
            f"{flag}={path} cannot be written ({why}); choose another path."
        ) from None


def write_figures(out: Any, name: str, fig: Any, spec: FigureSpec) -> list[str]:
    """Writes `fig` into the output folder `out` (`OutputDir`) as `name.<format>` for each of
    `spec.formats`; returns the paths written."""
    return [
        out.write_bytes(f"{name}.{fmt}", figure_bytes(fig, fmt, spec.dpi, spec.size))
        for fmt in spec.formats
    ]


def band(
    ax: Any,
    x: Sequence[float],
    lo: Sequence[float | None],
    hi: Sequence[float | None],
    color: str,
    y: Sequence[float] | None = None,
    label: str | None = None,
) -> Any:
    """Draws a 95% interval: a band of `color` between `lo` and `hi` over `x` (three points or
    more with an interval), else error bars around `y`. Points without an interval (None) are
    gaps. Returns the artist drawn (the band, or the first error bars; `label` is on it, for a
    legend), or None when nothing was drawn."""
    pairs = [
        (xi, a, b, yi)
        for xi, a, b, yi in zip(x, lo, hi, y if y is not None else [None] * len(x), strict=True)
        if a is not None and b is not None and math.isfinite(a) and math.isfinite(b)
    ]
    if not pairs:
        return None
    if len(pairs) > 2:
        nan = math.nan
        return ax.fill_between(
            list(x),
            [nan if a is None else a for a in lo],
            [nan if b is None else b for b in hi],
            color=color,
            alpha=BAND_ALPHA,
            linewidth=0,
            label=label,
        )
    if y is None:
        return None
    drawn = [
        ax.errorbar(xi, yi, [[yi - a], [b - yi]], color=color, capsize=3, linewidth=1, label=lab)
        for (xi, a, b, yi), lab in zip(pairs, [label] + [None] * len(pairs), strict=False)
    ]
    return drawn[0]


def count_label(x: float) -> str:
    """A count for a tick: `1`, `10`, `512`, `1,024`, `1k`, `2.5k`, `10k`, `131k`, `1M` (never
    `1.0`): round thousands and millions in short form, other integers below 100,000 in full."""
    if x == int(x) and abs(x) < 1e5 and (x % 1000 or x == 0):
        return f"{int(x):,}"
    for scale, suffix in ((1e9, "B"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= scale:
            return f"{x / scale:.3g}{suffix}"
    return f"{x:.3g}"


def count_axis(
    ax: Any, which: str, log: bool, base: float = 10, at: Sequence[float] | None = None
) -> None:
    """Ticks of the `which` ("x" or "y") axis of `ax`, a count (steps, positions, tokens), read
    as `1, 10, 100, 1k`: on a log scale of `base` when `log`; labels from `count_label`; at the
    values `at` when given (each checkpoint step, each context length), else where matplotlib
    puts them. Ticks on the x axis are thinned when the figure is drawn so that their labels
    never touch (`figure_layout.thinned_locator`), at any size."""
    from matplotlib.ticker import (
        FixedLocator,
        FuncFormatter,
        LogLocator,
        NullFormatter,
        NullLocator,
    )

    axis = ax.xaxis if which == "x" else ax.yaxis
    if log:
        (ax.set_xscale if which == "x" else ax.set_yscale)("log", base=base)
        axis.set_minor_formatter(NullFormatter())
    locator = (
        FixedLocator(list(at)) if at else LogLocator(base=base) if log else axis.get_major_locator()
    )
    if at:
        axis.set_minor_locator(NullLocator())
    axis.set_major_locator(figure_layout.thinned_locator(locator) if which == "x" else locator)
    axis.set_major_formatter(FuncFormatter(lambda x, _: count_label(x)))


def log_if_wide(values: Sequence[float | None], factor: float = 10.0) -> bool:
    """Whether positive `values` span more than `factor` (then a log scale reads them)."""
    positive = [v for v in values if v is not None and v > 0]
    return len(positive) == len(values) and bool(values) and max(positive) > factor * min(positive)
