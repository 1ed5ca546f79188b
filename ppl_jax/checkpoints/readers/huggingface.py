"""Hugging Face checkpoints as readers: a directory (`HFDirectory`: `config.json` and safetensors
weights, one file or shards listed in `model.safetensors.index.json`, local or on a bucket) and a
hub repository (`HubRepo`: a hub id `hf://org/name[@revision]` or a hub cache's repository
folder, whose step revisions are its steps; `ppl_jax.checkpoints.formats.hub`).

The architecture is `config.json`'s (`ppl_jax.checkpoints.formats.safetensors.read_description`),
the tokenizer the directory's own (`safetensors.read_tokenizer`). A local directory's weights are read as
`safetensors.load_params` reads them (each device's block from the memory-mapped file); a remote one's
(`gs://`, `s3://`, `az://`) by byte ranges (`ppl_jax.checkpoints.formats.safetensors_ranges`): each
process fetches only the ranges of its own devices' blocks, in parallel, within a bound on host
memory (`ppl_jax.checkpoints.mapping.storage.place`).
"""

from __future__ import annotations

import os
from typing import Any

import jax
import numpy as np

from ppl_jax import tokenizer as tokenizer_lib
from ppl_jax.checkpoints import mapping
from ppl_jax.checkpoints.checkpoint import Checkpoint, Options, Stored
from ppl_jax.checkpoints.formats import hub, safetensors
from ppl_jax.checkpoints.formats import safetensors_ranges as ranges
from ppl_jax.checkpoints.mapping import apply, blocks, storage
from ppl_jax.checkpoints.quantized import parts as quantized_parts
from ppl_jax.checkpoints.quantized import rows as quantized_rows
from ppl_jax.errors import CheckpointError
from ppl_jax.models import registry
from ppl_jax.models.interface import nest_weights, weight_paths
from ppl_jax.models.layers.packed import Layout
from ppl_jax.runtime import paths


def weight_files(folder: str) -> list[str]:
    """The safetensors files of a directory: the shards its index lists, or `model.safetensors`.

    Raises:
      CheckpointError: an index naming a file outside the directory (absolute, `..`, or a link
        leading out) or a missing shard; only pickled weights; no weights.
    """
    index = paths.join(folder, safetensors.INDEX)
    if paths.isfile(index):
        weight_map = paths.read_json_object(index, "").get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise CheckpointError(f"{index!r} has no weight_map; re-download the checkpoint.")
        files = sorted({str(f) for f in weight_map.values()})
        for name, file in weight_map.items():
            if not isinstance(file, str) or not _inside(folder, file):
                raise CheckpointError(
                    f"{index!r} names the shard {file!r} (for {name!r}), which lies outside the "
                    f"checkpoint directory {folder!r}; weights are read only from files inside it."
                )
        for file in files:
            if not paths.isfile(paths.join(folder, file)):
                raise CheckpointError(
                    f"{folder!r}: {safetensors.INDEX} lists the shard {file!r}, which is missing; "
                    f"download every shard of the checkpoint."
                )
        return files
    if paths.isfile(paths.join(folder, safetensors.SINGLE)):
        if not _inside(folder, safetensors.SINGLE):
            raise CheckpointError(
                f"{paths.join(folder, safetensors.SINGLE)!r} is a link outside the checkpoint directory "
                f"{folder!r}; weights are read only from files inside it."
            )
        return [safetensors.SINGLE]
    pickles = sorted(n for n in paths.listdir(folder) if n.endswith(safetensors.PICKLE_SUFFIXES))
    if pickles:
        raise CheckpointError(
            f"{folder!r} holds only pickled PyTorch weights ({', '.join(pickles)}); ppl_jax "
            f"reads safetensors only and never unpickles (unpickling runs code). Convert them "
            f"where you trust the file: model.save_pretrained(dir, safe_serialization=True)."
        )
    raise CheckpointError(
        f"{folder!r} has no {safetensors.SINGLE} or {safetensors.INDEX}; give a Hugging Face directory with "
        f"safetensors weights."
    )


