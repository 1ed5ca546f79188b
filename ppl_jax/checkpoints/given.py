"""The architecture a user gives (`checkpoint.architecture`), which wins over the checkpoint's own
(ppl_jax's `metadata` item, a Hugging Face directory's `config.json`; the user who sets it means
it): `parse` reads the setting, `entry_model` calls an entry point.

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
from typing import Any

from ppl_jax.checkpoints.formats import safetensors
from ppl_jax.checkpoints.mapping import maxtext
from ppl_jax.errors import CheckpointError, ConfigError
from ppl_jax.models import registry
from ppl_jax.models.interface import LanguageModel
from ppl_jax.runtime import paths


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
