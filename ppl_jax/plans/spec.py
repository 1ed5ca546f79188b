"""`ProtocolSpec` (which tokens are scored, with what context) and `BatchSpec` (how windows are
laid into fixed-shape batches): the plans layer's settings, checked when made.
"""

from __future__ import annotations

import dataclasses

from ppl_jax.errors import ConfigError
from ppl_jax.plans import protocols
from ppl_jax.plans.protocols import Protocol

MAX_LENGTH_BUCKETS = 8


@dataclasses.dataclass(frozen=True)
class ProtocolSpec:
    """A scoring protocol (see `ppl_jax.plans.protocols` for each convention and its source).

    Attributes:
      protocol: a name of `ppl_jax.plans.protocols.PROTOCOLS` (its object: `rules`).
      seq_len: tokens the model reads per window (at least 1).
      stride: tokens a window advances by, 1..seq_len, for the strided protocols; None there
        means seq_len // 2 (at least 1). Always None for the other protocols (they use none).
      add_bos: 'auto' (the tokenizer's own policy), 'true' or 'false'.
      where: the setting's name in error messages ('eval', 'suite[2]'); not compared.

    Raises:
      ConfigError: a value out of range, naming the setting.
    """

    protocol: str = protocols.SLIDING.name
    seq_len: int = 256
    stride: int | None = None
    add_bos: str = "auto"
    where: str = dataclasses.field(default="eval", compare=False, repr=False)

    def __post_init__(self) -> None:
        w = self.where
        protocols.get(self.protocol, w)
        add_bos = str(self.add_bos).lower()
        if add_bos not in ("auto", "true", "false"):
            raise ConfigError(f"{w}.add_bos={add_bos!r} is not one of auto, true, false.")
        object.__setattr__(self, "add_bos", add_bos)
        seq_len = int(self.seq_len)
        if seq_len < 1:
            raise ConfigError(f"{w}.seq_len={seq_len} must be at least 1.")
        object.__setattr__(self, "seq_len", seq_len)
        object.__setattr__(self, "stride", self._stride())

    @property
    def rules(self) -> Protocol:
        """The protocol's object (`ppl_jax.plans.protocols.Protocol`): ask it, not the name."""
        return protocols.PROTOCOLS[self.protocol]

    def _stride(self) -> int | None:
        """The stride as used: unset is seq_len // 2 (at least 1); None where the protocol has
        none. Only a stride that a protocol uses is checked; a stride never set never fails."""
        if not self.rules.strided:
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
