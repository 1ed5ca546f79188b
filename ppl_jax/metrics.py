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
from collections.abc import Iterable, Sequence

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


def _ratio(numerator: float, denominator: int) -> float:
    return numerator / denominator if denominator > 0 else math.nan


def derive(sums: Sums) -> dict[str, float]:
    """Derives the reported metrics from `sums` (see the module docstring for the formulas).

    Returns:
      A dict with `perplexity`, `bits_per_token`, `bits_per_byte`, `byte_perplexity`,
      `word_perplexity`, `nll_per_token` (nats), `entropy_per_token` (nats, the model's mean
      predictive entropy), `predictive_perplexity` (exp of it: the model's own uncertainty,
      distinct from the data perplexity) and `top1_accuracy`. A metric whose denominator is
      zero is NaN.
    """
    nll = float(sums.nll_sum)
    nll_per_token = _ratio(nll, sums.num_tokens)
    nll_per_byte = _ratio(nll, sums.num_bytes)
    nll_per_word = _ratio(nll, sums.num_words)
    return {
        "nll_per_token": nll_per_token,
        "perplexity": math.exp(nll_per_token),
        "bits_per_token": nll_per_token / LN2,
        "bits_per_byte": nll_per_byte / LN2,
        "byte_perplexity": math.exp(nll_per_byte),
        "word_perplexity": math.exp(nll_per_word),
        "entropy_per_token": _ratio(float(sums.entropy_sum), sums.num_tokens),
        "predictive_perplexity": math.exp(_ratio(float(sums.entropy_sum), sums.num_tokens)),
        "top1_accuracy": _ratio(float(sums.num_correct), sums.num_tokens),
    }


def perplexity_of_probabilities(probabilities: Sequence[float]) -> float:
    """Perplexity of a sequence given the model's probability of each token.

    Args:
      probabilities: P(token_i | context), each in (0, 1].

    Returns:
      exp(-mean(log p)), the geometric-mean inverse probability.
    """
    p = np.asarray(probabilities, dtype=np.float64)
    nll = -np.log(p)
    return derive(Sums(nll_sum=float(nll.sum()), num_tokens=int(p.size)))["perplexity"]


def gzip_bits_per_byte(raw: bytes) -> float:
    """Bits per byte that `gzip -9` reaches on `raw`: 8 * len(gzip(raw, level 9)) / len(raw).

    A compression baseline for bits per byte (the gzip container's 18-byte header and trailer
    included, as for a file written by `gzip -9`).
    """
    import gzip

    return 8.0 * len(gzip.compress(raw, compresslevel=9, mtime=0)) / len(raw)
