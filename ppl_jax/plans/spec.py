"""`ProtocolSpec` (which tokens are scored, with what context) and `BatchSpec` (how windows are
laid into fixed-shape batches): the plans layer's settings, checked when made.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from ppl_jax.errors import ConfigError

PROTOCOLS = ("sliding", "hf_strided", "lm_eval_rolling", "gptq_chunks")
STRIDED_PROTOCOLS = ("sliding", "hf_strided")  # the protocols that use a stride
# One line per protocol: the convention each reproduces (`--help`, and results.json's reference).
PROTOCOL_NOTES = {
    "sliding": "ppl_jax native: every token after the first scored once, stride windows",
    "hf_strided": "Hugging Face 'Perplexity of fixed-length models' strided recipe",
    "lm_eval_rolling": "lm-evaluation-harness loglikelihood_rolling, per document",
    "gptq_chunks": "GPTQ/AWQ: n // seq_len disjoint chunks, tail dropped",
}
MAX_LENGTH_BUCKETS = 8


@dataclasses.dataclass(frozen=True)
class ProtocolSpec:
    """A scoring protocol (see `ppl_jax.plans.protocols` for each convention and its source).

    Attributes:
      protocol: 'sliding', 'hf_strided', 'lm_eval_rolling' or 'gptq_chunks'.
      seq_len: tokens the model reads per window (at least 1).
      stride: tokens a window advances by, 1..seq_len, for the strided protocols; None there
        means seq_len // 2 (at least 1). Always None for the other protocols (they use none).
      add_bos: 'auto' (the tokenizer's own policy), 'true' or 'false'.
      where: the setting's name in error messages ('eval', 'suite[2]'); not compared.

    Raises:
      ConfigError: a value out of range, naming the setting.
    """

    protocol: str = "sliding"
    seq_len: int = 256
    stride: int | None = None
    add_bos: str = "auto"
    where: str = dataclasses.field(default="eval", compare=False, repr=False)

    def __post_init__(self) -> None:
        w = self.where
        if self.protocol not in PROTOCOLS:
            raise ConfigError(
                f"{w}.protocol={self.protocol!r} is not one of {', '.join(PROTOCOLS)}."
            )
        add_bos = str(self.add_bos).lower()
        if add_bos not in ("auto", "true", "false"):
            raise ConfigError(f"{w}.add_bos={add_bos!r} is not one of auto, true, false.")
        object.__setattr__(self, "add_bos", add_bos)
        seq_len = int(self.seq_len)
        if seq_len < 1:
            raise ConfigError(f"{w}.seq_len={seq_len} must be at least 1.")
        object.__setattr__(self, "seq_len", seq_len)
        object.__setattr__(self, "stride", self._stride())

    def fingerprint_part(self) -> dict[str, Any]:
        """The protocol's settings that decide a run's numbers, as used (its part of the run's
        fingerprint; the plan adds what it resolved: BOS, prefix, windows)."""
        return {"name": self.protocol, "seq_len": self.seq_len, "stride": self.stride}

    def _stride(self) -> int | None:
        """The stride as used: unset is seq_len // 2 (at least 1); None where the protocol has
        none. Only a stride that a protocol uses is checked; a stride never set never fails."""
        if self.protocol not in STRIDED_PROTOCOLS:
            return None
        if self.stride is None:
            return max(self.seq_len // 2, 1)
        stride = int(self.stride)
        if not 1 <= stride <= self.seq_len:
            raise ConfigError(
                f"eval.stride={stride} is outside 1..eval.seq_len ({self.seq_len}); a stride of "
                f"seq_len scores disjoint windows, a smaller one gives each token more context."
            )
        return stride


@dataclasses.dataclass(frozen=True)
class BatchSpec:
    """How windows fill a step's fixed-shape batch (`ppl_jax.plans.layout`).

    Attributes:
      batch_size: rows per step, global over all processes; a multiple of the mesh's `data` axis.
      packing: several short windows per row (segments, no attention across them).
      length_buckets: row widths a run may compile, 1..8 (1: every row is seq_len + 1).

    Raises:
      ConfigError: a value out of range, naming the setting.
    """

    batch_size: int = 8
    packing: bool = True
    length_buckets: int = 1

    def __post_init__(self) -> None:
        if int(self.batch_size) < 1:
            raise ConfigError(f"eval.batch_size={self.batch_size} must be at least 1.")
        if not 1 <= int(self.length_buckets) <= MAX_LENGTH_BUCKETS:
            raise ConfigError(
                f"eval.length_buckets={self.length_buckets} must be between 1 and "
                f"{MAX_LENGTH_BUCKETS}."
            )
        object.__setattr__(self, "batch_size", int(self.batch_size))
        object.__setattr__(self, "length_buckets", int(self.length_buckets))
        object.__setattr__(self, "packing", bool(self.packing))

    def fingerprint_part(self) -> dict[str, Any]:
        """The layout's settings (its part of the run's fingerprint; every batch's sums depend
        on which windows share it and on its shape)."""
        return {
            "batch_size": self.batch_size,
            "packing": self.packing,
            "length_buckets": self.length_buckets,
        }
