"""A GGUF file (llama.cpp's format) as a reader: `checkpoint.dir=model.gguf`, or a folder holding
one `.gguf` file, opens by path alone; so does a split model (`model-00001-of-00003.gguf`, ...:
`ppl_jax.checkpoints.formats.gguf_split`) by any of its parts or their folder, read in place.

- The file's header is read and checked by `ppl_jax.checkpoints.formats.gguf_file` (its own walk
  of the published layout, every count and extent checked against the file's size) when the
  checkpoint is first asked anything, before any weight is read; a split model's, every part's.
- The architecture is the metadata's (`general.architecture` and its keys), described as the
  Hugging Face reader describes the original model (`ppl_jax.checkpoints.readers.gguf_arch`, with
  the family that declares the architecture: `Family.gguf`); its sizes are checked
  (`registry.check_sizes`) before anything is built.
- The tokenizer is the metadata's (`ppl_jax.tokenizer.gguf`).
- The weights are read through the GGUF mapping rules of that family (`gguf_arch.rules`, the
  one mapping language), each device's block from the byte ranges that hold it, dequantized by
  `gguf.quants.dequantize` into the model's dtype (float32 where a rule adds to the values:
  Gemma's norms) and placed straight into its sharding, several blocks at once within a bound on
  host memory (`ppl_jax.checkpoints.mapping.storage.place`). These are weight-only semantics: the
  activations stay in the model's dtype, where llama.cpp also quantizes them for its integer
  dot products (docs/checkpoints.md).
"""

from __future__ import annotations

import copy
import os
from typing import Any

import gguf
import numpy as np

from ppl_jax import tokenizer as tokenizer_lib
from ppl_jax.checkpoints import mapping
from ppl_jax.checkpoints.checkpoint import Checkpoint, Options, Stored
from ppl_jax.checkpoints.formats import gguf_file, gguf_split
from ppl_jax.checkpoints.mapping import apply, blocks, storage
from ppl_jax.checkpoints.quantized import ggml
from ppl_jax.checkpoints.readers import gguf_arch
from ppl_jax.errors import CheckpointError
from ppl_jax.models.interface import nest_weights, weight_paths
from ppl_jax.models.layers.packed import Layout, is_packed
from ppl_jax.runtime import fingerprint as fingerprint_lib
from ppl_jax.runtime import paths
from ppl_jax.tokenizer import gguf as gguf_tokenizer

SUFFIX = ".gguf"
FLOAT_TYPES = frozenset({"F32", "F16", "BF16"})  # read as floats, never packed
MAX_FACTORS = 1 << 16  # values of a rotary-factor tensor (one per frequency of a head)
# llama.cpp's `llama_ftype` names of `general.file_type` (what the file was quantized as), from
# the gguf package's `LlamaFileType`: 0 is "F32", 15 "Q4_K_M", 38 "MXFP4_MOE".
FILE_TYPES = {
    t.value: "F32" if t.name == "ALL_F32" else t.name.removeprefix("MOSTLY_")
    for t in gguf.LlamaFileType
    if t.name != "GUESSED"
}


def _gguf_files(folder: str) -> list[str]:
    return sorted(n for n in os.listdir(folder) if n.endswith(SUFFIX))


def _has_magic(path: str) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(4) == gguf_file.MAGIC
    except OSError:
        return False


