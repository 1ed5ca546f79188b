"""A checkpoint's stored tree read through a mapping (`ppl_jax.checkpoints.mapping.language`) into a
model's params: what `Checkpoint.rules`, `mapping_report` and `restore` do for every reader
whose stored names are not the model's own (another trainer's Orbax tree, an Orbax v1 tree, ...),
from the reader's answers alone (`MappedReader`: `stored`, `read`, `rules`, `known`, `naming`)."""

from __future__ import annotations

from collections import defaultdict
from typing import Any, Protocol

import jax
import numpy as np

from ppl_jax.checkpoints.formats import damage
from ppl_jax.checkpoints.mapping import blocks, language, presets, storage
from ppl_jax.checkpoints.options import Stored
from ppl_jax.errors import CheckpointError
from ppl_jax.models.interface import nest_weights, weight_paths

READ_GROUP_BYTES = 1 << 30  # stored bytes read at a time


class MappedReader(Protocol):
    """What this module asks of a checkpoint (`ppl_jax.checkpoints.checkpoint.Checkpoint`
    answers it): the reader protocol's `resolve_step`, `stored` and `read`, and the mapping's
    hooks (`mapping`, `mapping_file`, `rules`, `known`, `naming`), which a reader may override."""

    mapping: str

    def resolve_step(self, step: int | None) -> int | None: ...

    def stored(self, step: int | None) -> Stored: ...

    def read(
        self, step: int | None, abstract: dict[str, jax.ShapeDtypeStruct]
    ) -> dict[str, jax.Array]: ...

    def mapping_file(self) -> dict[str, Any]: ...

    def rules(self, step: int | None = None) -> list[dict[str, Any]]: ...

    def known(self, step: int | None) -> dict[str, Any]: ...

    def naming(self, step: int | None) -> str: ...


class MappedHooks:
    """The mapping's hooks of `ppl_jax.checkpoints.checkpoint.Checkpoint` (a mixin it inherits):
    what `rules`, `sources`, `restore` and `report` below ask of a checkpoint besides its reader
    protocol, each with the default every reader gets and may override (a layout's own rules,
    its own naming in sentences, the weights it makes). They read the checkpoint's own answers:
    `path`, `mapping`, `given_architecture`, `description`, `carried_description`, `model`,
    `resolve_step` and `stored`."""

    def mapping_file(self) -> dict[str, Any]:
        """`checkpoint.mapping`'s file (`item`, `params`, `rules`), or {} for a preset or none.

        Raises:
          CheckpointError, ConfigError: as `presets.read_file`.
        """
        if self.mapping and self.mapping not in presets.PRESETS:
            return presets.read_file(self.mapping)
        return {}

    def known(self, step: int | None) -> dict[str, Any]:
        """The architecture's description where one is known (`{}` when the checkpoint carries
        none and none is given: the caller brings the model), for the mapping's expressions."""
        kind, _ = self.given_architecture()
        if kind == "none" and self.carried_description(step) is None:
            return {}
        return self.description(step)

    def naming(self, step: int | None) -> str:
        """The checkpoint, step and mapping, for the sentences of the mapping's errors."""
        at = f" step {step}" if step is not None else ""
        return f"{self.path!r}{at} (mapping {self.mapping or 'detected'})"

    def rules(self, step: int | None = None) -> list[dict[str, Any]]:
        """The mapping rules from the stored names to the model's (`rules`)."""
        return rules(self, step)

    def mapping_report(self, step: int | None, target: Any) -> list[str]:
        """How the stored names become the weights of `target`, one line each (`ppl-jax
        inspect`; `report`)."""
        return report(self, step, target)

    def produced(self, step: int | None, description: dict[str, Any]) -> list[str] | None:
        """The model weights the stored tensors make (their names), from the stored tree's
        metadata and the mapping alone; None where the reader checks its architecture itself
        (a Hugging Face directory's `config.json` against its headers).

        Raises:
          CheckpointError: as `stored` and `rules`.
        """
        step = self.resolve_step(step)
        return list(language.produced(self.rules(step), self.stored(step), description, ""))


def rules(ckpt: MappedReader, step: int | None) -> list[dict[str, Any]]:
    """The mapping rules of a checkpoint: `checkpoint.mapping`'s file or preset, else the preset
    its stored names look like (`presets.detect`), else `identity`.

    Raises:
      CheckpointError: as `presets.read_file`, `presets.rules_for` and `Checkpoint.stored`.
    """
    file = ckpt.mapping_file()
    if file:
        return file["rules"]
    name = ckpt.mapping or presets.detect(list(ckpt.stored(step))) or "identity"
    return presets.rules_for(name, ckpt.known(step))


