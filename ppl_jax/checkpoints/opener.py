"""The one checkpoint opener: which weights, which architecture, which tokenizer, which steps.

`open_checkpoint(path)` recognises the layout of a checkpoint directory and returns a
`Checkpoint`, which answers every question the evaluation asks of it, whatever the layout:

- `orbax`: an Orbax `CheckpointManager` directory of numbered steps, each with the training
  state and its metadata (`ppl_jax.checkpoints.orbax`);
- `hf`: a Hugging Face directory, `config.json` and safetensors weights, one set of weights
  (`ppl_jax.checkpoints.hf`);
- another trainer's Orbax checkpoint (MaxText, the gemma library, a Linen `TrainState`, an NNX
  state; `ppl_jax.checkpoints.foreign`): format `orbax`, read through a mapping
  (`ppl_jax.checkpoints.mapping`, `presets`) with an architecture given where the checkpoint
  carries none (`ppl_jax.checkpoints.architecture`);
- a Hugging Face hub id (`hf://org/name@revision`, `ppl_jax.checkpoints.hub`): format `hf`, its
  revisions (`step1000`, ...) as steps.

A reference model (KL diagnostics) is a second `Checkpoint`. Nothing here reads a weight before
`restore`, which places each one straight into its target sharding.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

import jax.numpy as jnp

from ppl_jax import tokenizer as tokenizer_lib
from ppl_jax.checkpoints import architecture as architecture_lib
from ppl_jax.checkpoints import foreign, hf, hub, orbax, presets
from ppl_jax.checkpoints import mapping as mapping_lib
from ppl_jax.errors import CheckpointError, ConfigError
from ppl_jax.models import attention as attention_lib
from ppl_jax.models import registry
from ppl_jax.models.interface import LanguageModel, weight_paths
from ppl_jax.runtime import paths

DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}
FORMATS = ("auto", "orbax", "hf")


def open_checkpoint(
    path: str,
    format: str = "auto",
    *,
    architecture: str = "",
    mapping: str = "",
    item: str = "",
    params: str = "",
    allow_download: bool = False,
) -> Checkpoint:
    """Opens the checkpoint directory `path` (local, or remote: see `ppl_jax.runtime.paths`).

    Args:
      path: the directory, or a hub id (`hf://org/name[@revision]`, or a bare `org/name` that is
        not a path; `ppl_jax.checkpoints.hub`).
      format: `orbax`, `hf`, or `auto`: `hf` when the directory holds a `config.json`, else
        `orbax`.
      architecture: `checkpoint.architecture` (`ppl_jax.checkpoints.architecture.parse`): wins
        over the architecture a checkpoint carries.
      mapping: `checkpoint.mapping`: a preset (`maxtext`, `gemma`, `identity`), a YAML/JSON
        mapping file, or '' (ppl_jax's own layout, else detected from the stored names).
      item: `checkpoint.item` ('': found).
      params: `checkpoint.params` ('': found).
      allow_download: a hub id may be downloaded (default: the local hub cache only).

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
    options = {"architecture": architecture, "mapping": mapping, "item": item, "params": params}
    if hub.is_hub_id(path):
        repo = hub.open_repo(path, allow_download)
        return Checkpoint(path, "hub", repo=repo, **options)
    if hub.is_repo_folder(path):
        return Checkpoint(path, "hub", repo=hub.repo_of_folder(path, allow_download), **options)
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
    return Checkpoint(path, format, **options)


@dataclasses.dataclass
class Checkpoint:
    """An opened checkpoint directory (see `open_checkpoint`).

    Steps are Orbax's finalized steps (saves that committed); a Hugging Face directory has one set
    of weights and its step is None throughout. `step=None` in any method means the latest
    finalized step, looked up anew on each call (a training run may finalize more). What a
    finalized step stores does not change, so its metadata is read once per `Checkpoint`.

    Attributes:
      path: the directory, as given.
      format: `orbax`, `hf`, or `hub` (a hub id or a hub cache's repository folder: its step
        revisions are the steps).
    """

    path: str
    format: str
    architecture: str = ""
    mapping: str = ""
    item: str = ""
    params: str = ""
    repo: hub.Repo | None = None
    _layout: foreign.Layout | None = dataclasses.field(
        default=None, init=False, repr=False, compare=False
    )
    _kind: str | None = dataclasses.field(default=None, init=False, repr=False, compare=False)
    _metadata: dict[int, dict[str, Any]] = dataclasses.field(
        default_factory=dict, init=False, repr=False, compare=False
    )

    def kind(self) -> str:
        """`hub` (a hub id), `hf` (a Hugging Face directory), `own` (ppl_jax's Orbax layout with
        its `metadata` item) or `foreign` (another trainer's Orbax checkpoint, read through a
        mapping); decided once per `Checkpoint`."""
        if self._kind is None:
            if self.repo is not None or self.format == "hf":
                self._kind = "hub" if self.repo is not None else "hf"
            else:
                self._kind = foreign.kind_of(
                    self.path, bool(self.mapping or self.item or self.params)
                )
        return self._kind or ("foreign" if self.architecture else "own")

    def layout(self) -> foreign.Layout:
        """Where another trainer's checkpoint keeps its params (`foreign.locate`)."""
        if self._layout is None:
            self._layout = foreign.locate(self.path, self.item, self._file().get("params", "")
                                          or self.params)  # fmt: skip
            if not self.item and self._file().get("item"):
                self._layout = foreign.locate(self.path, self._file()["item"], self._layout.params)
        return self._layout

    def _file(self) -> dict[str, Any]:
        if self.mapping and self.mapping not in presets.PRESETS:
            return presets.read_file(self.mapping)
        return {}

    def steps(self) -> list[int]:
        """The finalized steps, ascending; a hub id's cached step revisions; `[]` for a
        Hugging Face directory or a checkpoint without steps.

        Raises:
          CheckpointError: the directory is gone.
        """
        kind = self.kind()
        if kind == "hub":
            return self.repo.steps()
        if kind == "hf":
            return []
        if kind == "foreign":
            if self._layout is None and not foreign.has_steps(self.path):
                return []  # a run that has not finalized its first step yet (watch mode)
            layout = self.layout()
            return [] if layout.bare else orbax.finalized_steps(layout.root)
        return orbax.finalized_steps(self.path)

    def _read(self, step: int | None) -> tuple[int, dict[str, Any]]:
        """The resolved step and its stored metadata (`model`, `tokenizer`)."""
        if step is not None and step in self._metadata:
            return step, self._metadata[step]
        chosen, meta = orbax.read_metadata(self.path, step)
        self._metadata[chosen] = meta
        return chosen, meta

    def resolve_step(self, step: int | None) -> int | None:
        """`step` checked against the finalized steps, or the latest for None; None for `hf`,
        a bare checkpoint, and a hub id's own revision.

        Raises:
          CheckpointError: as `ppl_jax.checkpoints.orbax.read_metadata` (no finalized step, a
            step that is not one, a step without metadata); a hub revision not found.
        """
        kind = self.kind()
        if kind == "hub":
            if step is None and self.repo.steps_only and self.repo.steps():
                step = self.repo.steps()[-1]
            self.repo.snapshot(step)
            return step
        if kind == "hf":
            return None
        if kind == "foreign":
            layout = self.layout()
            return None if layout.bare else orbax.pick_step(layout.root, step)
        return self._read(step)[0]

    def _hf_dir(self, step: int | None) -> str:
        return self.repo.snapshot(step) if self.repo is not None else self.path

    def source(self, step: int | None = None) -> dict[str, Any]:
        """What identifies the weights beyond the path: a hub id's repository, revision and
        resolved 40-hex commit; `{}` otherwise."""
        if self.repo is None:
            return {}
        return {"repo": self.repo.repo_id, "revision": self.repo.revision_of(step),
                "commit": self.repo.commit(step)}  # fmt: skip

    def description(self, step: int | None = None) -> dict[str, Any]:
        """The architecture description (`ppl_jax.models.registry.build`'s argument): from
        `checkpoint.architecture` when set (it wins), else the stored `metadata["model"]` of
        the step (as saved, not normalized), or `hf.read_description`.

        Raises:
          CheckpointError: as `resolve_step`, or a missing or unsupported `config.json`; a
            foreign checkpoint without `checkpoint.architecture`; a stored description whose
            family is unknown.
        """
        kind, value = architecture_lib.parse(self.architecture)
        if kind == "entry":
            return self.model(step=step).description
        if kind != "none":
            return copy.deepcopy(value)
        if self.kind() in ("hf", "hub"):
            return hf.read_description(self._hf_dir(step))
        if self.kind() == "foreign":
            raise CheckpointError(
                f"{self.path!r} carries no architecture (another trainer's checkpoint); set "
                f"checkpoint.architecture to a config.json, a description JSON, "
                f"'maxtext:<model> key=value ...' or a Python entry point 'module:function'."
            )
        description = copy.deepcopy(self._read(step)[1]["model"])
        try:
            registry.for_description(description)
        except CheckpointError as e:
            raise CheckpointError(
                f"the stored architecture of {self.path!r}: {str(e).removesuffix('.')}; it was "
                f"saved by another ppl_jax, or its metadata item is damaged."
            ) from None
        return description

    def attention(self, setting: str, dtype: str, step: int | None = None) -> str:
        """The attention implementation that `model.attention=setting` runs for this architecture
        in `dtype` (`float32` or `bfloat16`) on this platform: `xla`, `cudnn` or `splash`
        (`ppl_jax.models.attention.resolve_for`).

        Raises:
          ConfigError: an unknown dtype.
          CheckpointError: as `description`.
        """
        if architecture_lib.parse(self.architecture)[0] == "entry":
            return "xla"  # a model of the user's own attends its own way; batches as for XLA
        description = self.description(step)
        registry.config_of(description)  # sizes checked before anything reads them
        return attention_lib.resolve_for(setting, _dtype(dtype), description)

    def model(
        self, dtype: str = "float32", attention: str = "auto", step: int | None = None
    ) -> LanguageModel:
        """The model (abstract params, no weights) of the step's architecture; a Python entry
        point's own model when `checkpoint.architecture` names one.

        Args:
          dtype: the params' dtype, `float32` or `bfloat16`.
          attention: an implementation (`xla`, `cudnn`, `splash`; what `attention()` resolved)
            or `auto`, resolved here in the same way.
          step: as in `resolve_step`.

        Raises:
          ConfigError: an unknown dtype; an entry point that cannot be loaded.
          CheckpointError: as `description`, or a description of an unknown family or with
            unknown keys.
        """
        kind, value = architecture_lib.parse(self.architecture)
        if kind == "entry":
            return architecture_lib.entry_model(value, _dtype(dtype))
        description = self.description(step)
        registry.config_of(description)  # sizes checked before anything reads them
        self._check_stored_layers(step, description)
        resolved = attention_lib.resolve_for(attention, _dtype(dtype), description)
        return registry.build(description, _dtype(dtype), resolved)

    def _check_stored_layers(self, step: int | None, description: dict[str, Any]) -> None:
        """Refuses an architecture whose layer count the stored weights contradict, before the
        model is built (a description of 1,000 layers would take minutes to build): ppl_jax's
        own layout by its stored names, another trainer's by what its mapping makes of them. A
        Hugging Face directory is checked by `hf.read_description`."""
        kind = self.kind()
        if kind not in ("own", "foreign"):
            return
        try:
            if kind == "own":
                resolved = self.resolve_step(step)
                tree = orbax.tree_metadata(paths.join(self.path, str(resolved), orbax.STATE))
                names = [n.removeprefix("params/") for n in tree if n.startswith("params/")]
            else:
                resolved = self.resolve_step(step)
                shapes = foreign.stored_params(self.layout(), self.path, resolved)[0]
                names = list(mapping_lib.produced(self.rules(resolved), shapes, description, ""))
        except CheckpointError:
            return  # restore names the damage or the mapping's mismatch in its own words
        except Exception:  # Orbax's own errors for unreadable metadata: restore says how
            return
        registry.check_stored_layers(description, names, repr(self.path))

    def tokenizer(self, step: int | None = None) -> tokenizer_lib.Tokenizer | None:
        """The checkpoint's own tokenizer (BOS/EOS ids and policy included), or None when it
        stores none: `hf.read_tokenizer` of a Hugging Face directory (or hub revision) with
        `tokenizer.json` or `tokenizer.model`; the tokenizer described in an Orbax step's
        metadata.

        Raises:
          CheckpointError: an unreadable tokenizer file, or as `resolve_step`.
          ConfigError: a stored description of an unknown type.
        """
        if self.kind() in ("hf", "hub"):
            folder = self._hf_dir(step)
            return hf.read_tokenizer(folder) if hf.has_tokenizer(folder) else None
        description = self.tokenizer_description(step)
        return tokenizer_lib.from_description(description) if description else None

    def tokenizer_description(self, step: int | None = None) -> dict[str, Any] | None:
        """An Orbax step's stored tokenizer description (`Tokenizer.describe()` output, what
        `ppl_jax.tokenizer.load_tokenizer(spec, description)` takes), or None when it stores none.
        A Hugging Face directory stores files, not a description: None (use `tokenizer()`).

        Raises:
          CheckpointError: as `resolve_step`.
        """
        if self.kind() != "own":
            return None
        return copy.deepcopy(self._read(step)[1].get("tokenizer")) or None

    def rules(self, step: int | None = None) -> list[dict[str, Any]]:
        """The mapping rules of a foreign checkpoint: `checkpoint.mapping`'s preset or file, or
        the preset its stored names look like (`presets.detect`), else `identity`.

        Raises:
          CheckpointError: as `presets.read_file` and `presets.rules_for`; as `description`.
        """
        file = self._file()
        if file:
            return file["rules"]
        name = self.mapping
        if not name:
            step = self.resolve_step(step)
            stored = foreign.stored_params(self.layout(), self.path, step)[0]
            name = presets.detect(list(stored)) or "identity"
        return presets.rules_for(name, self._known(step))

    def _known(self, step: int | None) -> dict[str, Any]:
        """The architecture's description where one is known (`{}` for a foreign checkpoint
        without `checkpoint.architecture`: the caller brings the model)."""
        kind, _ = architecture_lib.parse(self.architecture)
        if kind == "entry":
            return self.model(step=step).description
        if kind == "none" and self.kind() == "foreign":
            return {}
        return self.description(step)

    def mapped(self, step: int | None, target: Any) -> dict[str, mapping_lib.Source]:
        """For another trainer's checkpoint: which stored tensor (layer, part, operations) gives
        each model weight of `target` (leaves with `.shape`), read from the tree metadata only.

        Raises:
          CheckpointError: as `mapping.resolve` (the first unmatched names).
        """
        step = self.resolve_step(step)
        shapes = foreign.stored_params(self.layout(), self.path, step)[0]
        where = f"{self.path!r} (mapping {self.mapping or 'detected'})"
        return mapping_lib.resolve(
            self.rules(step), shapes, weight_paths(target), self._known(step), where
        )

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
            (`ppl_jax.checkpoints.orbax.restore_params`, `ppl_jax.checkpoints.hf.load_params`);
            for a foreign checkpoint, the first unmatched names (`ppl_jax.checkpoints.mapping`).
        """
        kind = self.kind()
        if kind in ("hf", "hub"):
            return hf.load_params(self._hf_dir(step), target)
        if kind == "own":
            return orbax.restore_params(self.path, self.resolve_step(step), target)
        step = self.resolve_step(step)
        names = self._known(step)
        where = f"{self.path!r}" + (f" step {step}" if step is not None else "")
        where += f" (mapping {self.mapping or 'detected'})"
        return foreign.restore(
            self.layout(), self.path, step, self.rules(step), names, target, where
        )

    def check_same_architecture(self, step: int | None, model: LanguageModel) -> None:
        """Checks that `step` stores the architecture of `model` (a sweep scores one model).

        The stored description is normalized as `model.description` was (through `build`: the
        family config's `from_dict`/`to_dict`), so that metadata saved without a key that has
        its default value is the same architecture as one saved with it. An architecture given
        by `checkpoint.architecture` is the same for every step: nothing to check.

        Raises:
          CheckpointError: another architecture; or as `description` and `build`.
        """
        if self.architecture or self.kind() == "foreign":
            return
        stored = registry.build(self.description(step), jnp.float32, "xla").description
        if stored != model.description:
            raise CheckpointError(
                f"step {step} of {self.path!r} holds another architecture than the model being "
                f"scored; a sweep scores the steps of one model."
            )


def _dtype(name: str) -> Any:
    if name not in DTYPES:
        raise ConfigError(f"model.dtype={name!r} is not one of {', '.join(DTYPES)}.")
    return DTYPES[name]
