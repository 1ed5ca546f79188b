"""What the PNG figures share: a bare matplotlib Figure, PNG bytes, colours and axis labels.

Used by the curves (`ppl_jax.metrics.curves`) and the report (`ppl_jax.analysis.report`).
matplotlib is optional (`pip install 'ppl_jax[diagnostics]'`): it is imported only inside these
functions, and a figure is drawn on a bare `matplotlib.figure.Figure` that Agg renders when it is
saved (no pyplot, no display, no global state).

Colours are the Okabe-Ito palette (Okabe & Ito, *Color Universal Design*, 2008; the one
Wong recommends in *Nature Methods* 8:441, 2011), distinguishable with the common colour-vision
deficiencies; black first, then the seven colours, yellow last (it is the faintest on white).
"""

from __future__ import annotations

import io
from typing import Any

from ppl_jax.errors import ConfigError

# Okabe-Ito: blue, vermillion, bluish green, orange, reddish purple, sky blue, black, yellow.
COLORS = ("#0072B2", "#D55E00", "#009E73", "#E69F00", "#CC79A7", "#56B4E9", "#000000", "#F0E442")
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")
GRID = {"which": "major", "alpha": 0.3, "linewidth": 0.6}


def figure(width: float, height: float, what: str, hint: str = "") -> Any:
    """A bare matplotlib Figure of `width` x `height` inches at 100 dpi, constrained layout.

    Args:
      what: what is plotted, for the error ("the report", "the position curve").
      hint: appended to the error's fix (e.g. "or pass --png none").

    Raises:
      ConfigError: matplotlib is not installed (one sentence with the pip command).
    """
    try:
        from matplotlib.figure import Figure
    except ImportError:
        raise ConfigError(
            f"Plotting {what} needs matplotlib, which is not installed; run pip install "
            f"'ppl_jax[diagnostics]'{f' ({hint})' if hint else ''}."
        ) from None
    return Figure(figsize=(width, height), dpi=100, layout="constrained")


def png(fig: Any) -> bytes:
    """The figure as PNG bytes (Agg), with no clock in its metadata (the same figure, the same
    bytes)."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", metadata={"Software": None})
    return buf.getvalue()


def count_label(x: float) -> str:
    """A count for a tick: `1`, `10`, `512`, `1,024`, `1k`, `2.5k`, `10k`, `131k`, `1M` (never
    `1.0`): round thousands and millions in short form, other integers below 100,000 in full."""
    if x == int(x) and abs(x) < 1e5 and (x % 1000 or x == 0):
        return f"{int(x):,}"
    for scale, suffix in ((1e9, "B"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= scale:
            return f"{x / scale:.3g}{suffix}"
    return f"{x:.3g}"


def count_axis(ax: Any, which: str, log: bool, base: float = 10) -> None:
    """Ticks of the `which` ("x" or "y") axis of `ax`, a count (steps, positions, tokens), read
    as `1, 10, 100, 1k`: on a log scale of `base` when `log`; labels from `count_label`."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    axis = ax.xaxis if which == "x" else ax.yaxis
    if log:
        (ax.set_xscale if which == "x" else ax.set_yscale)("log", base=base)
        axis.set_major_locator(LogLocator(base=base))
        axis.set_minor_formatter(NullFormatter())
    axis.set_major_formatter(FuncFormatter(lambda x, _: count_label(x)))


def log_if_wide(values: list[float], factor: float = 10.0) -> bool:
    """Whether positive `values` span more than `factor` (then a log scale reads them)."""
    positive = [v for v in values if v is not None and v > 0]
    return len(positive) == len(values) and bool(values) and max(values) > factor * min(values)
