"""The one checkpoint opener: which weights, which architecture, which tokenizer, which steps.

`open_checkpoint(path)` recognises the layout of a checkpoint directory and returns a
`Checkpoint`, which answers every question the evaluation asks of it, whatever the layout:

- `orbax`: an Orbax `CheckpointManager` directory of numbered steps, each with the training
  state and its metadata (`ppl_jax.checkpoints.orbax`);
- `hf`: a Hugging Face directory, `config.json` and safetensors weights, one set of weights
  (`ppl_jax.checkpoints.hf`).

A reference model (KL diagnostics) is a second `Checkpoint`. Nothing here reads a weight before
`restore`, which places each one straight into its target sharding.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

import jax.numpy as jnp

from ppl_jax.checkpoints import hf, orbax
from ppl_jax.errors import CheckpointError, ConfigError
from ppl_jax.models import attention as attention_lib
from ppl_jax.models import nnx as nnx_lib
from ppl_jax.models.interface import LanguageModel
from ppl_jax.runtime import paths
from ppl_jax.tokenizer import base as tokenizer_lib

DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}
FORMATS = ("auto", "orbax", "hf")


def open_checkpoint(path: str, format: str = "auto") -> Checkpoint:
    """Opens the checkpoint directory `path` (local, or remote: see `ppl_jax.runtime.paths`).

    Args:
      path: the directory.
      format: `orbax`, `hf`, or `auto`: `hf` when the directory holds a `config.json`, else
        `orbax`.

    Returns:
      A `Checkpoint`; only the format was read (and, for `hf`, nothing of the weights).

    Raises:
      ConfigError: an unknown format; a remote path whose filesystem package is missing.
      CheckpointError: no such directory, in the words of the format's own reader (an Orbax
        directory: "checkpoint.dir: no such directory ..."; a Hugging Face one: its config.json
        is missing).
    """
    if format not in FORMATS:
        raise ConfigError(f"checkpoint.format={format!r} is not one of {', '.join(FORMATS)}.")
    try:
        found = paths.isdir(path)
        if format == "auto":
            format = "hf" if paths.isfile(paths.join(path, "config.json")) else "orbax"
    except ImportError as e:
        raise paths.missing_backend(path, e) from None
    if not found:  # each reader's own message for a missing directory
        if format == "hf":
            hf.read_description(path)
        else:
            orbax.finalized_steps(path)
    return Checkpoint(path, format)


@dataclasses.dataclass
class Checkpoint:
    """An opened checkpoint directory (see `open_checkpoint`).

    Steps are Orbax's finalized steps (saves that committed); a Hugging Face directory has one set
    of weights and its step is None throughout. `step=None` in any method means the latest
    finalized step, looked up anew on each call (a training run may finalize more). What a
    finalized step stores does not change, so its metadata is read once per `Checkpoint`.

    Attributes:
      path: the directory, as given.
      format: `orbax` or `hf`.
    """

    path: str
    format: str
    _metadata: dict[int, dict[str, Any]] = dataclasses.field(
        default_factory=dict, init=False, repr=False, compare=False
    )

    def steps(self) -> list[int]:
        """The finalized steps, ascending; `[]` for a Hugging Face directory.

        Raises:
          CheckpointError: the directory is gone.
        """
        return [] if self.format == "hf" else orbax.finalized_steps(self.path)

    def _read(self, step: int | None) -> tuple[int, dict[str, Any]]:
        """The resolved step and its stored metadata (`model`, `tokenizer`)."""
        if step is not None and step in self._metadata:
            return step, self._metadata[step]
        chosen, meta = orbax.read_metadata(self.path, step)
        self._metadata[chosen] = meta
        return chosen, meta

    def resolve_step(self, step: int | None) -> int | None:
        """`step` checked against the finalized steps, or the latest for None; None for `hf`.

        Raises:
          CheckpointError: as `ppl_jax.checkpoints.orbax.read_metadata` (no finalized step, a
            step that is not one, a step without metadata).
        """
        return None if self.format == "hf" else self._read(step)[0]

    def description(self, step: int | None = None) -> dict[str, Any]:
        """The architecture description (`ppl_jax.models.interface.build`'s argument): the stored
        `metadata["model"]` of the step (as saved, not normalized), or `hf.read_description`.

        Raises:
          CheckpointError: as `resolve_step`, or a missing or unsupported `config.json`.
        """
        if self.format == "hf":
            return hf.read_description(self.path)
        return copy.deepcopy(self._read(step)[1]["model"])

    def attention(self, setting: str, dtype: str, step: int | None = None) -> str:
        """The attention implementation that `model.attention=setting` runs for this architecture
        in `dtype` (`float32` or `bfloat16`) on this platform: `xla`, `cudnn` or `splash`
        (`ppl_jax.models.attention.resolve_for`).

        Raises:
          ConfigError: an unknown dtype. CheckpointError: as `description`.
        """
        return attention_lib.resolve_for(setting, _dtype(dtype), self.description(step))

    def model(
        self, dtype: str = "float32", attention: str = "auto", step: int | None = None
    ) -> LanguageModel:
        """The model (abstract params, no weights) of the step's architecture.

        Args:
          dtype: the params' dtype, `float32` or `bfloat16`.
          attention: an implementation (`xla`, `cudnn`, `splash`; what `attention()` resolved)
            or `auto`, resolved here in the same way.
          step: as in `resolve_step`.

        Raises:
          ConfigError: an unknown dtype. CheckpointError: as `description`, or a description of
            an unknown family or with unknown keys.
        """
        description = self.description(step)
        resolved = attention_lib.resolve_for(attention, _dtype(dtype), description)
        return nnx_lib.build(description, _dtype(dtype), resolved)

    def tokenizer(self, step: int | None = None) -> tokenizer_lib.Tokenizer | None:
        """The checkpoint's own tokenizer (BOS/EOS ids and policy included), or None when it
        stores none: `hf.load_tokenizer` of a Hugging Face directory with `tokenizer.json` or
        `tokenizer.model`; the tokenizer described in an Orbax step's metadata.

        Raises:
          CheckpointError: an unreadable tokenizer file, or as `resolve_step`. ConfigError: a
            stored description of an unknown type.
        """
        if self.format == "hf":
            return hf.load_tokenizer(self.path) if hf.has_tokenizer(self.path) else None
        description = self.tokenizer_description(step)
        return tokenizer_lib.from_description(description) if description else None

    def tokenizer_description(self, step: int | None = None) -> dict[str, Any] | None:
        """An Orbax step's stored tokenizer description (`Tokenizer.describe()` output, what
        `ppl_jax.tokenizer.base.load(spec, description)` takes), or None when it stores none. A
        Hugging Face directory stores files, not a description: None (use `tokenizer()`).

        Raises:
          CheckpointError: as `resolve_step`.
        """
        if self.format == "hf":
            return None
        return copy.deepcopy(self._read(step)[1].get("tokenizer")) or None

    def restore(self, step: int | None, target: Any) -> Any:
        """The params of the step, read straight into their target shardings.

        Args:
          step: as in `resolve_step` (ignored for `hf`).
          target: the params tree of `self.model(...)`, with leaves
            `jax.ShapeDtypeStruct(shape, dtype, sharding=...)` (`ppl_jax.runtime.mesh
            .param_targets`); stored weights are cast to each leaf's dtype.

        Returns:
          The params tree of `jax.Array`s, each of its leaf's shape, dtype and sharding.

        Raises:
          CheckpointError: a missing, misshapen or damaged weight, named
            (`ppl_jax.checkpoints.orbax.restore_params`, `ppl_jax.checkpoints.hf.load_params`).
        """
        if self.format == "hf":
            return hf.load_params(self.path, target)
        return orbax.restore_params(self.path, self.resolve_step(step), target)

    def check_same_architecture(self, step: int | None, model: LanguageModel) -> None:
        """Checks that `step` stores the architecture of `model` (a sweep scores one model).

        The stored description is normalized as `model.description` was (through `build`: the
        family config's `from_dict`/`to_dict`), so that metadata saved without a key that has
        its default value is the same architecture as one saved with it.

        Raises:
          CheckpointError: another architecture; or as `description` and `build`.
        """
        stored = nnx_lib.build(self.description(step), jnp.float32, "xla").description
        if stored != model.description:
            raise CheckpointError(
                f"step {step} of {self.path!r} holds another architecture than the model being "
                f"scored; a sweep scores the steps of one model."
            )


def _dtype(name: str) -> Any:
    if name not in DTYPES:
        raise ConfigError(f"model.dtype={name!r} is not one of {', '.join(DTYPES)}.")
    return DTYPES[name]
