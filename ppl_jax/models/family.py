"""A model family's record (`Family`), the kind of one of its layers (`Layer`), and what it refuses
(`Limit`): the types every family module (`ppl_jax.models.families`) fills in and the registry
(`ppl_jax.models.registry`) collects. A leaf: it imports no family and not the registry, so that
the registry alone imports the families.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

from ppl_jax.models.gguf_names import GGUFArchitecture

MIXERS = ("attention", "linear_attention", "state_space", "none")
MLPS = ("dense", "moe", "none")


@dataclasses.dataclass(frozen=True)
class Layer:
    """The kind of one layer: its sequence mixer (`attention`, `linear_attention`,
    `state_space`, or `none`: an MLP alone, as Nemotron-H's) and its MLP (`dense`, `moe`,
    `none`), and a note (`sliding`, `nope`, ...)."""

    mixer: str = "attention"
    mlp: str = "dense"
    note: str = ""


@dataclasses.dataclass(frozen=True)
class Limit:
    """Something a family refuses, and why.

    Attributes:
      setting: what is refused: `context` (a context-parallel mesh axis), an attention
        implementation (`cudnn`, `splash`), or another name a caller asks about.
      reason: the sentence's reason ("its MoE layer routes over the data axis only").
      applies: `config -> bool`, whether this description is refused (default: always).
    """

    setting: str
    reason: str
    applies: Callable[[Any], bool] = lambda cfg: True


@dataclasses.dataclass(frozen=True)
class Family:
    """A model family (see `ppl_jax.models.registry`'s docstring).

    Attributes:
      name: the family's name (its module's); the owner of `config` when equal to its `FAMILY`.
      config: the description's config class: `FAMILY` (the description's `family`),
        `from_dict(description)`, `to_dict()`, and `vocab_size`, `max_positions` fields.
      module: the NNX module, `module(cfg, rngs, dtype, attention)`, whose `__call__(tokens,
        positions, segment_ids)` returns hidden states and `unembedding()` `[embed, vocab]`.
      hf_readers: Hugging Face `model_type` -> reader of its `config.json` dict into a `config`
        (raising `CheckpointError` in one sentence; a KeyError names a missing field).
      hf_rules: description dict -> the mapping rules of its Hugging Face weights (names with
        `hf_prefixes` removed), or None when the family reads no Hugging Face weights.
      hf_prefixes: heads of stored names that the rules do not see (`model.`), longest first.
      gguf: GGUF architecture (llama.cpp's `general.architecture`) -> how the family reads a
        file of it (`ppl_jax.models.gguf_names.GGUFArchitecture`).
      hf_sizes: the sizes of its `config.json`s that not every family names alike (those are
        `ppl_jax.models.bounds.COMMON_HF_SIZES`): key -> (the `MAX_SIZES` bound it is held to,
        its least value), checked before its reader runs (`bounds.check_hf_sizes`).
      layers: config -> the `Layer` of each layer (default: attention and a dense MLP).
      limits: what the family refuses (`Limit`).
    """

    name: str
    config: type
    module: type
    hf_readers: Mapping[str, Callable[[dict[str, Any]], Any]] = dataclasses.field(
        default_factory=dict
    )
    hf_rules: Callable[[dict[str, Any]], list[dict[str, Any]]] | None = None
    hf_prefixes: tuple[str, ...] = ()
    gguf: Mapping[str, GGUFArchitecture] = dataclasses.field(default_factory=dict)
    hf_sizes: Mapping[str, tuple[str, int]] = dataclasses.field(default_factory=dict)
    layers: Callable[[Any], tuple[Layer, ...]] | None = None
    limits: tuple[Limit, ...] = ()

    def layer_kinds(self, cfg: Any) -> tuple[Layer, ...]:
        """The kind of each of `cfg`'s layers."""
        if self.layers is not None:
            return tuple(self.layers(cfg))
        return tuple(Layer() for _ in range(int(getattr(cfg, "num_layers", 0))))

    def refusal(self, cfg: Any, setting: str) -> str | None:
        """The reason this family refuses `setting` for `cfg`, or None."""
        return next(
            (x.reason for x in self.limits if x.setting == setting and x.applies(cfg)), None
        )