def _inside(folder: str, file: str) -> bool:
    if os.path.isabs(file) or ".." in file.replace("\\", "/").split("/") or not file:
        return False
    if paths.is_local(folder):
        return paths.resolves_inside(folder, file)[1]
    return paths.scheme(file) is None


class HFDirectory(Checkpoint):
    """A Hugging Face directory (see the module docstring): one set of weights, no steps."""

    format = "hf"
    formats = ("hf",)
    layout_name = "a Hugging Face directory"
    tokenizer_files = "no tokenizer.json or tokenizer.model in the directory"

    def __init__(self, path: str, options: Options | None = None, why: str = ""):
        super().__init__(path, options, why)
        self._entries: dict[str, dict[str, ranges.TensorRange]] = {}

    @classmethod
    def claims(cls, path: str, options: Options) -> str | None:
        if paths.isfile(paths.join(path, "config.json")):
            return "a config.json (a Hugging Face directory)"
        return None

    def folder(self, step: int | None) -> str:
        """The directory holding the weights of `step`."""
        return self.path

    def steps(self) -> list[int]:
        return []

    def resolve_step(self, step: int | None) -> int | None:
        return None

    def entries(self, step: int | None) -> dict[str, ranges.TensorRange]:
        """The stored tensors of the step's directory, from the safetensors headers.

        Raises:
          CheckpointError: as `weight_files` and `safetensors_ranges.read_headers`.
        """
        folder = self.folder(step)
        if folder not in self._entries:
            self._entries[folder] = ranges.read_headers(folder, weight_files(folder))
        return self._entries[folder]

    def stored(self, step: int | None) -> Stored:
        return {n: (e.shape, ranges.DTYPES[e.dtype]) for n, e in self.entries(step).items()}

    def read(self, step: int | None, abstract: dict[str, jax.ShapeDtypeStruct]) -> dict[str, Any]:
        folder, entries = self.folder(step), self.entries(step)
        return storage.place(
            abstract, lambda name, index: ranges.read_block(folder, entries[name], index)
        )

    def carried_description(self, step: int | None) -> dict[str, Any] | None:
        return safetensors.read_description(self.folder(step))

    def stored_tokenizer(self, step: int | None) -> tokenizer_lib.Tokenizer | None:
        folder = self.folder(step)
        return safetensors.read_tokenizer(folder) if safetensors.has_tokenizer(folder) else None

    def restore(self, step: int | None, target: Any) -> Any:
        """The weights through `config.json`'s family's mapping rules, each device's block read on
        its own: `safetensors.load_params` for a local directory, byte ranges for a remote one
        (`load_ranged`).

        Raises:
          CheckpointError: as `safetensors.load_params` (missing, misshapen or unused weights, named).
        """
        folder = self.folder(step)
        if paths.is_local(folder):
            return safetensors.load_params(folder, target)
        return load_ranged(folder, self.entries(step), target)

    def files(self, step: int | None) -> str:
        return self.folder(step)

    def device_layouts(
        self, step: int | None, abstract: dict[str, Any]
    ) -> tuple[dict[str, Layout], dict[str, str]]:
        """Each model weight made of quantized weights (config.json's quantization_config)
        whose rule moves whole output rows, kept packed as one record per output row
        (`ppl_jax.checkpoints.quantized.rows`); the other quantized weights with the reason.
        Read from the headers, and each act-order weight's `g_idx` (a few KiB)."""
        folder = self.folder(step)
        weights, stored, rules, desc, source = _mapped_headers(folder, self.entries(step))
        if not isinstance(source, quantized_parts.Dequantized):
            return {}, {}
        sources = mapping.resolve(
            rules, stored, abstract, desc, f"the weights in {folder!r} do not match its "
            f"config.json", shown=weights.real,
            remedy="Re-download the checkpoint, or fix config.json to describe these weights.",
        )  # fmt: skip
        numbers = {k: v for k, v in desc.items() if isinstance(v, int | float)}
        return quantized_rows.layouts(source, sources, stored, abstract, numbers)

    def quantization(self, step: int | None) -> dict[str, Any] | None:
        """config.json's quantization (`safetensors.read_quantization`'s `Scheme.record`), or None.

        Raises:
          CheckpointError: a method or parameter ppl_jax does not read.
        """
        scheme = safetensors.read_quantization(self.folder(step))
        return None if scheme is None else scheme.record()

    def produced(self, step: int | None, description: dict[str, Any]) -> list[str] | None:
        return None  # config.json is checked against the headers by safetensors.read_description

    def mapping_report(self, step: int | None, target: Any) -> list[str]:
        """Each model weight with the stored tensor it comes from, by the rules of config.json's
        family (`registry.hf_mapping`), or the sentence naming what does not match."""
        folder = self.folder(step)
        weights, stored, rules, desc, _ = _mapped_headers(folder, self.entries(step))
        try:
            found = mapping.resolve(
                rules, stored, weight_paths(target), desc,
                f"the weights in {folder!r} do not match its config.json", shown=weights.real,
            )  # fmt: skip
        except CheckpointError as e:
            return [f"mapping: {e}"]
        return apply.listing(found, "the rules of config.json's family", weights.real)

    def layout_lines(self, step: int | None) -> list[str]:
        folder = self.folder(step)
        entries = self.entries(step)
        files = sorted({e.file for e in entries.values()})
        size = sum(e.end - e.begin for e in entries.values())
        how = "memory-mapped" if paths.is_local(folder) else "read by byte ranges"
        index = (
            f"{safetensors.INDEX} -> {len(files)} shards"
            if files != [safetensors.SINGLE]
            else safetensors.SINGLE
        )
        found = [
            n for n in ("tokenizer.json", "tokenizer.model") if paths.isfile(paths.join(folder, n))
        ]
        config = safetensors.read_config(folder)
        scheme = safetensors.read_quantization(folder, config)
        stored = "" if scheme is None else f", dequantized as read from {scheme.describe()}"
        return [
            f"config.json: model_type {safetensors._config(folder, config)[0].get('model_type')!r}",
            f"weights: {index}, {len(entries)} tensors, {size / 2**20:.1f} MiB ({how}{stored})",
            f"tokenizer: {', '.join(found) or 'none'}",
        ]


