"""The figure of a quantization study (`study.copies`): KL(original || copy) at its quantiles over
the scored tokens, one line per copy, at a column's size by default. Written by the run as
`study_kl.<format>` (`output.figures`); redrawn from `study.json` with

    from ppl_jax.outputs import figures, study_figure
    fig = study_figure.kl_figure(json.load(open("study.json")), "wikitext-2")
    figures.save_figure(fig, "study_kl.pdf")

The KL axis is logarithmic: a copy identical to the original (KL 0 everywhere) has no point on
it, and says so in the legend.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ppl_jax.outputs import figure_layout, figures

WHAT = "the study's KL quantiles"
NAME = "study_kl"  # study_kl.png, .pdf, .svg
WIDTH, HEIGHT = 3.5, 2.6  # inches: one column of a paper
LEVELS = (("median", "median"), ("p90", "90%"), ("p99", "99%"), ("p99.9", "99.9%"), ("max", "max"))


def check_available() -> None:
    """Raises ConfigError (before any work) if matplotlib, which the figure needs, is missing."""
    figures.check_available(WHAT)


@figures.styled
def kl_figure(
    summary: Mapping[str, Any],
    label: str,
    size: tuple[float, float] | None = None,
    title: bool = True,
    legend: str = "below",
) -> Any:
    """The Figure of each copy's KL(original || copy) (nats per token, log scale) at the median,
    the 90th, 99th and 99.9th percentiles and the maximum over the scored tokens (`summary`:
    `ppl_jax.metrics.study.Study.summary`'s result). Title: "KL from the original by quantile"
    and `label` (the dataset); `title` False leaves it to the caption; `legend`
    (`figure_layout.LEGENDS`) places the legend.

    Raises:
      ConfigError: matplotlib is not installed.
    """
    fig = figures.new_figure(*(size or (WIDTH, HEIGHT)), WHAT)
    ax = fig.add_subplot()
    names = summary.get("names") or list(summary["copies"])
    for i, name in enumerate(names):
        values = [summary["copies"][name].get(f"kl_{key}") for key, _ in LEVELS]
        points = [(x, v) for x, v in enumerate(values) if v is not None and v > 0]
        color = figures.COLORS[i % len(figures.COLORS)]
        if points:
            xs, ys = zip(*points, strict=True)
            ax.plot(xs, ys, marker="o", markersize=3, color=color, label=name)
        else:
            ax.plot([], [], color=color, label=f"{name} (KL 0)")
    ax.set_yscale("log")
    ax.set_xticks(range(len(LEVELS)), [text for _, text in LEVELS])
    ax.set_xlabel("quantile over the scored tokens")
    ax.set_ylabel("KL(original ‖ copy), nats")
    if title:
        tokens = summary.get("original", {}).get("num_tokens")
        under = f"{label}, {tokens:,} tokens" if tokens else label
        ax.set_title(f"KL from the original by quantile\n{under}")
    handles, labels = ax.get_legend_handles_labels()
    figure_layout.place_legend(fig, handles, labels, where=legend)
    return fig
