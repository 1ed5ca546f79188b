"""Sufficient statistics of an evaluation, and the metrics derived from them, on the host.

Everything here is host-side float64/int64 arithmetic. The device returns sums (never means);
they are merged here exactly, and divided once at the end.

Formulas (Jurafsky & Martin, *Speech and Language Processing*, 3rd ed., ch. 3; Graves 2013 for
bits per character/byte):

- perplexity      = exp(nll_sum / num_tokens)
- bits per token  = nll_sum / (num_tokens * ln 2)
- bits per byte   = nll_sum / (num_bytes * ln 2)        (weighted by bytes, not tokens)
- byte perplexity = exp(nll_sum / num_bytes)  = 2 ** bits_per_byte
- word perplexity = exp(nll_sum / num_words)

`nll_sum` is the negative log-likelihood in nats summed over every scored token; `num_bytes` and
`num_words` count the UTF-8 bytes and whitespace-separated words of exactly the scored text.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Iterator, Mapping, Sequence

import numpy as np

LN2 = math.log(2.0)


@dataclasses.dataclass(frozen=True)
class Sums:
    """Sufficient statistics that merge exactly by addition.

    Attributes:
      nll_sum: negative log-likelihood summed over scored tokens, nats (float64).
      num_tokens: number of scored (predicted) tokens.
      num_bytes: UTF-8 bytes of the scored text.
      num_words: whitespace-separated words of the scored text (`str.split()`).
      num_documents: documents in the corpus.
      num_windows: model windows scored.
      entropy_sum: the model's predictive entropy summed over scored positions, nats.
      num_correct: scored tokens that were the model's top-1 prediction.
    """

    nll_sum: float = 0.0
    num_tokens: int = 0
    num_bytes: int = 0
    num_words: int = 0
    num_documents: int = 0
    num_windows: int = 0
    entropy_sum: float = 0.0
    num_correct: int = 0

    def __add__(self, other: Sums) -> Sums:
        return Sums(
            **{
                f.name: getattr(self, f.name) + getattr(other, f.name)
                for f in dataclasses.fields(self)
            }
        )

    @staticmethod
    def merge(parts: Iterable[Sums]) -> Sums:
        """Adds any number of `Sums` (exact for the integer counts, float64 for `nll_sum`)."""
        total = Sums()
        for part in parts:
            total = total + part
        return total


# (metric, numerator field, denominator field, form): `ratio` is numerator / denominator,
# `bits` the same over ln 2, `exp` exp of the ratio.
_FORMULAS = (
    ("nll_per_token", "nll_sum", "num_tokens", "ratio"),
    ("perplexity", "nll_sum", "num_tokens", "exp"),
    ("bits_per_token", "nll_sum", "num_tokens", "bits"),
    ("bits_per_byte", "nll_sum", "num_bytes", "bits"),
    ("byte_perplexity", "nll_sum", "num_bytes", "exp"),
    ("word_perplexity", "nll_sum", "num_words", "exp"),
    ("entropy_per_token", "entropy_sum", "num_tokens", "ratio"),
    ("predictive_perplexity", "entropy_sum", "num_tokens", "exp"),
    ("top1_accuracy", "num_correct", "num_tokens", "ratio"),
)
_NONE_OF = {"num_tokens": "no scored tokens", "num_bytes": "no bytes", "num_words": "no words"}
_OVERFLOW_HINTS = {
    "num_words": "; the text has few whitespace-separated words for its tokens",
    "num_bytes": "; the model assigns the text almost no probability",
    "num_tokens": "; the model assigns the text almost no probability",
}


class Metrics(Mapping):
    """The derived metrics: a read-only mapping from metric name to value, plus `notes`.

    A value is a finite float; `math.inf` where an exponential overflows float64 (e.g. word
    perplexity of text with few whitespace-separated words: Chinese, base64, minified code); or
    None where it is undefined (a zero denominator, or a non-finite sum). Every inf and None
    has an entry in `notes`, a readable phrase such as `inf (overflow: exp(nll_sum / num_words) =
    exp(4950) exceeds float64; ...)` or `undefined (no words)`; finite values have none.

    Attributes:
      notes: metric name -> the reason its value is inf or None.
    """

    def __init__(self, values: dict[str, float | None], notes: dict[str, str]):
        self._values = dict(values)
        self.notes = dict(notes)

    def __getitem__(self, name: str) -> float | None:
        return self._values[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __repr__(self) -> str:
        return f"Metrics({self._values!r}, notes={self.notes!r})"


def derive(sums: Sums) -> Metrics:
    """Derives the reported metrics from `sums` (see the module docstring for the formulas).

    Never raises: an overflowing exponential is `math.inf`, an undefined value None, each with
    a note (see `Metrics`).

    Returns:
      `Metrics` with `perplexity`, `bits_per_token`, `bits_per_byte`, `byte_perplexity`,
        `word_perplexity`, `nll_per_token` (nats), `entropy_per_token` (nats, the model's mean
        predictive entropy), `predictive_perplexity` (exp of it: the model's own uncertainty,
        distinct from the data perplexity) and `top1_accuracy`.
    """
    values: dict[str, float | None] = {}
    notes: dict[str, str] = {}
    for name, numerator_field, denominator_field, form in _FORMULAS:
        numerator = float(getattr(sums, numerator_field))
        denominator = int(getattr(sums, denominator_field))
        if denominator <= 0:
            values[name], notes[name] = None, f"undefined ({_NONE_OF[denominator_field]})"
            continue
        if not math.isfinite(numerator):
            values[name], notes[name] = None, f"undefined ({numerator_field} is {numerator})"
            continue
        ratio = numerator / denominator
        if form == "ratio":
            values[name] = ratio
        elif form == "bits":
            values[name] = ratio / LN2
        else:
            try:
                values[name] = math.exp(ratio)
            except OverflowError:
                values[name] = math.inf
                hint = _OVERFLOW_HINTS[denominator_field] if numerator_field == "nll_sum" else ""
                notes[name] = (
                    f"inf (overflow: exp({numerator_field} / {denominator_field}) = "
                    f"exp({ratio:.6g}) exceeds float64{hint})"
                )
    return Metrics(values, notes)


def perplexity_of_probabilities(probabilities: Sequence[float]) -> float | None:
    """Perplexity of a sequence given the model's probability of each token.

    Args:
      probabilities: P(token_i | context), each in (0, 1].

    Returns:
      exp(-mean(log p)), the geometric-mean inverse probability; None for no probabilities.
    """
    p = np.asarray(probabilities, dtype=np.float64)
    nll = -np.log(p)
    return derive(Sums(nll_sum=float(nll.sum()), num_tokens=int(p.size)))["perplexity"]


GZIP_SAMPLE_BYTES = 64 * 2**20  # the gzip baseline reads at most this much of the text


def gzip_bits_per_byte(raw: bytes) -> float:
    """Bits per byte that `gzip -9` reaches on `raw`: 8 * len(gzip(raw, level 9)) / len(raw).

    A compression baseline for bits per byte (the gzip container's 18-byte header and trailer
    included, as for a file written by `gzip -9`).
    """
    import gzip

    return 8.0 * len(gzip.compress(raw, compresslevel=9, mtime=0)) / len(raw)


def gzip_bits_per_byte_of(
    texts: Iterable[str], separator: str, limit: int = GZIP_SAMPLE_BYTES
) -> tuple[float, int]:
    """`gzip_bits_per_byte` of `separator.join(texts)` encoded as UTF-8, or of its first `limit`
    bytes, compressed as a stream (never the whole text in memory).

    Returns:
      (bits per byte, the bytes compressed: the whole text's, or `limit` for a sample).
    """
    import gzip
    import io

    sink = io.BytesIO()
    seen = 0
    with gzip.GzipFile(fileobj=sink, mode="wb", compresslevel=9, mtime=0) as z:
        sep = separator.encode("utf-8")
        for i, text in enumerate(texts):
            for part in ((sep,) if i else ()) + (text.encode("utf-8"),):
                part = part[: limit - seen]
                z.write(part)
                seen += len(part)
            if seen >= limit:
                break
    return 8.0 * len(sink.getvalue()) / seen, seen
