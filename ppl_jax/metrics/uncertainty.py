"""Confidence intervals: a seeded bootstrap of perplexity and bits per byte, on the host.

The resampling unit is the largest piece of the corpus whose sums are independent of the others':

- **documents**, where every window lies in one document (`lm_eval_rolling`): the bootstrap over
  documents (Efron & Tibshirani, *An Introduction to the Bootstrap*, 1993, ch. 6).
- **blocks of consecutive windows** for the stream protocols (`sliding`, `hf_strided`,
  `gptq_chunks`), whose windows span documents and whose neighbours share text and topic: the
  circular block bootstrap (Politis & Romano 1992, *Exploring the Limits of Bootstrap*, 263-270),
  the moving-block bootstrap of Künsch (1989, *Ann. Statist.* 17:1217) with the windows joined
  end to start. Blocks are `ceil(W ** (1/3))` windows long (W: windows), the order of block
  length that Hall, Horowitz & Jing (1995, *Biometrika* 82:561) show is right for variances and
  intervals; each replicate joins `ceil(W / length)` blocks whose first windows are drawn
  uniformly from all W (a block that runs past the last window goes on at the first). Joined
  so, every window is drawn equally often; the moving-block bootstrap (first windows from the
  `W - length + 1` that fit) draws the windows at the two ends less often than the others,
  which with few windows moves every replicate away from the estimate: three windows of a long
  document gave perplexity 53,547.69 with the interval [52,951.51, 53,394.50].

Each replicate sums NLL, tokens and bytes over the units it drew and takes their ratio (a ratio
estimator, as the point estimate is: `nll_sum / num_tokens`, never a mean of per-unit means).
The interval is the 2.5th and 97.5th percentiles of the replicates (the percentile interval,
Efron & Tibshirani ch. 13), which maps through `exp` unchanged: perplexity's interval is the exp
of NLL per token's. Draws come from `numpy.random.default_rng(seed)`, so a run's intervals are
reproducible, and two runs on the same units draw the same resamples (`paired_difference`).

Few units make a rough interval: with fewer than `MIN_BLOCKS` independent pieces (documents, or
windows over the block length) the percentile interval covers less than its 95% and may even
miss the estimate. `intervals` then says so in `warning`, with what to do (more text, more
windows, more documents), and says too when the interval does not contain the estimate.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import math
import zipfile
import zlib
from typing import Any

import numpy as np

from ppl_jax.errors import DataError
from ppl_jax.metrics.sums import LN2

LEVEL = 0.95
METHODS = {
    "document": "bootstrap over documents",
    "window": "circular block bootstrap over windows (blocks of ceil(W^(1/3)) consecutive windows)",
}
MIN_BLOCKS = 10  # independent pieces (documents, or windows / block length) below which we warn
_CHUNK = 1 << 19  # unit draws gathered at a time (bounds the memory of a replicate batch)


@dataclasses.dataclass(frozen=True)
class Units:
    """Per-unit sufficient statistics of a run, the bootstrap's resampling units.

    Attributes:
      kind: `"document"` (independent documents) or `"window"` (consecutive windows of a
        stream, resampled in blocks of `block_length`).
      nll: `[U] float64`, nats, NLL summed over each unit's scored tokens.
      tokens: `[U] int64`, scored tokens per unit.
      bytes: `[U] int64`, UTF-8 bytes per unit, by the protocol's convention (they add up to
        the run's `num_bytes`).
      block_length: units per resampled block (1 for documents).
    """

    kind: str
    nll: np.ndarray
    tokens: np.ndarray
    bytes: np.ndarray
    block_length: int

    @property
    def count(self) -> int:
        return int(self.nll.size)

    @property
    def method(self) -> str:
        return METHODS[self.kind]


def block_length(num_windows: int) -> int:
    """`ceil(W ** (1/3))`, at least 1: the moving-block bootstrap's block, in windows."""
    return max(1, math.ceil(round(num_windows ** (1 / 3), 9)))


