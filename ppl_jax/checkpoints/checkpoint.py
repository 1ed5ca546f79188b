"""The checkpoint protocol: what the reader of each checkpoint layout answers (`Checkpoint`), and
what every checkpoint derives from those answers.

A reader is one subclass of `Checkpoint` per layout, found by its markers (`claims`);
`ppl_jax.checkpoints.opener.open_checkpoint` asks each reader in turn and returns an instance of
the first that claims the path. Each reader answers:

- `claims(path, options)` (a class method): why it reads `path` (the markers it found), or None;
- `steps()` and `resolve_step(step)`: the finalized steps, and a step checked or the latest;
- `stored(step)`: the stored tree's names, shapes and dtypes, read without reading an array;
- `read(step, abstract)`: the named stored arrays, each straight into its target sharding, each
  process reading only the chunks (or byte ranges) of its own shards;
- `carried_description(step)` and `stored_tokenizer(step)`: the architecture and the tokenizer
  the checkpoint itself carries, or None;
- `files(step)`: the folder whose files hold the weights of a step, and, for a reader that
  names its weights by more than its path, format, step and files, `identity(step)` (a hub
  revision's commit): the `checkpoint` part of a run's fingerprint;
- `layout_lines(step)`: where it found what, in lines (`ppl-jax inspect`).

No link leads out of a checkpoint: before `stored`, `read`, `restore`, `carried_description`,
`stored_tokenizer` and `layout_lines`, the protocol itself runs the one check of links
(`ppl_jax.runtime.paths.refuse_links_out`) over `files(step)` (or `links_scope(step)`;
`ppl_jax.checkpoints.links`): a new reader gets it by subclassing `Checkpoint`.

From these answers every `Checkpoint` gives the architecture description (`description`: the
checkpoint's own or `checkpoint.architecture`'s, `ppl_jax.checkpoints.given`; a step's model is
`ppl_jax.checkpoints.architecture.resolve(ckpt, step).model(...)`, resolved once for the setup,
the reference model and the harness), the tokenizer of a `data.tokenizer` setting (`tokenizer_for`,
`ppl_jax.tokenizer.loading.for_setting`), and the params (`restore`) through the mapping of its
stored names onto a model's weights (`rules`, `known`, `naming`, `produced`, ...: the hooks of
`ppl_jax.checkpoints.mapping.apply.MappedHooks`, which a reader may override). Readers whose stored
tree is the model's own (ppl_jax's Orbax layout, a Hugging Face directory) restore their own
way.
"""

from __future__ import annotations

import abc
import copy
import importlib.util
import math
from typing import Any, ClassVar

import jax
import numpy as np

from ppl_jax import tokenizer as tokenizer_lib
from ppl_jax.checkpoints import given
from ppl_jax.checkpoints.links import LinksChecked
from ppl_jax.checkpoints.mapping import apply, presets
from ppl_jax.checkpoints.options import DTYPES, Options, Stored, dtype_of
from ppl_jax.errors import CheckpointError
from ppl_jax.models.interface import LanguageModel
from ppl_jax.models.layers.packed import Layout
from ppl_jax.runtime import fingerprint as fingerprint_lib
from ppl_jax.runtime import paths
from ppl_jax.tokenizer.loading import for_setting

__all__ = ["DTYPES", "Checkpoint", "Options", "Stored", "dtype_of"]


# Bytes per element of the stored dtypes by their safetensors names (others: NumPy's names).
STORED_SIZES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1,
                "U8": 1, "U32": 4, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1}  # fmt: skip