class GGUFCheckpoint(Checkpoint):
    """A GGUF file (see the module docstring): one set of weights, no steps."""

    format = "gguf"
    formats = ("gguf",)
    layout_name = "a GGUF file"
    tokenizer_files = "no tokenizer.ggml.tokens in the GGUF metadata"

    def __init__(self, path: str, options: Options | None = None, why: str = ""):
        super().__init__(path, options, why)
        self._header: gguf_file.GGUFFile | None = None
        self._description: dict[str, Any] | None = None

    @classmethod
    def claims(cls, path: str, options: Options) -> str | None:
        if not paths.is_local(path):
            return "a .gguf file" if path.endswith(SUFFIX) else None
        if os.path.isfile(path):
            magic = _has_magic(path)
            if path.endswith(SUFFIX) or magic:
                return "a .gguf file" + (" (GGUF magic)" if magic else "")
            return None
        if not os.path.isdir(path):
            return None
        found = _gguf_files(path)
        weights = ("model.safetensors", "model.safetensors.index.json")
        if not found or any(os.path.isfile(os.path.join(path, w)) for w in weights):
            return None
        return f"a folder holding {'one .gguf file' if len(found) == 1 else 'GGUF files'}"

    # ------------------------------------------------------------------ the file

    @property
    def gguf_path(self) -> str:
        """The GGUF file opened first: the path itself, or the folder's one `.gguf` file or the
        first part of its split model (`gguf_split.one_model`).

        Raises:
          CheckpointError: a remote path, a folder of several models' GGUF files (several
            quantizations), a link leading out of the folder.
        """
        if not paths.is_local(self.path):
            raise CheckpointError(
                f"{self.path!r}: GGUF files are read from a local disk only; copy the file to a "
                f"local disk and set checkpoint.dir to the copy."
            )
        if not os.path.isdir(self.path):
            return self.path
        found = _gguf_files(self.path)
        first = gguf_split.one_model(found)
        if first is None:
            raise CheckpointError(
                f"{self.path!r} holds {len(found)} GGUF files ({', '.join(found[:4])}) of more "
                f"than one model; set checkpoint.dir to the one to score (any part of a split "
                f"model opens all its parts)."
            )
        for name in found:
            real, inside = paths.resolves_inside(self.path, name)
            if not inside:
                raise CheckpointError(
                    f"{os.path.join(self.path, name)!r} is a link to {real!r}, outside the "
                    f"checkpoint folder {self.path!r}; weights are read only from inside it."
                )
        return os.path.join(self.path, first)

    @property
    def header(self) -> gguf_file.GGUFFile:
        """The file's checked header (`gguf_file.read`), or a split model's, all its parts'
        (`gguf_split.read`), read once.

        Raises:
          CheckpointError: as `gguf_path` and `gguf_split.read`.
        """
        if self._header is None:
            self._header = gguf_split.read(self.gguf_path)
        return self._header

    def _rows(self, name: str) -> np.ndarray:
        """A small tensor of the file (rotary factors: a value per frequency), as float32.

        Raises:
          CheckpointError: a tensor of more than `MAX_FACTORS` values.
        """
        t = self.header.tensors[name]
        if int(np.prod(t.shape)) > MAX_FACTORS:
            raise CheckpointError(
                f"{self.header.path!r}: {name} holds {int(np.prod(t.shape)):,} values, not the "
                f"rotary factors of one head; re-convert the model."
            )
        return gguf_file.read_region(
            self.header, name, tuple(slice(None) for _ in t.shape)
        ).reshape(-1)

    # ------------------------------------------------------------------ the protocol

    def steps(self) -> list[int]:
        return []

    def resolve_step(self, step: int | None) -> int | None:
        return None

    def stored(self, step: int | None) -> Stored:
        """The file's tensors: name -> (shape in NumPy's order, GGML type name: `Q4_K`, `F32`)."""
        return {n: (t.shape, t.type) for n, t in self.header.tensors.items()}

    def stored_bytes(self, step: int | None) -> int:
        """The bytes of the file's tensors, as stored (every part's, for a split model)."""
        return sum(t.nbytes for t in self.header.tensors.values())

    def read(self, step: int | None, abstract: dict[str, Any]) -> dict[str, Any]:
        header = self.header
        return storage.place(
            abstract,
            lambda name, index: gguf_file.read_region(header, name, index, abstract[name].dtype),
        )

    def carried_description(self, step: int | None) -> dict[str, Any] | None:
        if self._description is None:
            self._description = gguf_arch.description(self.header, self._rows)
        return copy.deepcopy(self._description)

    def stored_tokenizer(self, step: int | None) -> tokenizer_lib.Tokenizer | None:
        if "tokenizer.ggml.tokens" not in self.header.metadata:
            return None
        name = f"{os.path.basename(self.header.path)} (tokenizer.ggml)"
        return gguf_tokenizer.build(self.header.metadata, name, repr(self.header.path))

    def files(self, step: int | None) -> str:
        return self.gguf_path

    def identity(self, step: int | None) -> dict[str, Any]:
        """`Checkpoint.identity`, its `files` every part of a split model (path, size,
        modification time and sampled blocks of each), not the first part's alone."""
        found = super().identity(step)
        if self.header.parts:
            found["files"] = fingerprint_lib.text_digest(
                [fingerprint_lib.file_identity(paths.absolute(p)) for p in self.header.parts]
            )
        return found

    def quantization(self, step: int | None) -> dict[str, Any] | None:
        """What the file stores its weights as: `{"method": "gguf", "file_type": llama.cpp's name
        of `general.file_type` (`Q4_K_M`; absent when the file does not say), "types": {GGML
        type: tensors}}`."""
        out: dict[str, Any] = {"method": "gguf"}
        file_type = self.header.metadata.get("general.file_type")
        if isinstance(file_type, int) and file_type in FILE_TYPES:
            out["file_type"] = FILE_TYPES[file_type]
        out["types"] = self.header.types()
        return out

    def rules(self, step: int | None = None) -> list[dict[str, Any]]:
        """`checkpoint.mapping`'s file or preset when given, else the GGUF rules of the file's
        architecture (`gguf_arch.rules`)."""
        if self.mapping:
            return apply.rules(self, step)
        return gguf_arch.rules(self.header, self.known(step))

    def naming(self, step: int | None) -> str:
        parts = self.header.parts
        where = f"the {len(parts)} parts of " if parts else ""
        return f"the tensors of {where}{self.header.path!r}"

    def _sources(self, step: int | None, expected: dict[str, Any]) -> dict[str, Any]:
        return mapping.resolve(
            self.rules(step), self.stored(step), expected, self.known(step), self.naming(step),
            remedy="Re-convert the model, or give checkpoint.architecture and checkpoint.mapping.",
        )  # fmt: skip

    def device_layouts(
        self, step: int | None, abstract: dict[str, Any]
    ) -> tuple[dict[str, Layout], dict[str, str]]:
        """Each model weight made of quantized tensors of one GGML type that
        `ppl_jax.checkpoints.quantized.ggml` dequantizes on the device, and whose rule moves
        whole blocks (`blocks.packed_axis`); the other quantized weights with the reason."""
        stored, desc = self.stored(step), self.known(step)
        numbers = {k: v for k, v in desc.items() if isinstance(v, int | float)}
        layouts: dict[str, Layout] = {}
        host: dict[str, str] = {}
        for weight, src in self._sources(step, abstract).items():
            tensors = [self.header.tensors[p.stored] for p in src.pieces]
            kinds = {t.type for t in tensors}
            if kinds <= FLOAT_TYPES:
                continue
            kind = min(kinds)
            if len(kinds) > 1:
                host[weight] = f"its tensors mix {', '.join(sorted(kinds))}"
            elif kind not in ggml.DEVICE_TYPES:
                host[weight] = f"{kind} has no device dequantization"
            else:
                leaf = abstract[weight]
                t = tensors[0]
                found = blocks.packed_axis(src, stored, tuple(leaf.shape), numbers, t.block)
                if found is None:
                    host[weight] = "its mapping rule cuts or changes the blocks"
                else:
                    dtype = np.dtype(leaf.dtype).name
                    layouts[weight] = Layout(
                        ggml.dequantize, kind, found[0], t.block, t.block_bytes,
                        tuple(leaf.shape), dtype, found[1],
                    )  # fmt: skip
        return layouts, host

    def restore(self, step: int | None, target: Any) -> Any:
        """The weights through the mapping rules, each device's block read from the byte ranges
        that hold it and dequantized into its leaf's dtype (see the module docstring).

        Raises:
          CheckpointError: tensors no rule takes (a name outside the architecture's), model
            weights no tensor gives, shapes that do not come out; a file changed since it was
            opened.
        """
        stored, desc = self.stored(step), self.known(step)
        expected = weight_paths(target)
        sources = self._sources(step, expected)
        numbers = {k: v for k, v in desc.items() if isinstance(v, int | float)}
        dtypes: dict[str, Any] = {}
        floats = {k: v for k, v in expected.items() if not is_packed(v)}
        for weight in floats:
            for piece in sources[weight].pieces:
                rule = piece.rule
                exact = piece.scale != 1.0 or rule.get("offset") or rule.get("plus_one")
                dtypes[piece.stored] = np.float32 if exact else expected[weight].dtype
        source = _Dequantized(self.header, dtypes)
        out = blocks.place_read_ahead(sources, stored, floats, source, numbers)
        packed = {k: v for k, v in expected.items() if is_packed(v)}
        if packed:
            out.update(self._place_packed(sources, stored, packed, numbers))
        return nest_weights({k: out[k] for k in expected})

    def _place_packed(
        self, sources: dict[str, Any], stored: Stored, packed: dict[str, Any], numbers: dict
    ) -> dict[str, Any]:
        """The `Packed` leaves' blocks read as stored and placed in their shardings."""

        def read_blocks(name: str, index: tuple[slice, ...]) -> np.ndarray:
            return gguf_file.read_blocks(self.header, name, index)

        def read(name: str, index: tuple[slice, ...]) -> np.ndarray:
            leaf = packed[name]
            shape, data = leaf.layout.shape, leaf.data
            block = tuple(range(*s.indices(n)[:2]) for s, n in zip(index, data.shape, strict=True))
            return blocks.read_packed_block(
                sources[name], stored, shape, block, read_blocks, numbers, leaf.layout.block
            )

        placed = storage.place({k: v.data for k, v in packed.items()}, read)
        return {k: v.with_data(placed[k]) for k, v in packed.items()}

    def layout_lines(self, step: int | None) -> list[str]:
        h = self.header
        meta = h.metadata
        quant = self.quantization(step) or {}
        types = ", ".join(f"{k} x{v}" for k, v in quant.get("types", {}).items())
        params = sum(int(np.prod(t.shape)) for t in h.tensors.values())
        kind = meta.get("tokenizer.ggml.model")
        size = f"{h.size / 2**20:.1f} MiB, GGUF v{h.version}"
        count = len(h.parts)
        files = [f"file: {h.path} ({size})"] if not count else [
            f"files: {count} parts of a split model ({size}), its metadata in the first:",
            *(f"  {p} ({sum(t.path == p for t in h.tensors.values())} tensors)" for p in h.parts),
        ]  # fmt: skip
        return [
            *files,
            f"architecture: {meta.get('general.architecture')!r} ({meta.get('general.name', '')})",
            f"quantization: {quant.get('file_type', 'file type not given')}; tensor types {types}",
            f"weights: {len(h.tensors)} tensors, {params:,} parameters",
            "tokenizer: " + (f"tokenizer.ggml ({kind}, pre {meta.get('tokenizer.ggml.pre')!r}, "
                             f"{len(meta.get('tokenizer.ggml.tokens') or [])} tokens)"
                             if kind else "none"),
        ]  # fmt: skip


class _Dequantized:
    """The file's tensors as a `storage.Storage`: each region read and dequantized into its
    tensor's dtype in `dtypes` (`gguf_file.read_region`)."""

    def __init__(self, header: gguf_file.GGUFFile, dtypes: dict[str, Any]):
        self.header, self.dtypes = header, dtypes

    def read(self, stored_name: str, index: tuple[slice, ...]) -> np.ndarray:
        return gguf_file.read_region(self.header, stored_name, index, self.dtypes[stored_name])
