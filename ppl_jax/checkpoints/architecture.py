"""A checkpoint's architecture: the `Architecture` of a step, resolved once (`resolve`), from which
the run, the reference model, LongPPL's evaluator and the harness build their model and choose its
attention; `Checkpoint.description` says where it comes from (the checkpoint's own, or
`checkpoint.architecture`: `ppl_jax.checkpoints.given`).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp

from ppl_jax.checkpoints.given import entry_model
from ppl_jax.checkpoints.options import dtype_of
from ppl_jax.errors import CheckpointError
from ppl_jax.models import registry
from ppl_jax.models.interface import LanguageModel, nest_weights, weight_paths
from ppl_jax.models.layers import attention as attention_lib
from ppl_jax.models.layers.packed import Packed

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
      family: its family (`ppl_jax.models.family.Family`), or None for an entry point.
      entry: the `checkpoint.architecture` entry point `module:function`, or "".
    """

    description: dict[str, Any] | None
    family: Any = None
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
          ConfigError: an unknown dtype or setting; an implementation this platform (the mesh's
            devices') lacks.
        """
        if self.entry:
            return "xla"
        context = {}
        if mesh is not None:
            context = dict(
                context=int(mesh.shape["context"]),
                context_attention=context_attention,
                platform=mesh.devices.flat[0].platform,
            )
        return attention_lib.resolve_for(setting, dtype_of(dtype), self.description, **context)

    def model(self, dtype: str = "float32", attention: str = "auto") -> LanguageModel:
        """The model (abstract params, no weights): the family's, or the entry point's own.

        Args:
          dtype: the params' dtype, `float32` or `bfloat16`.
          attention: an implementation (`xla`, `cudnn`, `tokamax`, `splash`) or `auto`, resolved here
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
    against the stored weights (`check_stored_layers`) before anything is built. Its
    `model(dtype, attention)` is the step's model (abstract params, no weights); public as
    `ppl_jax.resolve_architecture`:

        model = ppl_jax.resolve_architecture(ckpt).model(dtype="bfloat16")

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
    registry.config_of(description)  # sizes checked before anything reads them
    check_stored_layers(ckpt, step, description)
    return Architecture(description, registry.for_description(description))


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


DEQUANTIZE = ("auto", "device", "host")  # checkpoint.dequantize


@dataclasses.dataclass(frozen=True)
class Dequantization:
    """Where a checkpoint's quantized weights are dequantized (`packed`): what results.json keeps
    (`quantization.dequantized`, docs/outputs.md).

    Attributes:
      setting: `checkpoint.dequantize` (`auto`, `device` or `host`).
      device: the weights kept packed on the device, by name -> block type.
      host: the quantized weights dequantized on the host, by name -> why.
      packed_bytes: the device's bytes of the packed weights (all devices' shards together).
    """

    setting: str = "auto"
    device: dict[str, str] = dataclasses.field(default_factory=dict)
    host: dict[str, str] = dataclasses.field(default_factory=dict)
    packed_bytes: int = 0

    def record(self) -> dict[str, Any]:
        kinds: dict[str, int] = {}
        for kind in self.device.values():
            kinds[kind] = kinds.get(kind, 0) + 1
        return {
            "setting": self.setting,
            "on_device": len(self.device),
            "on_host": len(self.host),
            "device_types": dict(sorted(kinds.items())),
            "packed_bytes": self.packed_bytes,
            "host_reasons": dict(sorted(set(self.host.items()))[:8]),
        }

    def note(self) -> str:
        """One line for the run's summary where some quantized weights are dequantized on the
        host, else ''."""
        if not self.host or self.setting == "host":
            return ""
        first = sorted(self.host.items())[0]
        return (
            f"{len(self.host)} quantized weight(s) dequantized on the host, not packed on the "
            f"device ({first[0]}: {first[1]})."
        )


def packed(
    ckpt: Checkpoint, step: int | None, model: LanguageModel, setting: str = "auto"
) -> tuple[LanguageModel, Dequantization]:
    """`model` with the checkpoint's quantized weights kept packed on the device where the
    format dequantizes them there (`Checkpoint.device_layouts`; `ppl_jax.models.layers.packed`):
    its `abstract_params` hold a `Packed` leaf of `jax.ShapeDtypeStruct` blocks for each, so its
    targets, shardings and compiled step take the blocks. `setting` `host` keeps every weight a
    float one (dequantized on the host as it is read); `auto` and `device` pack what can be
    packed (`device` refuses a checkpoint none of whose quantized weights can).

    Raises:
      CheckpointError: `device` with quantized weights none of which has a device path.
    """
    if setting not in DEQUANTIZE:
        raise CheckpointError(
            f"checkpoint.dequantize={setting!r} is not one of {', '.join(DEQUANTIZE)}."
        )
    if setting == "host":
        return model, Dequantization(setting)
    flat = weight_paths(model.abstract_params)
    layouts, host = ckpt.device_layouts(step, flat)
    if setting == "device" and host and not layouts:
        name, why = sorted(host.items())[0]
        raise CheckpointError(
            f"checkpoint.dequantize=device, but no quantized weight of {ckpt.path!r} can be "
            f"dequantized on the device ({name}: {why}); set checkpoint.dequantize=host."
        )
    if not layouts:
        return model, Dequantization(setting, {}, host)
    for name, layout in layouts.items():
        flat[name] = Packed(jax.ShapeDtypeStruct(layout.packed_shape, jnp.uint8), layout)
    device = {name: layout.kind for name, layout in layouts.items()}
    size = sum(layout.nbytes for layout in layouts.values())
    abstract = nest_weights(flat)
    return dataclasses.replace(model, abstract_params=abstract), Dequantization(
        setting, device, host, size
    )