class Checkpoint(LinksChecked, apply.MappedHooks, abc.ABC):
    """An opened checkpoint: one reader of one layout (see the module docstring).

    `step=None` in any method means the latest finalized step, looked up anew on each call (a
    training run may finalize more); a checkpoint of one set of weights has no steps, and its
    step is None throughout.

    Attributes:
      path: the checkpoint, as given.
      options: its `Options`.
      why: the markers that chose the reader (`ppl-jax inspect` prints them).
      format: what the records call the layout (`orbax`, `hf`, `hub`, ...).
      formats: the `checkpoint.format` values that choose this reader (empty: any).
      layout_name: the layout in words, for sentences.
      tokenizer_files: where the layout keeps a tokenizer, for the sentence when it keeps none.
    """

    format: ClassVar[str] = ""
    formats: ClassVar[tuple[str, ...]] = ()
    layout_name: ClassVar[str] = ""
    tokenizer_files: ClassVar[str] = ""

    def __init__(self, path: str, options: Options | None = None, why: str = ""):
        self.path = path
        self.options = options or Options()
        self.why = why
        self._given: tuple[str, Any] | None = None

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.path!r})"

    def __eq__(self, other: object) -> bool:
        return (
            type(other) is type(self) and (other.path, other.options) == (self.path, self.options)  # type: ignore[attr-defined]
        )

    __hash__ = None  # type: ignore[assignment]

    @property
    def architecture(self) -> str:
        return self.options.architecture

    @property
    def mapping(self) -> str:
        return self.options.mapping

    # ------------------------------------------------------------------ the protocol

    @classmethod
    @abc.abstractmethod
    def claims(cls, path: str, options: Options) -> str | None:
        """Why this reader reads `path` (the markers found, in a few words), or None.

        Raises:
          ConfigError: a remote path whose filesystem package is missing.
        """

    @abc.abstractmethod
    def steps(self) -> list[int]:
        """The finalized steps, ascending (`[]`: one set of weights, or none finalized yet).

        Raises:
          CheckpointError: the checkpoint is gone.
        """

    @abc.abstractmethod
    def resolve_step(self, step: int | None) -> int | None:
        """`step` checked against the finalized steps, or the latest for None; None for a
        checkpoint of one set of weights.

        Raises:
          CheckpointError: no finalized step, or `step` is not one (naming the steps there).
        """

    @abc.abstractmethod
    def stored(self, step: int | None) -> Stored:
        """The stored params: name -> (shape, dtype), from metadata and headers only (the names
        `read` takes and the mapping's `from` patterns match).

        Raises:
          CheckpointError: as `resolve_step`; damaged or unreadable metadata, named.
        """

    @abc.abstractmethod
    def read(
        self, step: int | None, abstract: dict[str, jax.ShapeDtypeStruct]
    ) -> dict[str, jax.Array]:
        """The stored arrays named in `abstract`, each read into its leaf's sharding and dtype
        (`jax.ShapeDtypeStruct(shape, dtype, sharding=...)`), each process reading only the
        chunks or byte ranges of its own shards.

        Raises:
          CheckpointError: a damaged step, naming the weights that cannot be read.
        """

    def carried_description(self, step: int | None) -> dict[str, Any] | None:
        """The architecture the checkpoint carries (a description for `ppl_jax.models.registry
        .build`), or None: the user gives it (`checkpoint.architecture`)."""
        return None

    def stored_tokenizer(self, step: int | None) -> tokenizer_lib.Tokenizer | None:
        """The tokenizer the checkpoint carries (BOS/EOS policy included), or None."""
        return None

    def quantization(self, step: int | None) -> dict[str, Any] | None:
        """How `step`'s weights are stored quantized (docs/outputs.md), or None: float."""
        return None

    def identity(self, step: int | None) -> dict[str, Any]:
        """What identifies the weights a run scores at `step` (the `checkpoint` part of its
        fingerprint, `ppl_jax.runtime.fingerprint.run_fingerprint`): `path` (absolute), `format`,
        `step`; the `files` of the weights (`files(step)`: path, size, modification time and
        sampled blocks, or object version, digested); what chooses or transforms them: `mapping`
        (a preset by name, a file by content), `item`, `params`, a `checkpoint.architecture`
        entry point's module file (`entry_module`, by content), `quantization`. A reader adds
        what else names its weights.

        Raises:
          CheckpointError: as `resolve_step` (a reader that must resolve the step to name it).
        """
        found: dict[str, Any] = {
            "path": paths.absolute(self.path),
            "format": self.format,
            "step": step,
            "files": fingerprint_lib.text_digest(
                fingerprint_lib.tree_identity(paths.absolute(self.files(step)))
            ),
        }
        kind, entry = self.given_architecture()
        if kind == "entry":
            module = importlib.util.find_spec(entry.partition(":")[0])
            origin = module.origin if module is not None else None
            found["entry_module"] = fingerprint_lib.content_digest(origin) if origin else entry
        if self.mapping:
            preset = self.mapping in presets.PRESETS
            if not preset:
                self.mapping_file()  # refuses what is no small regular file before its digest
            found["mapping"] = (
                self.mapping if preset else fingerprint_lib.content_digest(self.mapping)
            )
        found.update(
            {k: getattr(self.options, k) for k in ("item", "params") if getattr(self.options, k)}
        )
        found.update({"quantization": q} if (q := self.quantization(step)) is not None else {})
        return found

    def files(self, step: int | None) -> str:
        """The folder (or the one file) whose files hold the weights of `step` (identified in the
        fingerprint by path, size, modification time and sampled blocks, or object version:
        `fingerprint.tree_identity`)."""
        return self.path if step is None else paths.join(self.path, str(step))

    def layout_lines(self, step: int | None) -> list[str]:
        """Where the reader found what, one line each (`ppl-jax inspect`)."""
        return []

    # ------------------------------------------------------------------ derived answers

    def given_architecture(self) -> tuple[str, Any]:
        """`checkpoint.architecture` parsed once (`given.parse`): `(kind, value)`."""
        if self._given is None:
            self._given = given.parse(self.architecture)
        return self._given

    def description(self, step: int | None = None) -> dict[str, Any]:
        """The architecture description (`ppl_jax.models.registry.build`'s argument): from
        `checkpoint.architecture` when set (it wins; an entry point's model's, built in float32),
        else the one the checkpoint carries (as saved, not normalized).

        Raises:
          CheckpointError: as `resolve_step`; a checkpoint that carries none and no
            `checkpoint.architecture`; a stored description that cannot be read.
          ConfigError: a faulty `checkpoint.architecture`.
        """
        kind, value = self.given_architecture()
        if kind == "entry":
            return given.entry_model(value, dtype_of("float32")).description
        if kind != "none":
            return copy.deepcopy(value)
        carried = self.carried_description(step)
        if carried is None:
            raise CheckpointError(
                f"{self.path!r} carries no architecture ({self.layout_name}); set "
                f"checkpoint.architecture to a config.json, a description JSON, "
                f"'maxtext:<model> key=value ...' or a Python entry point 'module:function'."
            )
        return carried

    def tokenizer(self, step: int | None = None) -> tokenizer_lib.Tokenizer | None:
        """The checkpoint's own tokenizer, or None when it carries none (`stored_tokenizer`):
        then `ppl_jax.load_tokenizer(path)` loads one (the command line's `data.tokenizer`)."""
        return self.stored_tokenizer(step)

    def tokenizer_for(
        self,
        setting: str = "auto",
        allow_mismatch: bool = False,
        *,
        model: LanguageModel,
        step: int | None = None,
        key: str = "data.tokenizer",
    ) -> tuple[tokenizer_lib.Tokenizer, str | None]:
        """The tokenizer a run scores this checkpoint with (`ppl_jax.tokenizer.loading.for_setting`, the
        one resolution of `data.tokenizer`: `auto` is this checkpoint's own), and None or the
        note on a vocabulary mismatch that was allowed; `model` is the model scored
        (`ppl_jax.checkpoints.architecture.resolve(self, step).model(...)`), whose vocabulary the
        tokenizer must fit, `key` the setting's name in the caller's words.

        Raises:
          ConfigError: as `for_setting`.
        """
        vocab = model.vocab_size
        return for_setting(
            setting,
            lambda: self.tokenizer(step),
            vocab,
            allow_mismatch=allow_mismatch,
            key=key,
            missing=f"{self.path!r} carries no tokenizer ({self.tokenizer_files})",
        )

    def stored_bytes(self, step: int | None) -> int | None:
        """The bytes of the step's stored weights (what its files hold of them: quantized codes
        and scales as stored), from `stored` alone; None where a stored dtype has no fixed
        size."""
        total = 0
        for shape, dtype in self.stored(step).values():
            size = STORED_SIZES.get(str(dtype))
            if size is None:
                try:
                    size = np.dtype(str(dtype)).itemsize
                except TypeError:
                    return None
            total += size * math.prod(shape)
        return total

    def device_layouts(
        self, step: int | None, abstract: dict[str, Any]
    ) -> tuple[dict[str, Layout], dict[str, str]]:
        """Which quantized weights stay packed on the device (`ppl_jax.models.layers.packed`):
        ({weight name: its `Layout`}, {weight name: why it is dequantized on the host}) for the
        model weights `abstract` (name -> leaf with shape and dtype); read from the header
        alone, no weight. Neither, for a checkpoint of float weights (the default)."""
        return {}, {}

    def restore(self, step: int | None, target: Any) -> Any:
        """The params of the step, read straight into their target shardings (through the
        mapping: `apply.restore`; readers of the model's own layout override this).

        Args:
          step: as in `resolve_step`.
          target: the params tree of the step's model (`architecture.resolve(self, step)
            .model(...)`), with leaves
            `jax.ShapeDtypeStruct(shape, dtype, sharding=...)` (`ppl_jax.runtime.mesh
            .param_targets`); stored weights are cast to each leaf's dtype. A
            `ppl_jax.models.layers.packed.Packed` leaf (`device_layouts`) is read as its
            stored blocks.

        Returns:
          The params tree of `jax.Array`s, each of its leaf's shape, dtype and sharding.

        Raises:
          CheckpointError: a missing, misshapen or damaged weight, named; the first unmatched
            names of the mapping.
        """
        return apply.restore(self, step, target)
