"""ppl_jax's own Orbax checkpoints (`OwnOrbax`): a `CheckpointManager` directory of numbered
steps, each with the items `state` (`{"step", "params", "opt_state"}`), `metadata` (the
architecture and the tokenizer's description) and `checksums` (`ppl_jax.checkpoints.formats.orbax
.save_train_state`). The architecture and tokenizer are the step's own; the params are read by
their own names and checked against the fingerprints saved with them."""

from __future__ import annotations

import copy
from typing import Any

import jax

from ppl_jax import tokenizer as tokenizer_lib
from ppl_jax.checkpoints.checkpoint import Checkpoint, Options, Stored
from ppl_jax.checkpoints.formats import orbax
from ppl_jax.checkpoints.readers import foreign
from ppl_jax.errors import CheckpointError
from ppl_jax.models import registry
from ppl_jax.runtime import paths

PARAMS = "params/"


class OwnOrbax(Checkpoint):
    """ppl_jax's own Orbax checkpoint directory (see the module docstring)."""

    format = "orbax"
    formats = ("orbax",)
    layout_name = "a ppl_jax Orbax checkpoint"
    tokenizer_files = "no tokenizer description in the step's metadata item"

    def __init__(self, path: str, options: Options | None = None, why: str = ""):
        super().__init__(path, options, why)
        self._metadata: dict[int, dict[str, Any]] = {}  # a finalized step's never changes
        self._stored: dict[int, Stored] = {}

    @classmethod
    def claims(cls, path: str, options: Options) -> str | None:
        if options.names_a_tree or foreign.is_item(path):
            return None
        steps = foreign.orbax_steps(path)
        if steps and paths.isdir(paths.join(path, str(steps[-1]), orbax.METADATA)):
            return f"numbered Orbax steps whose latest ({steps[-1]}) has ppl_jax's 'metadata' item"
        return None

    def steps(self) -> list[int]:
        return orbax.finalized_steps(self.path)

    def _read(self, step: int | None) -> tuple[int, dict[str, Any]]:
        """The resolved step and its stored metadata (`model`, `tokenizer`)."""
        if step is not None and step in self._metadata:
            return step, self._metadata[step]
        chosen, meta = orbax.read_metadata(self.path, step)
        self._metadata[chosen] = meta
        return chosen, meta

    def resolve_step(self, step: int | None) -> int | None:
        return self._read(step)[0]

    def carried_description(self, step: int | None) -> dict[str, Any] | None:
        """The step's stored `metadata["model"]`.

        Raises:
          CheckpointError: as `orbax.read_metadata`; a family ppl_jax does not know.
        """
        description = copy.deepcopy(self._read(step)[1]["model"])
        try:
            registry.for_description(description)
        except CheckpointError as e:
            raise CheckpointError(
                f"the stored architecture of {self.path!r}: {str(e).removesuffix('.')}; it was "
                f"saved by another ppl_jax, or its metadata item is damaged."
            ) from None
        return description

    def produced(self, step: int | None, description: dict[str, Any]) -> list[str] | None:
        """The stored params' own names (they are the model's)."""
        return list(self.stored(step))

    def stored_tokenizer(self, step: int | None) -> tokenizer_lib.Tokenizer | None:
        """The tokenizer described in the step's metadata, or None.

        Raises:
          ConfigError: a description of an unknown type.
        """
        description = self._read(step)[1].get("tokenizer")
        return tokenizer_lib.from_description(copy.deepcopy(description)) if description else None

    def _location(self) -> foreign.TreeLocation:
        return foreign.TreeLocation(self.path, False, orbax.STATE, "params")

    def stored(self, step: int | None) -> Stored:
        step = self.resolve_step(step)
        if step not in self._stored:
            self._stored[step] = foreign.stored_params(self._location(), self.path, step)[0]
        return self._stored[step]

    def read(self, step: int | None, abstract: dict[str, jax.ShapeDtypeStruct]) -> dict[str, Any]:
        step = self.resolve_step(step)
        item = self._location().item_dir(step)
        got = orbax.read_arrays(
            item, self.path, step, {PARAMS + n: v for n, v in abstract.items()}, shown=PARAMS
        )
        return {n[len(PARAMS) :]: v for n, v in got.items()}

    def restore(self, step: int | None, target: Any) -> Any:
        """The step's params by their own names, checked against the checksums saved with them
        (`orbax.restore_params`)."""
        return orbax.restore_params(self.path, self.resolve_step(step), target)

    def mapping_report(self, step: int | None, target: Any) -> list[str]:
        return ["mapping: none (the stored names are the model's own)"]

    def layout_lines(self, step: int | None) -> list[str]:
        step = self.resolve_step(step)
        folder = paths.join(self.path, str(step))
        return [
            f"step {step} items: {', '.join(sorted(paths.listdir(folder)))}",
            "params: 'params' of the item 'state' (ppl_jax's training state); architecture and "
            "tokenizer: the item 'metadata'",
        ]
