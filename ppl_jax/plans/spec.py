"""`ProtocolSpec` (which tokens are scored, with what context) and `BatchSpec` (how windows are
laid into fixed-shape batches): the plans layer's settings, checked when made.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from ppl_jax.errors import ConfigError
from ppl_jax.plans import protocols
from ppl_jax.plans.protocols import Protocol
from ppl_jax.plans.protocols.whole_documents import LONG_DOCUMENTS

MAX_LENGTH_BUCKETS = 8


@dataclasses.dataclass(frozen=True)
class ProtocolSpec:
    """A scoring protocol (see `ppl_jax.plans.protocols` for each convention and its source).

    Attributes:
      name: a name of `ppl_jax.plans.protocols.PROTOCOLS` (its object: `convention`); the
        setting `eval.protocol`.
      seq_len: tokens the model reads per window (at least 1).
      stride: tokens a window advances by, 1..seq_len, for the strided protocols; None there
        means seq_len // 2 (at least 1). Always None for the other protocols (they use none).
      add_bos: 'auto' (the tokenizer's own policy), 'true' or 'false'.
      long_documents: the rule for a document longer than a window, for the protocols that
        score documents whole (`Protocol.splits_documents`): '' (none: such a document is
        refused), 'sliding' (windows every `stride` tokens within it) or 'truncate' (its first
        window only). Refused with the other protocols.
      where: the setting's name in error messages ('eval', 'suite[2]'); not compared.

    Raises:
      ConfigError: a value out of range, naming the setting.
    """

    name: str = protocols.SLIDING.name
    seq_len: int = 256
    stride: int | None = None
    add_bos: str = "auto"
    long_documents: str = ""
    where: str = dataclasses.field(default="eval", compare=False, repr=False)

    def __post_init__(self) -> None:
        w = self.where
        protocols.get(self.name, w)
        add_bos = str(self.add_bos).lower()
        if add_bos not in ("auto", "true", "false"):
            raise ConfigError(f"{w}.add_bos={add_bos!r} is not one of auto, true, false.")
        object.__setattr__(self, "add_bos", add_bos)
        seq_len = int(self.seq_len)
        if seq_len < 1:
            raise ConfigError(f"{w}.seq_len={seq_len} must be at least 1.")
        object.__setattr__(self, "seq_len", seq_len)
        self._check_long_documents()
        object.__setattr__(self, "stride", self._stride())

    @property
    def convention(self) -> Protocol:
        """The protocol's object (`ppl_jax.plans.protocols.Protocol`): its convention of which
        tokens are scored with what context. Ask it, not the name."""
        return protocols.PROTOCOLS[self.name]

    @property
    def options(self) -> dict[str, str]:
        """The keywords of the protocol's `plan` and `stream_plan` beyond the common ones."""
        return {"long_documents": self.long_documents} if self.long_documents else {}

    def _check_long_documents(self) -> None:
        rule = str(self.long_documents or "")
        object.__setattr__(self, "long_documents", rule)
        if not rule:
            return
        if not self.convention.splits_documents:
            names = [n for n, p in protocols.PROTOCOLS.items() if p.splits_documents]
            raise ConfigError(
                f"{self.where}.long_documents={rule!r} is the rule of the protocols that score "
                f"documents whole ({', '.join(names)}); {self.name} cuts its own windows. "
                f"Unset it, or use one of those."
            )
        if rule not in LONG_DOCUMENTS:
            raise ConfigError(
                f"{self.where}.long_documents={rule!r} is not one of {', '.join(LONG_DOCUMENTS)} "
                f"(or unset: a document longer than a window is refused)."
            )

    def fingerprint_part(self) -> dict[str, Any]:
        """The protocol's settings that decide a run's numbers, as used (its part of the run's
        fingerprint; the plan adds what it resolved: BOS, prefix, windows)."""
        return {
            "name": self.name,
            "seq_len": self.seq_len,
            "stride": self.stride,
            **self.options,
        }

    def _stride(self) -> int | None:
        """The stride as used: unset is seq_len // 2 (at least 1); None where the protocol has
        none (or, for a protocol that scores documents whole, where no long document is split
        into sliding windows). Only a stride that is used is checked; a stride never set never
        fails."""
        if not (self.convention.strided or self.long_documents == "sliding"):
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
