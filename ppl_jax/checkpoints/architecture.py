"""A checkpoint's architecture: where it comes from (`parse`), and the `Architecture` of a
step, resolved once (`resolve`), from which the run, the reference model, LongPPL's evaluator and
the harness build their model and choose its attention.

Where it comes from: the checkpoint's own (ppl_jax's `metadata` item, a Hugging Face
directory's `config.json`), unless `checkpoint.architecture` names one, which wins (the user who
sets it means it):

- a Hugging Face `config.json` (the file, or the directory holding it): read as
  `ppl_jax.checkpoints.formats.safetensors.read_description` reads a Hugging Face directory;
- a ppl_jax description JSON (`{"family": "llama", ...}`, what `Checkpoint.description()` gives);
- `maxtext:<model name> [key=value ...]`: a MaxText model with MaxText's own override names
  (`ppl_jax.checkpoints.mapping.maxtext`);
- `module:function`: a Python entry point returning a `LanguageModel` (a model family of the
  user's own), called with `dtype=` when it takes it.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import os
from typing import TYPE_CHECKING, Any

import jax.numpy as jnp

from ppl_jax.checkpoints.formats import safetensors
from ppl_jax.checkpoints.mapping import maxtext
from ppl_jax.checkpoints.options import dtype_of
from ppl_jax.errors import CheckpointError, ConfigError
from ppl_jax.models import registry
from ppl_jax.models.interface import LanguageModel
from ppl_jax.models.layers import attention as attention_lib
from ppl_jax.runtime import paths

if TYPE_CHECKING:
    from ppl_jax.checkpoints.checkpoint import Checkpoint


@dataclasses.dataclass(frozen=True)
class Architecture:
    """The architecture of one step of a checkpoint, resolved once (`resolve`): its sizes checked
    and its layer count held against the stored weights, before any model is built.

    Attributes:
      description: the description (`ppl_jax.models.registry.build`'s argument) as given or
        carried (`Checkpoint.description`, not normalized); None for an entry point's model
        (its own, once built).
      family: its family (`ppl_jax.models.registry.Family`), or None for an entry point.
      config: the family's config of `description`, or None for an entry point.
      entry: the `checkpoint.architecture` entry point `module:function`, or "".
    """

    description: dict[str, Any] | None
    family: Any = None
    config: Any = None
    entry: str = ""

    def attention(
        self, setting: str, dtype: str, mesh: Any = None, context_attention: str = "all_gather"
    ) -> str:
        """The attention implementation that `model.attention=setting` runs for this
        architecture in `dtype` (`float32` or `bfloat16`) on this platform: `xla`, `cudnn` or
        `splash` (`ppl_jax.models.layers.attention.resolve_for`); with `mesh`, for its `context`
        axis under `context_attention` (`mesh.context_attention`). A model of the user's own attends
        its own way: `xla` (batches as for XLA).

        Raises:
          ConfigError: an unknown dtype or setting; an implementation this platform lacks.
        """
        if self.entry:
            return "xla"
        context = {}
        if mesh is not None:
            context = dict(context=int(mesh.shape["context"]), context_attention=context_attention)
        return attention_lib.resolve_for(setting, dtype_of(dtype), self.description, **context)

    def model(self, dtype: str = "float32", attention: str = "auto") -> LanguageModel:
        """The model (abstract params, no weights): the family's, or the entry point's own.

        Args:
          dtype: the params' dtype, `float32` or `bfloat16`.
          attention: an implementation (`xla`, `cudnn`, `splash`) or `auto`, resolved here
            without a mesh (`attention`).

        Raises:
          ConfigError: an unknown dtype; an entry point that cannot be loaded; an attention
            implementation the family refuses.
        """
        if self.entry:
            return entry_model(self.entry, dtype_of(dtype))
        resolved = self.attention(attention, dtype)
        return registry.build(self.description, dtype_of(dtype), resolved)


def resolve(ckpt: Checkpoint, step: int | None = None) -> Architecture:
    """The `Architecture` of `step` of `ckpt` (None: the latest finalized): an entry point's, or
    the description's, its sizes checked (`registry.config_of`) and its layer count held
    against the stored weights (`check_stored_layers`) before anything is built.

    Raises:
      ConfigError: a faulty `checkpoint.architecture`.
      CheckpointError: as `Checkpoint.resolve_step` and `description`; a description of an
        unknown family, with unknown keys or sizes out of bounds; another number of layers
        than the stored weights make.
    """
    kind, value = ckpt.given_architecture()
    if kind == "entry":
        return Architecture(None, entry=value)
    description = ckpt.description(step)
    config = registry.config_of(description)  # sizes checked before anything reads them
    check_stored_layers(ckpt, step, description)
    return Architecture(description, registry.for_description(description), config)


def check_same(ckpt: Checkpoint, step: int | None, model: LanguageModel) -> None:
    """Checks that `step` of `ckpt` stores the architecture of `model` (a sweep scores one
    model). The stored description is normalized as `model.description` was (through
    `build`), so that metadata saved without a key that has its default value is the same
    architecture as one saved with it. An architecture given by `checkpoint.architecture`,
    or none carried, is the same for every step: nothing to check.

    Raises:
      CheckpointError: another architecture; or as `Checkpoint.description` and `build`.
    """
    if ckpt.architecture or ckpt.carried_description(step) is None:
        return
    stored = registry.build(ckpt.description(step), jnp.float32, "xla").description
    if stored != model.description:
        raise CheckpointError(
            f"step {step} of {ckpt.path!r} holds another architecture than the model being "
            f"scored; a sweep scores the steps of one model."
        )


def check_stored_layers(ckpt: Checkpoint, step: int | None, description: dict[str, Any]) -> None:
    """Refuses an architecture whose layer count the stored weights contradict, before the
    model is built (a description of 1,000 layers would take minutes to build): by what
    the stored tree makes (`Checkpoint.produced`). Damage and a mapping that does not fit are
    left to `restore`, which names them in their own words.

    Raises:
      CheckpointError: another number of layers (`registry.check_stored_layers`).
    """
    try:
        names = ckpt.produced(step, description)
    except CheckpointError:
        return
    except Exception:  # Orbax's own errors for unreadable metadata: restore says how
        return
    if names is not None:
        registry.check_stored_layers(description, names, repr(ckpt.path))


def parse(setting: str) -> tuple[str, Any]:
    """`checkpoint.architecture` as (`kind`, value): `none`, `hf` (a directory), `description`
    (a dict), `maxtext` (a dict), or `entry` (`module:function`).

    Raises:
      ConfigError: a file that is neither a Hugging Face `config.json` nor a description, a
        setting of no recognised form. CheckpointError: as `safetensors.read_description`.
    """
    setting = str(setting or "").strip()
    if not setting:
        return "none", None
    if setting.startswith("maxtext:"):
        words = setting[len("maxtext:") :].split()
        if not words or "=" in words[0]:
            raise ConfigError(
                f"checkpoint.architecture={setting[:80]!r} names no MaxText model; write "
                f"'maxtext:<model> key=value ...' (models: {', '.join(sorted(maxtext.MAXTEXT_MODELS))})."
            )
        name, *rest = words
        bad = [r for r in rest if "=" not in r]
        if bad:
            raise ConfigError(
                f"checkpoint.architecture: {bad[0]!r} is not a key=value override of the "
                f"MaxText model {name!r}."
            )
        return "maxtext", maxtext.description(name, dict(r.split("=", 1) for r in rest))
    path = os.path.expanduser(setting)
    if paths.isdir(path) and paths.isfile(paths.join(path, "config.json")):
        return "hf", safetensors.read_description(path)
    if paths.isfile(path):
        data = paths.read_json_object(path, "checkpoint.architecture")
        if "family" in data:
            try:
                registry.check_sizes(data)  # named by its file: the check repeats at build
            except CheckpointError as e:
                raise CheckpointError(f"{path!r}: {e}") from None
            return "description", data
        if "model_type" in data and os.path.basename(path) == "config.json":
            return "hf", safetensors.read_description(os.path.dirname(path) or ".")
        raise ConfigError(
            f"checkpoint.architecture {setting!r} is neither a Hugging Face config.json "
            f"(model_type, in a file named config.json) nor a ppl_jax description (family)."
        )
    if ":" in setting and os.sep not in setting:
        return "entry", setting
    raise ConfigError(
        f"checkpoint.architecture={setting!r} is not a config.json, a description JSON, "
        f"'maxtext:<model> key=value ...' or a Python entry point 'module:function'."
    )


def entry_model(entry: str, dtype: Any) -> LanguageModel:
    """The `LanguageModel` a Python entry point `module:function` returns (called with
    `dtype=` when it has that parameter), its `origin` the entry point.

    Raises:
      ConfigError: the module or function cannot be found, or it returns something else.
    """
    module_name, _, function = entry.partition(":")
    try:
        fn = getattr(importlib.import_module(module_name), function)
    except (ImportError, AttributeError) as e:
        raise ConfigError(
            f"checkpoint.architecture: the entry point {entry!r} cannot be loaded ({e})."
        ) from None
    try:
        takes_dtype = "dtype" in inspect.signature(fn).parameters
        model = fn(dtype=dtype) if takes_dtype else fn()
    except (TypeError, ValueError) as e:
        raise ConfigError(
            f"checkpoint.architecture: the entry point {entry!r} cannot be called without "
            f"arguments (or with dtype=) ({e})."
        ) from None
    if not isinstance(model, LanguageModel):
        raise ConfigError(
            f"checkpoint.architecture: {entry!r} returned a {type(model).__name__}, not a "
            f"ppl_jax.LanguageModel (see ppl_jax.from_linen / ppl_jax.from_nnx)."
        )
    return dataclasses.replace(model, origin=entry)
