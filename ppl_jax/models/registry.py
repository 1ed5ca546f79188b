"""The model families ppl_jax builds, one module each in `ppl_jax.models.families`.

A family is a `Family` record: its name; the description's config class and its Flax NNX module;
the Hugging Face `model_type`s it reads, each with its `config.json` reader; its Hugging Face
weights as rules of the one mapping language (`ppl_jax.checkpoints.mapping.language`); the GGUF
architectures it reads (llama.cpp's `general.architecture` names); the sizes its `config.json`s
name in their own words (`hf_sizes`); the kinds of its layers; and its limits (what it refuses, and
why). The registry finds the families by itself: every module of `ppl_jax.models.families` whose
name does not start with `_` is imported on first use and holds its record as the module
attribute `FAMILY`. Nothing else in the package lists
families: `ppl_jax.checkpoints.formats.safetensors` asks `for_model_type` and `hf_mapping`,
`ppl_jax.checkpoints.readers.gguf_arch` `for_gguf_architecture`, the opener `build`.

Adding a family is one new module `ppl_jax/models/families/<name>.py`:

```python
FAMILY = Family(
    name="<name>",
    config=NameConfig,                    # from_dict / to_dict, class attribute FAMILY
    module=Name,                          # module(cfg, rngs, dtype, attention), __call__ -> hidden
    hf_readers={"<type>": read_config},   # config.json dict -> config (raises CheckpointError)
    hf_rules=llama_hf.rules,              # description dict -> mapping rules (Hugging Face names)
    hf_prefixes=llama_hf.PREFIXES,        # stored-name heads removed before the rules
    gguf={"<arch>": GGUFArchitecture("<type>", rules, config)},  # GGUF architectures
    hf_sizes={"<key>": ("num_layers", 1)},  # its own config.json sizes: MAX_SIZES bound, least
    layers=lambda cfg: ...,               # the kind of each layer (`Layer`)
    limits=(Limit("context", "why", applies),),
)
```

plus its golden files (`tests/golden/make_family_golden.py`) and tests
(`tests/unit/models/test_families.py` finds the golden folder by itself); see the
"Adding a family" section of docs/checkpoints.md. Several families may share one config class
and module (the Llama-like ones all build `LlamaConfig` descriptions, family `llama`); one of them
owns it (its `name` is the config's `FAMILY`), and a description is built by its owner.

Descriptions are checked before anything is built (`check_sizes`): every size a positive integer
below `MAX_SIZES` (the largest published models, with room; `ppl_jax.models.bounds`), every number
finite; a `config.json` is checked by its own key names before its family's reader runs
(`bounds.check_hf_sizes`: the keys every config names alike and the family's own, `hf_sizes`), so
that a description or a `config.json` claiming a billion experts or layers, a chunk or kernel of
0, or a NaN is one sentence naming the key, not minutes of building or a traceback. A family's
reader need not check those keys again.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import pkgutil
import re
from collections.abc import Iterable
from typing import Any

import jax.numpy as jnp
from flax import nnx

from ppl_jax.errors import CheckpointError, ConfigError, quoted
from ppl_jax.models import families as families_pkg
from ppl_jax.models.adapters import from_nnx
from ppl_jax.models.bounds import (
    COMMON_HF_SIZES,
    MAX_SIZES,
    MAY_BE_ZERO,
    check_finite,
    check_hf_sizes,
)
from ppl_jax.models.family import Family
from ppl_jax.models.gguf_names import GGUFArchitecture
from ppl_jax.models.interface import LanguageModel
from ppl_jax.models.layers import attention as attention_lib


@functools.cache
def families() -> dict[str, Family]:
    """Every family, by name: the `FAMILY` of each module of `ppl_jax.models.families`.

    Raises:
      RuntimeError: a module without a `Family`, two families of one name, model type or GGUF
        architecture, a size key held to no `MAX_SIZES` bound, or a config class with no owner (a
        mistake in the package, not in a user's input).
    """
    found: dict[str, Family] = {}
    for info in sorted(pkgutil.iter_modules(families_pkg.__path__), key=lambda m: m.name):
        if info.name.startswith("_"):
            continue
        family = importlib.import_module(f"{families_pkg.__name__}.{info.name}").FAMILY
        if not isinstance(family, Family) or family.name in found:
            raise RuntimeError(f"ppl_jax.models.families.{info.name}: FAMILY is not a new Family")
        found[family.name] = family
    types = [t for f in found.values() for t in f.hf_readers]
    if len(types) != len(set(types)):
        raise RuntimeError(f"two families read one Hugging Face model type: {sorted(types)}")
    unbounded = [
        f.name for f in found.values() if any(b not in MAX_SIZES for b, _ in f.hf_sizes.values())
    ]
    if unbounded:
        raise RuntimeError(f"families {unbounded}: hf_sizes names a bound not in MAX_SIZES")
    archs = [a for f in found.values() for a in f.gguf]
    if len(archs) != len(set(archs)):
        raise RuntimeError(f"two families read one GGUF architecture: {sorted(archs)}")
    for f in found.values():
        owner = found.get(f.config.FAMILY)
        if owner is None or (owner.config, owner.module) != (f.config, f.module):
            raise RuntimeError(f"family {f.name}: {f.config.FAMILY} does not own its config")
    return found


def model_types() -> tuple[str, ...]:
    """The Hugging Face model types ppl_jax reads, in the families' order."""
    return tuple(t for f in families().values() for t in f.hf_readers)


def for_model_type(model_type: Any) -> Family | None:
    """The family that reads Hugging Face `model_type`, or None."""
    return next((f for f in families().values() if model_type in f.hf_readers), None)


def gguf_architectures() -> tuple[str, ...]:
    """The GGUF architectures ppl_jax reads (`general.architecture` names), sorted."""
    return tuple(sorted(a for f in families().values() for a in f.gguf))


def for_gguf_architecture(arch: Any) -> GGUFArchitecture | None:
    """How the family that reads GGUF architecture `arch` reads it, or None."""
    if not isinstance(arch, str):
        return None
    return next((f.gguf[arch] for f in families().values() if arch in f.gguf), None)


def for_description(description: dict[str, Any]) -> Family:
    """The family of a description: the one that read its `model_type` from a Hugging Face
    config (a variant's own weight names), else the owner of its `family`.

    Raises:
      CheckpointError: an unknown family (naming the known ones).
    """
    name = description.get("family") if isinstance(description, dict) else None
    owner = families().get(name) if isinstance(name, str) else None
    if owner is None or owner.config.FAMILY != name:
        known = sorted({f.config.FAMILY for f in families().values()})
        raise CheckpointError(
            f"unknown model family {str(name)[:40]!r} in the checkpoint (supported: "
            f"{', '.join(known)})."
        )
    variant = for_model_type(description.get("model_type"))
    return variant if variant is not None and variant.config is owner.config else owner


def check_sizes(description: dict[str, Any]) -> None:
    """Every size of a description (`MAX_SIZES`' keys it has) is a positive integer within its
    bound (or 0, for those of `MAY_BE_ZERO`), every other number is finite, and each layer
    index list names layers that exist; checked before anything is built.

    Raises:
      CheckpointError: the first size out of bounds or number not finite, in one sentence.
    """
    for key, bound in MAX_SIZES.items():
        value = description.get(key)
        if value is None or (key in MAY_BE_ZERO and value == 0):
            continue
        if isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= bound:
            raise CheckpointError(
                f"the architecture's {key}={str(value)[:40]} is not a size ppl_jax builds "
                f"(a whole number from 1 to {bound:,}); check the config or description."
            )
    check_finite(description, "the architecture's ")
    layers = description.get("num_layers")
    for key, value in description.items():
        if key.endswith("_layers") and key != "num_layers" and isinstance(value, list | tuple):
            if any(isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < (layers or 0)
                   for i in value):  # fmt: skip
                raise CheckpointError(
                    f"the architecture's {key} name layers outside 0..{(layers or 0) - 1}."
                )


_LAYER_WEIGHT = re.compile(r"layers/(\d+)/")


def check_stored_layers(description: dict[str, Any], weights: Iterable[str], where: str) -> None:
    """Refuses a description whose `num_layers` the stored model weights contradict (names
    `layers/{i}/...`, as the checkpoint stores them or its mapping makes them); nothing when no
    weight names a layer.

    Raises:
      CheckpointError: another number of layers, naming `where`.
    """
    layers = {int(m.group(1)) for n in weights if (m := _LAYER_WEIGHT.match(n)) is not None}
    want = description.get("num_layers")
    if layers and want != len(layers):
        raise CheckpointError(
            f"{where}: the architecture describes {str(want)[:20]} layers but the checkpoint "
            f"stores {len(layers)}; give the architecture of these weights."
        )


def config_of(description: dict[str, Any]) -> Any:
    """The description's config (its family's `config.from_dict`), sizes checked first.

    Raises:
      CheckpointError: as `for_description` and `check_sizes`; unknown keys or values.
    """
    family = for_description(description)
    check_sizes(description)
    try:
        return family.config.from_dict(description)
    except (TypeError, ValueError) as e:
        raise CheckpointError(
            f"the stored {family.config.FAMILY} architecture has a value of the wrong type "
            f"({str(e)[:120]})."
        ) from None


def build(description: dict[str, Any], dtype: Any, attention: str = "xla") -> LanguageModel:
    """The `LanguageModel` of an architecture description (abstract: no weights allocated).

    Args:
      description: the JSON-able architecture (`config.to_dict()` of a family; what
        `ppl_jax.checkpoints.formats.safetensors.read_description` returns).
      dtype: the params' dtype (`jnp.float32` or `jnp.bfloat16`).
      attention: the attention implementation, `xla`, `cudnn`, `tokamax` or `splash`
        (`ppl_jax.models.layers.attention`); the model keeps packed windows apart
        (`honours_segments`) where it does (`attention.keeps_segments`). The model runs under
        a context axis (`context_parallel`) unless the family has a `context` limit for it.
        Its `origin` is `family:<name>`.

    Raises:
      CheckpointError: an unknown family, unknown keys, or a size out of bounds.
      ConfigError: an attention implementation the family refuses for this architecture.
    """
    family = for_description(description)
    cfg = config_of(description)
    reason = family.refusal(cfg, attention)
    if reason:
        raise ConfigError(
            f"model.attention={attention} is refused for this {family.name} model: {reason}; "
            f"set model.attention=xla."
        )
    module_fn = lambda: family.module(cfg, nnx.Rngs(0), dtype, attention)  # noqa: E731
    model = from_nnx(
        module_fn,
        cfg.vocab_size,
        cfg.max_positions,
        returns="hidden_states",
        honours_segments=attention_lib.keeps_segments(attention),
        description=cfg.to_dict(),
        dtype=jnp.dtype(dtype),
    )
    # A family's layers are per token or by positions, attention is `attend` and recurrences go
    # through `ppl_jax.models.layers.context.pass_state`: right under the context axis's token order
    # (`LanguageModel.context_parallel`) unless the family says otherwise (`Limit("context")`).
    return dataclasses.replace(
        model,
        context_parallel=family.refusal(cfg, "context") is None,
        origin=f"family:{family.name}",
    )


def context_refusal(description: Any) -> str | None:
    """Why the family of `description` refuses a context axis (its `context` limit), or None
    (also for a description that is no family's: a user's model says so itself)."""
    try:
        return for_description(description).refusal(config_of(description), "context")
    except CheckpointError:
        return None


def read_hf_config(config: dict[str, Any]) -> dict[str, Any]:
    """The description of a Hugging Face `config.json` dict, its sizes checked: by their own
    names before the family's reader runs (`bounds.check_hf_sizes` of `COMMON_HF_SIZES` and the
    family's `hf_sizes`), then the description's (`check_sizes`).

    Raises:
      CheckpointError: an unsupported `model_type` (naming the supported ones), a size out of
        bounds or a number that is not finite (naming the key), or as the family's reader;
        KeyError: a required field is missing.
    """
    family = for_model_type(config.get("model_type"))
    if family is None:
        raise CheckpointError(
            f"model_type {quoted(config.get('model_type'))} is not supported; ppl_jax loads "
            f"Hugging Face model types {', '.join(sorted(model_types()))}."
        )
    check_hf_sizes(config, {**COMMON_HF_SIZES, **family.hf_sizes})
    description = family.hf_readers[config["model_type"]](config).to_dict()
    check_sizes(description)
    return description


def hf_mapping(description: dict[str, Any]) -> tuple[tuple[str, ...], list[dict[str, Any]]]:
    """(stored-name prefixes, mapping rules) of a description's Hugging Face weights.

    Raises:
      CheckpointError: a family that reads no Hugging Face weights.
    """
    family = for_description(description)
    if family.hf_rules is None:
        raise CheckpointError(f"the {family.name} family reads no Hugging Face weights.")
    return family.hf_prefixes, family.hf_rules(description)