class RangedSafetensors(safetensors.Safetensors):
    """A directory's safetensors tensors read by byte ranges, as a `storage.Storage`
    (`safetensors.Safetensors`' names and checks, each region fetched as the byte ranges that hold it:
    `safetensors_ranges.read_block`), from a local file or a bucket."""

    def __init__(self, folder: str, entries: dict[str, ranges.TensorRange]):
        self.path, self.entries = folder, entries
        self.file_of = {name: entry.file for name, entry in entries.items()}

    def slice(self, name: str) -> ranges.RangedSlice:
        return ranges.RangedSlice(self.path, self.entries[name])

    def read(self, stored_name: str, index: tuple[slice, ...]) -> np.ndarray:
        """The region `index` of a stored tensor (`storage.Storage.read`)."""
        return self.slice(self.real(stored_name))[index]


def _mapped_headers(
    folder: str, entries: dict[str, ranges.TensorRange]
) -> tuple[RangedSafetensors, dict[str, Any], list[dict[str, Any]], dict[str, Any], Any]:
    """(the storage, its tensors by the rules' names, the family's rules, the description, the
    storage to read them from) of a directory, from `config.json` and the headers: a quantized
    checkpoint's weights seen dequantized (`quantized_parts.view`).

    Raises:
      CheckpointError: as `safetensors.read_description` and `quantized_parts.view`.
    """
    config = safetensors.read_config(folder)
    desc = safetensors.read_description(folder, config)
    text_only = safetensors._config(folder, config)[1]  # a multimodal checkpoint: its text tower
    prefixes, rules = registry.hf_mapping(desc)
    weights = RangedSafetensors(folder, entries)
    stored = weights.stored(prefixes, text_only)
    where = f"the weights in {folder!r}"
    source, stored = quantized_parts.view(
        safetensors.read_quantization(folder, config), weights, stored, weights.real, where
    )
    return weights, stored, rules, desc, source