def sources(ckpt: MappedReader, step: int | None, target: Any) -> dict[str, language.Source]:
    """Which stored tensor (layer, part, operations) gives each model weight of `target` (leaves
    with `.shape`), read from the tree metadata only.

    Raises:
      CheckpointError: as `language.resolve` (the first unmatched names).
    """
    step = ckpt.resolve_step(step)
    return language.resolve(
        ckpt.rules(step), ckpt.stored(step), weight_paths(target), ckpt.known(step),
        ckpt.naming(step),
    )  # fmt: skip


def restore(ckpt: MappedReader, step: int | None, target: Any) -> Any:
    """The model's params from the stored tree through the checkpoint's rules, in the target
    shardings.

    Each stored tensor is read once onto the devices (`Checkpoint.read`), with the sharding under
    which each device's shard holds what its blocks of the model weights need
    (`blocks.stored_sharding`: each process reads only the chunks of its own shards), and the
    model weights are made block by block from it (`blocks.place`, reading through
    `storage.DeviceArrays`); tensors are read in groups of about `READ_GROUP_BYTES`, each
    dropped once its weights are made.

    Raises:
      CheckpointError: as `language.resolve` (unmatched names, shapes) and `Checkpoint.read`.
    """
    step = ckpt.resolve_step(step)
    stored = ckpt.stored(step)
    expected = weight_paths(target)
    names = ckpt.known(step)
    where = ckpt.naming(step)
    found = language.resolve(ckpt.rules(step), stored, expected, names, where)
    numbers = {k: v for k, v in names.items() if isinstance(v, int | float)}
    out: dict[str, Any] = {}
    for group in blocks.read_groups(found, stored, READ_GROUP_BYTES):
        pieces: dict[str, list] = defaultdict(list)
        for weight in group:
            for piece in found[weight].pieces:
                pieces[piece.stored].append((piece, expected[weight]))
        abstract = {}
        for name, used in pieces.items():
            shape, dtype = stored[name]
            sharding = blocks.stored_sharding(used, shape, stored, numbers)
            abstract[name] = jax.ShapeDtypeStruct(shape, np.dtype(dtype), sharding=sharding)
        read = ckpt.read(step, abstract)
        for name, array in read.items():
            if not isinstance(array, jax.Array):
                raise CheckpointError(
                    f"{where}: stored '{name}' did not restore as an array "
                    f"(got {type(array).__name__})."
                )
        made = blocks.place(
            {w: found[w] for w in group}, stored, {w: expected[w] for w in group},
            storage.DeviceArrays(read), numbers,
        )  # fmt: skip
        out.update(jax.block_until_ready(made))
        for array in read.values():
            array.delete()
    damage.check_restored(out, expected, where)
    return nest_weights(out)


def describe(src: language.Source) -> str:
    """The operations a mapping applies to make one model weight, in words (`ppl-jax
    inspect`): the layer and part taken, transpose, reshape, cut, RoPE order, scale, `1+w`."""
    rule = src.rule
    parts = []
    if src.layer is not None:
        parts.append(f"layer {src.layer} of axis {rule['layers']['axis']}")
    if src.part is not None:
        parts.append(f"part {src.part} of axis {rule['split']['axis']}")
    for key in ("transpose", "reshape", "cut"):
        if key in rule:
            parts.append(f"{key} {rule[key]}")
    if "rope" in rule:
        parts.append("rope interleaved->half")
    if src.scale != 1.0:
        parts.append(f"x{src.scale:.6g}")
    if rule.get("plus_one"):
        parts.append("1+w")
    if rule.get("offset"):
        parts.append(f"{rule['offset']:+g}")
    return ", ".join(parts)


def report(ckpt: MappedReader, step: int | None, target: Any) -> list[str]:
    """Each model weight of `target` with the stored tensor it comes from and the operations
    (`listing`), or the one sentence naming the first unmatched names.

    Raises:
      CheckpointError: as `sources`, other than the mapping's own mistakes.
    """
    try:
        found = sources(ckpt, step, target)
    except CheckpointError as e:
        return [f"mapping: {e}"]
    return listing(found, "every stored array used")


def listing(found: dict[str, language.Source], how: str, shown: Any = None) -> list[str]:
    """`found` (model weight -> Source) one line each under a heading that says `how`: the
    weight, the stored tensor (`shown(name)`: the name as stored) and the operations."""
    shown = shown or (lambda name: name)
    lines = [f"mapped weights ({len(found)}, {how}):"]
    width = max((len(n) for n in found), default=0)
    for weight, src in found.items():
        ops = describe(src)
        stored = shown(src.stored) + (f" .. ({len(src.parts)} parts)" if src.parts else "")
        lines.append(f"  {weight:<{width}} <- {stored}" + (f"  [{ops}]" if ops else ""))
    return lines
