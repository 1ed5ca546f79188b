"""The token view's colour scales: surprisal on a fixed scale of bits, and the change B - A on a
scale fitted to the page (`diff_scale`)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

DECIMALS = 4  # bits and nats in the page

# Colour scales: bin i holds values in [edges[i-1], edges[i]). Surprisal in bits (ColorBrewer
# YlOrRd); the change B - A in bits (ColorBrewer RdBu, blue where B is less surprised).
SURPRISAL_EDGES = (1, 2, 4, 6, 8, 10, 12, 16)
SURPRISAL_COLORS = "#ffffcc #ffeda0 #fed976 #feb24c #fd8d3c #fc4e2a #e31a1c #bd0026 #800026"
DIFF_EDGES = (-4, -2, -1, -0.5, -0.1, 0.1, 0.5, 1, 2, 4)
DIFF_COLORS = "#053061 #2166ac #4393c3 #92c5de #d1e5f0 #f7f7f7 #fddbc7 #f4a582 #d6604d #b2182b"
DIFF_COLORS += " #67001f"
SCALE = {
    "surprisal": {"edges": list(SURPRISAL_EDGES), "colors": SURPRISAL_COLORS.split()},
    "diff": {"edges": list(DIFF_EDGES), "colors": DIFF_COLORS.split()},
}


def _nice_ceiling(x: float) -> float:
    """The smallest of 1, 2, 5 times a power of ten that is at least `x` (> 0)."""
    power = 10.0 ** math.floor(math.log10(x))
    for m in (1, 2, 5, 10):
        if m * power >= x * (1 - 1e-12):
            return m * power
    return 10 * power


def diff_scale(deltas: np.ndarray) -> dict[str, Any]:
    """The colour bins of the change B - A in bits, adapted to the page: the outer edge is the
    1-2-5 number at or above the 99th percentile of |B - A| over the shown tokens, at most 4
    bits (the fixed scale, `DIFF_EDGES`, for large changes), and the other edges keep the fixed
    scale's proportions (1/2, 1/4, 1/8, 1/40 of the outer one); `decimals` prints the innermost
    edge to two significant digits (at least `DECIMALS`). So a bfloat16-against-float32 page,
    whose changes are thousandths of a bit, is not one white bin.

    Returns:
      `{"edges", "colors", "decimals", "adapted": bool}`.
    """
    finite = np.abs(deltas[np.isfinite(deltas)]) if deltas.size else deltas
    top = float(np.quantile(finite, 0.99)) if finite.size else 0.0
    outer = max(DIFF_EDGES)
    top = outer if top <= 0 else min(outer, _nice_ceiling(top))
    factor = top / outer
    edges = [float(f"{e * factor:.6g}") for e in DIFF_EDGES]
    inner = min(abs(e) for e in edges)
    decimals = max(DECIMALS, 1 - math.floor(math.log10(inner)))
    return {**SCALE["diff"], "edges": edges, "decimals": decimals, "adapted": top < outer}
