"""A quantization study on the host: the original model and its copies scored in one pass
(`study.copies`: the step scores each copy against the original on the same batch,
`ppl_jax.scoring.step`), gathered batch by batch and summarised per copy in float64.

Per copy, over exactly the original's scored tokens (the same batches, the same targets):

- `perplexity`, `bits_per_byte` and their 95% bootstrap intervals (`uncertainty.intervals` of
  the copy's per-unit sums, the resampling units of the run);
- the paired difference to the original (`uncertainty.paired_difference`: the same units drawn
  for both in each replicate): `delta_bits_per_byte`, `delta_nll_per_token` and
  `perplexity_ratio` = PPL(copy) / PPL(original) = exp(delta NLL per token), each with its paired
  interval (the ratio's is the exp of the NLL difference's), and `ln_perplexity_correlation`, the
  Pearson correlation of the two models' ln perplexity per unit (document or window);
- `kl_*`: KL(original || copy) in nats per token (`ppl_jax.scoring.nll`: exact in float32 from
  both models' logits, summed here in float64): mean, median, p90, p99, p99.9 (`numpy.quantile`'s
  linear interpolation in float64 over all scored tokens), max and where it is; with
  `both_directions` the same of KL(copy || original) under `kl_reverse_*`;
- `delta_p_*`: the change of the target's probability, p_copy(target) - p_orig(target), computed
  in float64 from the two float32 NLLs as `p_orig * expm1(nll_orig - nll_copy)` (no
  cancellation): mean, RMS, p1, p5, median, p95, p99;
- `same_top1`: the share of tokens where both models put the same token first.

Host memory: per copy 12 bytes per scored token (KL float32, delta p float64), 4 more with both
directions; 12 per token for the maximum's place; the per-window sums.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ppl_jax.metrics import uncertainty

LN2 = math.log(2.0)
KL_QUANTILES = {"median": 0.5, "p90": 0.9, "p99": 0.99, "p99.9": 0.999}
DELTA_P_QUANTILES = {"p1": 0.01, "p5": 0.05, "median": 0.5, "p95": 0.95, "p99": 0.99}
ORIGINAL = "original"


def window_ids(rows: Sequence[tuple[int, ...]]) -> np.ndarray:
    """`[rows, slots] int64`: the window id of each (row, slot) of a batch, -1 for none."""
    ids = np.full((len(rows), max((len(x) for x in rows), default=0) or 1), -1, np.int64)
    for i, row in enumerate(rows):
        ids[i, : len(row)] = row
    return ids


class Study:
    """Gathers a study's per-token values, batch by batch: an observer of the scoring loop
    (`ppl_jax.scoring.observers.ScoreObserver`) of a step with copies (`StepOptions.copies`).

    Args:
      names: the copies' names, in the step's order (`copy<i>/*` is `names[i]`).
      num_windows: the plan's windows (per-window sums, for the intervals).
      both_directions: the step returns `copy<i>/kl_reverse` too.
      describe: names a token's place: `(window id, row position) -> str` (default
        `window W, row position P`).
    """

    def __init__(
        self,
        names: Sequence[str],
        num_windows: int,
        both_directions: bool = False,
        describe: Callable[[int, int], str] | None = None,
    ):
        self.names = tuple(names)
        self.both_directions = both_directions
        self.describe = describe or (lambda w, p: f"window {w}, row position {p}")
        self.window_nll = np.zeros(num_windows, np.float64)  # the original's, nats
        self.window_tokens = np.zeros(num_windows, np.int64)
        self.copy_window_nll = [np.zeros(num_windows, np.float64) for _ in self.names]
        self.num_same_top1 = [0] * len(self.names)
        self._kl: list[list[np.ndarray]] = [[] for _ in self.names]
        self._kl_reverse: list[list[np.ndarray]] = [[] for _ in self.names]
        self._delta_p: list[list[np.ndarray]] = [[] for _ in self.names]
        self._window: list[np.ndarray] = []
        self._position: list[np.ndarray] = []

    def should_stop(self, i: int) -> bool:
        return False

    def on_batch(self, i: int, rows: list[tuple[int, ...]], host: Any) -> None:
        """`add(rows, host.extras)`."""
        self.add(rows, host.extras)

    def close(self) -> None:
        pass

    def add(self, rows: Sequence[tuple[int, ...]], arrays: dict[str, np.ndarray]) -> None:
        """Adds one batch.

        Args:
          rows: the batch's rows, the window ids each holds (`Layout.batch_rows`).
          arrays: the step's per-token host arrays `[batch, seq]` (`StepSums.extras`): `scored`,
            `slot`, `nll` (the original's, float32 nats) and per copy `copy<i>/nll`,
            `copy<i>/kl`, `copy<i>/same_top1` (and `copy<i>/kl_reverse`).
        """
        r, p = np.nonzero(arrays["scored"])
        window = window_ids(rows)[r, arrays["slot"][r, p] - 1]
        self._window.append(window)
        self._position.append((p + 1).astype(np.int32))
        nll = arrays["nll"][r, p].astype(np.float64)
        np.add.at(self.window_nll, window, nll)
        np.add.at(self.window_tokens, window, 1)
        for i in range(len(self.names)):
            copy_nll = arrays[f"copy{i}/nll"][r, p].astype(np.float64)
            np.add.at(self.copy_window_nll[i], window, copy_nll)
            self._kl[i].append(arrays[f"copy{i}/kl"][r, p].astype(np.float32))
            self._delta_p[i].append(np.exp(-nll) * np.expm1(nll - copy_nll))
            self.num_same_top1[i] += int(np.count_nonzero(arrays[f"copy{i}/same_top1"][r, p]))
            if self.both_directions:
                self._kl_reverse[i].append(arrays[f"copy{i}/kl_reverse"][r, p].astype(np.float32))

    @property
    def num_tokens(self) -> int:
        return int(self.window_tokens.sum())

    def summary(self, plan: Any, samples: int = 1000, seed: int = 0) -> dict[str, Any]:
        """The study's statistics (see the module docstring), JSON-ready: `{"original":
        {num_tokens, perplexity, bits_per_byte, intervals}, "copies": {name: {...}}, "names":
        [the copies' names, in order]}`.

        Args:
          plan: the run's plan (`protocols.Plan`: its bytes and resampling units).
          samples, seed: the bootstrap's replicates (0: no intervals) and seed.
        """
        n = self.num_tokens
        original = uncertainty.units_of(plan, _Totals(self.window_nll, self.window_tokens))
        out: dict[str, Any] = {ORIGINAL: _model_part(original, n, plan.num_bytes, samples, seed)}
        copies: dict[str, Any] = {}
        position = np.concatenate(self._position) if n else np.zeros(0, np.int32)
        window = np.concatenate(self._window) if n else np.zeros(0, np.int64)
        for i, name in enumerate(self.names):
            units = uncertainty.units_of(plan, _Totals(self.copy_window_nll[i], self.window_tokens))
            part = _model_part(units, n, plan.num_bytes, samples, seed)
            part.update(_paired(original, units, samples, seed))
            part.update(self._quantiles("kl", self._kl[i], window, position))
            if self.both_directions:
                part.update(self._quantiles("kl_reverse", self._kl_reverse[i], window, position))
            part.update(_delta_p(self._delta_p[i]))
            part["same_top1"] = self.num_same_top1[i] / n if n else None
            copies[name] = part
        out["copies"] = copies
        out["names"] = list(self.names)  # the copies' order (JSON files sort their keys)
        return out

    def _quantiles(
        self, key: str, parts: list[np.ndarray], window: np.ndarray, position: np.ndarray
    ) -> dict[str, Any]:
        if not parts or not sum(x.size for x in parts):
            return {f"{key}_mean": None}
        values = np.concatenate(parts).astype(np.float64)
        at = int(np.argmax(values))
        return {
            f"{key}_mean": float(np.mean(values)),
            **{f"{key}_{k}": float(np.quantile(values, q)) for k, q in KL_QUANTILES.items()},
            f"{key}_max": float(values[at]),
            f"{key}_max_at": self.describe(int(window[at]), int(position[at])),
        }


def token_arrays(names: Sequence[str], both_directions: bool = False) -> tuple[str, ...]:
    """The step's per-token arrays of the copies (`copy<i>/nll`, `/kl`, `/same_top1`, and
    `/kl_reverse` with both directions)."""
    parts = ("nll", "kl", "same_top1") + (("kl_reverse",) if both_directions else ())
    return tuple(f"copy{i}/{part}" for i in range(len(names)) for part in parts)


def token_fields(names: Sequence[str], both_directions: bool = False) -> list[tuple[str, Any]]:
    """tokens.parquet's columns of the copies, `(name, NumPy dtype)`: per copy `nll/<copy>`
    (float32 nats, the copy's), `kl/<copy>` (KL(original || copy), float32 nats),
    `kl_reverse/<copy>` (KL(copy || original), with both directions), `same_top1/<copy>`
    (bool), `delta_logprob/<copy>` (float32 nats, log p_copy - log p_orig of the target) and
    `delta_p/<copy>` (float32, p_copy - p_orig of the target)."""
    out: list[tuple[str, Any]] = []
    for name in names:
        out += [(f"nll/{name}", np.float32), (f"kl/{name}", np.float32)]
        out += [(f"kl_reverse/{name}", np.float32)] if both_directions else []
        out += [(f"same_top1/{name}", np.bool_), (f"delta_logprob/{name}", np.float32)]
        out += [(f"delta_p/{name}", np.float32)]
    return out


def token_columns(
    cols: dict[str, np.ndarray], names: Sequence[str], both_directions: bool = False
) -> dict[str, np.ndarray]:
    """The values of `token_fields` from the step's arrays for the rows (`cols`: `nll`, the
    original's, and `token_arrays`)."""
    nll = cols["nll"].astype(np.float64)
    out = {}
    for i, name in enumerate(names):
        copy_nll = cols[f"copy{i}/nll"].astype(np.float64)
        out[f"nll/{name}"] = copy_nll.astype(np.float32)
        out[f"kl/{name}"] = cols[f"copy{i}/kl"].astype(np.float32)
        if both_directions:
            out[f"kl_reverse/{name}"] = cols[f"copy{i}/kl_reverse"].astype(np.float32)
        out[f"same_top1/{name}"] = cols[f"copy{i}/same_top1"].astype(bool)
        out[f"delta_logprob/{name}"] = (nll - copy_nll).astype(np.float32)
        out[f"delta_p/{name}"] = (np.exp(-nll) * np.expm1(nll - copy_nll)).astype(np.float32)
    return out


class _Totals:
    """The per-window sums `uncertainty.units_of` reads."""

    def __init__(self, window_nll: np.ndarray, window_tokens: np.ndarray):
        self.window_nll, self.window_tokens = window_nll, window_tokens


def _model_part(
    units: uncertainty.Units, n: int, num_bytes: int, samples: int, seed: int
) -> dict[str, Any]:
    nll = float(np.sum(units.nll))
    iv = uncertainty.intervals(units, samples, seed) if samples and units.count > 1 else None
    return {
        "num_tokens": n,
        "nll_sum": nll,
        "perplexity": _exp(nll / n) if n else None,
        "perplexity_interval": None if iv is None else iv["perplexity"],
        "bits_per_byte": nll / num_bytes / LN2 if num_bytes else None,
        "bits_per_byte_interval": None if iv is None else iv["bits_per_byte"],
    }


def _paired(a: uncertainty.Units, b: uncertainty.Units, samples: int, seed: int) -> dict:
    """B against A: the differences, their paired intervals, the correlation of ln PPL."""
    na, nb, tokens = np.sum(a.nll), np.sum(b.nll), np.sum(a.tokens)
    out: dict[str, Any] = {
        "delta_bits_per_byte": float((nb - na) / np.sum(a.bytes) / LN2),
        "delta_bits_per_byte_interval": None,
        "delta_nll_per_token": float((nb - na) / tokens),
        "delta_nll_per_token_interval": None,
        "perplexity_ratio": _exp(float((nb - na) / tokens)),
        "perplexity_ratio_interval": None,
        "ln_perplexity_correlation": _correlation(a, b),
    }
    if samples and a.count > 1:
        d = uncertainty.paired_difference(a, b, samples, seed)
        out["delta_bits_per_byte_interval"] = d["bits_per_byte"]["interval"]
        lo, hi = out["delta_nll_per_token_interval"] = d["nll_per_token"]["interval"]
        out["perplexity_ratio_interval"] = [_exp(lo), _exp(hi)]
    return out


def _correlation(a: uncertainty.Units, b: uncertainty.Units) -> float | None:
    """Pearson's r of ln PPL per unit (NLL per token of each unit with tokens), or None where
    it is undefined (fewer than two units, no spread)."""
    has = a.tokens > 0
    if np.count_nonzero(has) < 2:
        return None
    x, y = a.nll[has] / a.tokens[has], b.nll[has] / b.tokens[has]
    if np.std(x) == 0 or np.std(y) == 0:
        return None
    return float(np.corrcoef(x, y)[0, 1])


def _delta_p(parts: list[np.ndarray]) -> dict[str, Any]:
    if not parts or not sum(x.size for x in parts):
        return {"delta_p_mean": None}
    d = np.concatenate(parts)
    return {
        "delta_p_mean": float(np.mean(d)),
        "delta_p_rms": float(np.sqrt(np.mean(d * d))),
        **{f"delta_p_{k}": float(np.quantile(d, q)) for k, q in DELTA_P_QUANTILES.items()},
    }


def _exp(x: float) -> float | None:
    try:
        return math.exp(x)
    except OverflowError:
        return None


COLUMNS = (
    "model",
    "size",
    "bits/weight",
    "perplexity [95%]",
    "bits per byte [95%]",
    "Δ bits per byte [95%]",
    "PPL ratio [95%]",
    "r(ln PPL)",
    "KL mean",
    "KL p99",
    "KL max",
    "Δp RMS",
    "same top-1",
)


def table_lines(summary: dict[str, Any], title: str, warning: str | None = None) -> list[str]:
    """The study's table (Markdown, one row per model, the original first; `COLUMNS`), and the
    run's `warning` of its intervals (rough: too few windows) under it."""
    lines = [f"{title}: the original and {len(summary['copies'])} copies, one pass", ""]
    lines += ["| " + " | ".join(COLUMNS) + " |", "|" + " --- |" * len(COLUMNS)]
    names = summary.get("names") or list(summary["copies"])
    rows = [(ORIGINAL, summary[ORIGINAL]), *((n, summary["copies"][n]) for n in names)]
    for name, s in rows:
        size = s.get("size_bytes")
        cells = [
            name,
            "-" if size is None else f"{size / 2**20:,.1f} MiB",
            _fmt(s.get("bits_per_weight"), digits=2),
            _fmt(s.get("perplexity"), s.get("perplexity_interval"), 3),
            _fmt(s.get("bits_per_byte"), s.get("bits_per_byte_interval")),
            _fmt(s.get("delta_bits_per_byte"), s.get("delta_bits_per_byte_interval")),
            _fmt(s.get("perplexity_ratio"), s.get("perplexity_ratio_interval")),
            _fmt(s.get("ln_perplexity_correlation")),
            _fmt(s.get("kl_mean"), digits=5),
            _fmt(s.get("kl_p99"), digits=5),
            _fmt(s.get("kl_max"), digits=4),
            _fmt(s.get("delta_p_rms"), digits=5),
            "-" if s.get("same_top1") is None else f"{100 * s['same_top1']:.2f}%",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    if warning:
        lines += ["", f"warning: {warning}"]
    return lines


def _fmt(value: float | None, interval: Sequence[float | None] | None = None, digits=4) -> str:
    if value is None:
        return "-"
    text = f"{value:.{digits}f}"
    if not interval or None in interval:
        return text
    return f"{text} [{interval[0]:.{digits}f}, {interval[1]:.{digits}f}]"