def load_ranged(folder: str, entries: dict[str, ranges.TensorRange], target: Any) -> Any:
    """A remote Hugging Face directory's weights into the target shardings, by byte ranges:
    `safetensors.load_params`' mapping (its family's rules, `registry.hf_mapping`) and blocks
    (`blocks.read_block`: each device's block from the stored region it needs) over a
    `RangedSafetensors` storage, placed by `storage.place` (several blocks at once, host memory
    bounded).

    Raises:
      CheckpointError: as `safetensors.load_params` (non-float weights; missing, misshapen or unused
        weights, named); a damaged file.
    """
    weights, stored, rules, desc, source = _mapped_headers(folder, entries)
    expected = weight_paths(target)
    quantized_parts.check_floats(stored, weights.real, f"the weights in {folder!r}")
    sources = mapping.resolve(
        rules, stored, expected, desc, f"the weights in {folder!r} do not match its config.json",
        shown=weights.real,
        remedy="Re-download the checkpoint, or fix config.json to describe these weights.",
    )  # fmt: skip
    numbers = {k: v for k, v in desc.items() if isinstance(v, int | float)}
    placed = quantized_rows.place(
        blocks.place_read_ahead, source, sources, stored, expected, numbers
    )
    return nest_weights(placed)


class HubRepo(HFDirectory):
    """A hub repository (see the module docstring): its revision's snapshot is the directory;
    its step revisions (`step1000`, ...) are its steps."""

    format = "hub"
    formats = ()  # a hub id is one whatever checkpoint.format says
    layout_name = "a Hugging Face hub repository"
    tokenizer_files = "no tokenizer.json or tokenizer.model in the revision"

    def __init__(self, path: str, options: Options | None = None, why: str = ""):
        super().__init__(path, options, why)
        allow = self.options.allow_download
        self.repo = (
            hub.open_repo(path, allow) if hub.is_hub_id(path) else hub.repo_of_folder(path, allow)
        )

    @classmethod
    def claims(cls, path: str, options: Options) -> str | None:
        if hub.is_hub_id(path):
            return "a hub id (hf://org/name[@revision], or org/name that is not a path)"
        if hub.is_repo_folder(path):
            return "a hub cache's repository folder (models--org--name with refs/, snapshots/)"
        return None

    def folder(self, step: int | None) -> str:
        return self.repo.snapshot(step)

    def links_scope(self, step: int | None) -> tuple[str, str]:
        """The revision's snapshot, whose files may lead into the repository's `blobs` only."""
        folder = self.folder(step)
        return folder, folder

    def steps(self) -> list[int]:
        return self.repo.steps()

    def resolve_step(self, step: int | None) -> int | None:
        """A step revision, or None for the id's own revision (a repository folder's: the latest
        step revision).

        Raises:
          CheckpointError: a revision not in the cache (offline) or not on the hub.
        """
        if step is None and self.repo.steps_only and self.repo.steps():
            step = self.repo.steps()[-1]
        self.repo.snapshot(step)
        return step

    def identity(self, step: int | None) -> dict[str, Any]:
        return {
            **super().identity(step),
            "repo": self.repo.repo_id,
            "revision": self.repo.revision_of(step),
            "commit": self.repo.commit(step),
        }

    def layout_lines(self, step: int | None) -> list[str]:
        step = self.resolve_step(step)
        revision = self.repo.revision_of(step)
        return [
            f"repository {self.repo.repo_id}, revision {revision} = commit "
            f"{self.repo.commit(step)}",
            *super().layout_lines(step),
        ]