def units_of(plan: Any, totals: Any) -> Units:
    """The resampling units of a run, from its plan (`protocols.Plan`) and per-window sums
    (`scoring.ScoreTotals`): documents where every window lies in one (`document >= 0`) and the
    plan counts bytes per document, else the windows themselves.

    Raises:
      ValueError: a stream plan without `window_bytes`.
    """
    doc = plan.windows.document
    if plan.doc_bytes is not None and doc.size and (doc >= 0).all():
        n = plan.num_documents
        return Units(
            kind="document",
            nll=np.bincount(doc, weights=totals.window_nll, minlength=n),
            tokens=np.bincount(doc, weights=totals.window_tokens, minlength=n).astype(np.int64),
            bytes=np.asarray(plan.doc_bytes, np.int64),
            block_length=1,
        )
    if plan.window_bytes is None:
        raise ValueError(f"the {plan.protocol} plan has no per-window byte counts")
    return Units(
        kind="window",
        nll=np.asarray(totals.window_nll, np.float64),
        tokens=np.asarray(totals.window_tokens, np.int64),
        bytes=np.asarray(plan.window_bytes, np.int64),
        block_length=block_length(int(totals.window_nll.size)),
    )


def _replicate_sums(units: Units, columns: np.ndarray, samples: int, seed: int) -> np.ndarray:
    """`[samples, C] float64`: the columns (`[U, C]`, per-unit values) summed over each
    replicate's draw of units (documents, or blocks of windows, circular)."""
    b = units.block_length
    if b > 1:  # per-block sums: block s holds units s .. s+b-1, modulo U (circular)
        ring = np.concatenate([columns, columns[: b - 1]], axis=0)
        columns = np.lib.stride_tricks.sliding_window_view(ring, b, axis=0).sum(axis=-1)
    starts, draws = columns.shape[0], math.ceil(units.count / b)
    rng = np.random.default_rng(seed)
    out = np.empty((samples, columns.shape[1]), np.float64)
    # Samples per chunk: the gathered `[step, draws, C]` stays near `_CHUNK * 6` values. (The
    # draws do not depend on the chunking: `integers` takes one 64-bit draw after another.)
    step = max(1, _CHUNK // draws // max(1, columns.shape[1] // 6))
    for lo in range(0, samples, step):
        hi = min(samples, lo + step)
        picks = rng.integers(0, starts, size=(hi - lo, draws))
        out[lo:hi] = columns[picks].sum(axis=1)
    return out


def _percentiles(values: np.ndarray) -> list[float]:
    lo, hi = np.quantile(values, [(1 - LEVEL) / 2, (1 + LEVEL) / 2])
    return [float(lo), float(hi)]


def _check(units: Units) -> None:
    if units.count < 2:
        raise DataError(
            f"a bootstrap interval needs at least two {units.kind}s to resample, and the run "
            f"has {units.count}; score more text or set metrics.bootstrap_samples=0."
        )


def intervals(units: Units, samples: int, seed: int) -> dict[str, Any] | None:
    """The 95% bootstrap intervals of a run's NLL per token, perplexity and bits per byte.

    Args:
      units: from `units_of`.
      samples: bootstrap replicates (0: no intervals).
      seed: of `numpy.random.default_rng`.

    Returns:
      None for `samples == 0`, else `{"method", "samples", "seed", "level", "units" (how many),
      "unit", "block_length", "nll_per_token" (nats), "perplexity", "bits_per_byte",
      "warning"}`, each interval a `[lo, hi]` list of float64 values; `warning` None, or a
      sentence saying why the interval is not to be trusted and what to do (`warning_of`).

    Raises:
      DataError: fewer than two units.
    """
    if samples == 0:
        return None
    _check(units)
    cols = np.stack([units.nll, units.tokens, units.bytes], axis=1).astype(np.float64)
    sums = _replicate_sums(units, cols, samples, seed)
    nll_per_token = _percentiles(sums[:, 0] / sums[:, 1])
    bits_per_byte = _percentiles(sums[:, 0] / sums[:, 2] / LN2)
    total = cols.sum(axis=0)
    estimates = {
        "NLL per token": (total[0] / total[1], nll_per_token),
        "bits per byte": (total[0] / total[2] / LN2, bits_per_byte),
    }
    return {
        "method": units.method,
        "samples": samples,
        "seed": seed,
        "level": LEVEL,
        "unit": units.kind,
        "units": units.count,
        "block_length": units.block_length,
        "nll_per_token": nll_per_token,
        "perplexity": [_exp(v) for v in nll_per_token],
        "bits_per_byte": bits_per_byte,
        "warning": warning_of(units, estimates),
    }


def warning_of(units: Units, estimates: dict[str, tuple[float, list[float]]]) -> str | None:
    """Why a run's intervals are not to be trusted, and what to do; None when nothing is wrong.

    Two reasons: fewer than `MIN_BLOCKS` independent pieces (documents; or windows over the
    block length: three windows in blocks of two are 1.5), too few for the percentile bootstrap
    to hold its level; and an interval that does not contain its estimate.

    Args:
      units: the run's units.
      estimates: a metric's name -> (its point estimate, its `[lo, hi]` interval).
    """
    problems = []
    pieces = units.count / units.block_length
    if pieces < MIN_BLOCKS:
        if units.kind == "document":
            what, needed, fix = f"{units.count} documents", "documents", "score more documents"
        else:
            what = f"{units.count} windows ({pieces:.3g} blocks of {units.block_length})"
            needed = "blocks"
            fix = "score more text (more documents), or more, shorter windows (eval.seq_len)"
        problems.append(
            f"{what} are too few for the bootstrap to hold its 95% (it needs at least "
            f"{MIN_BLOCKS} {needed}); {fix}"
        )
    for name, (estimate, (lo, hi)) in estimates.items():
        slack = 1e-12 * max(abs(lo), abs(hi), 1.0)
        if not lo - slack <= estimate <= hi + slack:
            problems.append(
                f"the {name} interval [{lo:.6g}, {hi:.6g}] does not contain its estimate "
                f"{estimate:.6g}"
            )
    if not problems:
        return None
    return "rough interval: " + "; ".join(problems) + "."


def curve_intervals(
    nll: np.ndarray, tokens: np.ndarray, samples: int, seed: int, block_length: int = 1
) -> list[list[float] | None]:
    """95% bootstrap intervals of perplexity for each point of a curve, from per-unit sums.

    Each replicate draws units (or blocks of `block_length` consecutive units: the moving-block
    bootstrap, as `intervals` does for windows) with replacement, sums every column's NLL and
    tokens over them and takes their ratio, as the point estimate is taken; the interval is the
    2.5th and 97.5th percentiles of `exp` of that ratio over the replicates in which the column
    has a token (the percentile interval, Efron & Tibshirani ch. 13).

    Args:
      nll: `[U, K] float64`, nats: NLL summed per unit (a batch of windows, a window) and point
        of the curve (a position bucket, a context length).
      tokens: `[U, K]` int, the scored targets counted there.
      samples: replicates (at least 1); seed: of `numpy.random.default_rng`.
      block_length: units per resampled block (1: units resampled one by one).

    Returns:
      per point, `[lo, hi]` perplexity (float64; inf where exp overflows), or None where fewer
      than two units hold a token of that point (nothing to resample).

    Raises:
      ValueError: arrays of other shapes than `[U, K]` and `[U, K]`, or no unit.
    """
    nll = np.asarray(nll, np.float64)
    tokens = np.asarray(tokens, np.float64)
    if nll.ndim != 2 or nll.shape != tokens.shape or nll.shape[0] == 0:
        raise ValueError(f"per-unit sums of shapes {nll.shape}, {tokens.shape}: need [U, K] twice")
    u, k = nll.shape
    block = max(1, min(int(block_length), u))
    units = Units("window", nll[:, 0], tokens[:, 0], tokens[:, 0], block)
    sums = _replicate_sums(units, np.concatenate([nll, tokens], axis=1), samples, seed)
    out: list[list[float] | None] = []
    for j in range(k):
        if int(np.count_nonzero(tokens[:, j])) < 2:
            out.append(None)
            continue
        have = sums[:, k + j] > 0
        ratio = sums[have, j] / sums[have, k + j]
        out.append([_exp(v) for v in _percentiles(ratio)])
    return out


def _exp(x: float) -> float:
    try:
        return math.exp(x)
    except OverflowError:
        return math.inf


def paired_difference(a: Units, b: Units, samples: int, seed: int) -> dict[str, Any]:
    """B minus A in bits per byte and NLL per token, with paired 95% bootstrap intervals: each
    replicate draws the same units (documents, or blocks of windows) for both runs.

    Args:
      a, b: the two runs' units, of the same data (`check_same_units`).
      samples: replicates (at least 1); seed: of `numpy.random.default_rng`.

    Returns:
      `{"method", "samples", "seed", "level", "unit", "units", "block_length",
      "a"/"b": {"bits_per_byte", "nll_per_token"}, "bits_per_byte"/"nll_per_token":
      {"difference": B - A, "interval": [lo, hi]}}`; NLL per token in nats.

    Raises:
      DataError: fewer than two units.
    """
    _check(a)
    cols = np.stack([a.nll, a.tokens, a.bytes, b.nll, b.tokens, b.bytes], axis=1)
    sums = _replicate_sums(a, cols.astype(np.float64), samples, seed)
    totals = cols.astype(np.float64).sum(axis=0)  # the runs' own (point) sums

    def ratios(s: np.ndarray) -> tuple[Any, Any, Any, Any]:  # bpb A, NLL/token A, bpb B, ...
        return (
            s[..., 0] / s[..., 2] / LN2,
            s[..., 0] / s[..., 1],
            s[..., 3] / s[..., 5] / LN2,
            s[..., 3] / s[..., 4],
        )

    bpb_a, npt_a, bpb_b, npt_b = ratios(totals)
    r_bpb_a, r_npt_a, r_bpb_b, r_npt_b = ratios(sums)
    return {
        "method": a.method,
        "samples": samples,
        "seed": seed,
        "level": LEVEL,
        "unit": a.kind,
        "units": a.count,
        "block_length": a.block_length,
        "a": {"bits_per_byte": float(bpb_a), "nll_per_token": float(npt_a)},
        "b": {"bits_per_byte": float(bpb_b), "nll_per_token": float(npt_b)},
        "bits_per_byte": {
            "difference": float(bpb_b - bpb_a),
            "interval": _percentiles(r_bpb_b - r_bpb_a),
        },
        "nll_per_token": {
            "difference": float(npt_b - npt_a),
            "interval": _percentiles(r_npt_b - r_npt_a),
        },
    }


def identity_of(fingerprint: dict[str, Any], tokens_digest: str | None = None) -> dict[str, Any]:
    """What decides the units of a run, from its fingerprint (`ppl_jax.runtime.fingerprint`): the
    protocol, the data settings and files, and the tokenizer; and, when given, `tokens_digest`,
    the content digest of the scored token stream (`scored_digest`), which `compare` checks so
    that two runs on other text with the same byte counts are not paired."""
    out = {name: fingerprint.get(name) for name in ("protocol", "data", "tokenizer")}
    if tokens_digest is not None:
        out["tokens_digest"] = tokens_digest
    return out


def scored_digest(tokens: np.ndarray, chunk: int = 1 << 22) -> str:
    """SHA-256 (hex) of a token stream (`[n]` integer ids) as int32 bytes, read `chunk` tokens
    at a time: the definition of `ppl_jax.plans.protocols.tokens_digest` (a plan's
    `tokens_digest`, when it has one, is this digest of its stream). About 1.5 s per GB of ids
    on one core."""
    h = hashlib.sha256()
    for at in range(0, tokens.size, chunk):
        h.update(np.ascontiguousarray(tokens[at : at + chunk], np.int32).tobytes())
    return h.hexdigest()


def to_npz(units: Units, identity: dict[str, Any]) -> bytes:
    """`units.npz`: the per-unit sums and what they were scored on (`identity`, JSON-able:
    protocol and data settings, tokenizer, the scored tokens' digest), for
    `ppl_jax.analysis.compare`. No pickled objects."""
    buf = io.BytesIO()
    np.savez(
        buf,
        kind=np.asarray(units.kind),
        nll=units.nll.astype(np.float64),
        tokens=units.tokens.astype(np.int64),
        bytes=units.bytes.astype(np.int64),
        block_length=np.asarray(units.block_length, np.int64),
        identity=np.asarray(json.dumps(identity, sort_keys=True)),
    )
    return buf.getvalue()


def units_npz(ev: Any) -> bytes:
    """`units.npz` of an `Evaluation`: its units and identity (`to_npz`), with the digest of
    the plan's token stream (the plan's own `tokens_digest` when it has one, else computed),
    and the checkpoint `step` and `dataset` name it holds (how `ppl-jax compare` finds a step
    of a sweep or a dataset of a suite)."""
    plan = ev.plan
    digest = getattr(plan, "tokens_digest", None) or scored_digest(plan.windows.tokens)
    identity = identity_of(ev.fingerprint, digest)
    identity.update(step=ev.step, dataset=ev.dataset.name)
    return to_npz(units_of(plan, ev.totals), identity)


def read_identity(path: str) -> dict[str, Any]:
    """The identity of a `units.npz` alone (its arrays are not read).

    Raises:
      DataError: as `read_npz`.
    """
    try:
        with np.load(path, allow_pickle=False) as z:
            identity = json.loads(str(z["identity"]))
    except (OSError, KeyError, ValueError, EOFError, zipfile.BadZipFile, zlib.error) as e:
        raise DataError(
            f"{path} is not a readable units file ({type(e).__name__}: {e}); it may be truncated "
            f"or damaged: score that run again to write it."
        ) from None
    if not isinstance(identity, dict):
        raise DataError(f"{path} holds no identity object; score that run again to write it.")
    return identity


def read_npz(path: str) -> tuple[Units, dict[str, Any]]:
    """Reads a `units.npz` written by `to_npz`.

    Raises:
      DataError: the file is missing, damaged or not a units file.
    """
    try:
        with np.load(path, allow_pickle=False) as z:
            units = Units(
                kind=str(z["kind"]),
                nll=z["nll"].astype(np.float64),
                tokens=z["tokens"].astype(np.int64),
                bytes=z["bytes"].astype(np.int64),
                block_length=int(z["block_length"]),
            )
            identity = json.loads(str(z["identity"]))
    except FileNotFoundError:
        raise DataError(
            f"{path} does not exist; the run that wrote the results predates per-unit sums, "
            f"run it again."
        ) from None
    except (OSError, KeyError, ValueError, EOFError, zipfile.BadZipFile, zlib.error) as e:
        raise DataError(
            f"{path} is not a readable units file ({type(e).__name__}: {e}); it may be truncated "
            f"or damaged: score that run again to write it."
        ) from None
    if not isinstance(identity, dict):
        raise DataError(f"{path} holds no identity object; score that run again to write it.")
    if units.kind not in METHODS:
        raise DataError(f"{path} holds units of unknown kind {units.kind!r}; run it again.")
    return units, identity
