"""Hugging Face checkpoints: a `config.json` and safetensors weights, read into ppl_jax.

A Hugging Face directory (what `save_pretrained` writes) holds `config.json`, the weights as
`model.safetensors` or as shards listed in `model.safetensors.index.json`, and usually a tokenizer
(`tokenizer.json` or a SentencePiece `tokenizer.model`, with `tokenizer_config.json`).

- `read_description` turns `config.json` into the architecture dict of
  `ppl_jax.models.registry.build` (the model types the families read,
  `ppl_jax.models.registry.model_types`; a multimodal checkpoint's nested `text_config`).
- `load_params` reads the weights through their family's mapping rules
  (`ppl_jax.models.registry.hf_mapping`, the one mapping language of
  `ppl_jax.checkpoints.mapping.language`) from the `Safetensors` storage: each device's block is
  read on its own as the stored region it needs (`ppl_jax.checkpoints.mapping.blocks`; a contiguous
  range of the stored tensor where the layout allows, otherwise one weight at most on the host),
  converted to the target dtype and placed straight into its sharding. A model is never gathered
  whole in one host's memory. Quantized weights (`config.json`'s `quantization_config`:
  `ppl_jax.checkpoints.quantized.methods`) are read through
  `ppl_jax.checkpoints.quantized.parts`, each block dequantized from the regions of its
  parts it needs.
- `read_tokenizer` reads the tokenizer and its BOS/EOS policy.

A remote directory (`gs://...`, see `ppl_jax.runtime.paths`) is recognised, and its `config.json`,
index (its shard names checked to lie inside it) and tokenizer are read through `etils.epath`;
its weights are not (safetensors memory-maps local files): `load_params` asks for a local copy.

Pickled weights (`pytorch_model.bin`, `.pt`, `.pth`) are refused and never unpickled: unpickling
runs arbitrary code, and so is a `config.json`, `tokenizer.json` or weight file reached through a
link that leads out of the directory (or, in the hub cache, out of the repository's `blobs`).
Weight names and layouts are in each family's module (`ppl_jax.models.families`).
"""

from __future__ import annotations

import contextlib
import os
import re
from typing import Any

import ml_dtypes  # noqa: F401  (registers bfloat16 with NumPy, so safetensors can read BF16)
import numpy as np
from safetensors import safe_open

from ppl_jax.checkpoints import mapping
from ppl_jax.checkpoints.formats import safetensors_ranges as ranges
from ppl_jax.checkpoints.mapping import blocks
from ppl_jax.checkpoints.quantized import methods
from ppl_jax.checkpoints.quantized import parts as quantized_parts
from ppl_jax.checkpoints.quantized import rows as quantized_rows
from ppl_jax.checkpoints.quantized.base import Scheme
from ppl_jax.errors import CheckpointError, quoted
from ppl_jax.models import registry
from ppl_jax.models.interface import nest_weights, weight_paths
from ppl_jax.runtime import paths
from ppl_jax.tokenizer import directory as tokenizer_directory
from ppl_jax.tokenizer.directory import (
    TOKENIZER_FILES,
    has_tokenizer,  # noqa: F401  (re-exported)
)

# A model weight's layer number (group 1), in the names the mapping rules give.
_LAYER_WEIGHT = re.compile(r"^layers/(\d+)/")
INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"
PICKLE_SUFFIXES = (".bin", ".pt", ".pth")
BYTES_ONLY = ("F8_E4M3", "F8_E5M2")  # read by their bytes (safetensors' NumPy reader lacks them)


def _weight_files(path: str) -> list[str]:
    return [n for n in paths.listdir(path) if n.endswith(".safetensors") or n == INDEX]


def _pickle_files(path: str) -> list[str]:
    return sorted(n for n in paths.listdir(path) if n.endswith(PICKLE_SUFFIXES))


def is_hf_checkpoint(path: str) -> bool:
    """Whether `path` (local or remote, see `ppl_jax.runtime.paths`) is a directory with `config.json`
    and safetensors or pickled weights."""
    try:
        if not paths.isdir(path) or not paths.isfile(paths.join(path, "config.json")):
            return False
    except ImportError as e:
        raise paths.missing_backend(path, e) from None
    return bool(_weight_files(path) or _pickle_files(path))


def read_config(path: str) -> dict[str, Any]:
    """The directory's `config.json` (local or remote), as stored. A load reads it once and
    passes it (`config=`) to `read_description`, `read_quantization` and `_config`.

    Raises:
      CheckpointError: no or bad `config.json`, or one reached through a link out of the
        directory.
    """
    if paths.is_local(path):
        _check_inside(path, None, "config.json", what="config.json")
    return paths.read_json_object(
        paths.join(path, "config.json"),
        "a Hugging Face checkpoint directory needs its config.json.",
    )


def _config(path: str, config: dict[str, Any] | None = None) -> tuple[dict[str, Any], bool]:
    """`config.json` (`config`, else read), or the `text_config` it nests (multimodal
    checkpoints, whose text tower is the language model), and whether it was nested."""
    cfg = read_config(path) if config is None else config
    text = cfg.get("text_config")
    if registry.for_model_type(cfg.get("model_type")) is None and isinstance(text, dict):
        inherited = {k: cfg[k] for k in ("tie_word_embeddings",) if k in cfg}
        return {**inherited, **text}, True
    return cfg, False


def read_quantization(path: str, config: dict[str, Any] | None = None) -> Scheme | None:
    """The quantization `config.json`'s `quantization_config` declares
    (`ppl_jax.checkpoints.quantized.methods.parse`), or None; `config`: the file as
    `read_config` read it (else read here).

    Raises:
      CheckpointError: no or bad `config.json`; a method or parameter ppl_jax does not read.
    """
    cfg = read_config(path) if config is None else config
    return methods.parse(cfg, paths.join(path, "config.json"))


def _is_text_tower(name: str) -> bool:
    """Whether a stored weight of a multimodal checkpoint belongs to its language model."""
    return name.startswith(("model.language_model.", "language_model.", "lm_head."))


def read_description(path: str, config: dict[str, Any] | None = None) -> dict[str, Any]:
    """The architecture description of a Hugging Face directory, for
    `ppl_jax.models.registry.build`; `config`: its `config.json` as `read_config` read it (else
    read here).

    Reads `config.json` (or the `text_config` it nests, for the text tower of a multimodal
    checkpoint) of a model type some family reads (`ppl_jax.models.registry.model_types`): the
    Llama-like ones become the `llama` description family, the others their own. Its sizes are
    checked (`registry.check_sizes`) and, for a local directory, compared with the safetensors
    headers (the layers, the embedding's shape) before anything is built.

    Returns:
      A JSON-able dict with the `family` that builds it (its config's `to_dict()`).

    Raises:
      CheckpointError: no or bad `config.json` (or one reached through a link out of the
        directory), a missing field, an unsupported `model_type` (naming the supported ones),
        activation or rope scaling, an absurd size, or a config that the weights contradict.
    """
    where = paths.join(path, "config.json")
    config = read_config(path) if config is None else config
    cfg, text_only = _config(path, config)
    scheme = read_quantization(path, config)  # a quantization ppl_jax does not read: refused here
    model_type = cfg.get("model_type")
    try:
        desc = registry.read_hf_config(cfg)
    except CheckpointError as e:
        # bounded (a hostile config's values are shortened where they are quoted), yet long
        # enough for the list of every supported model type
        raise CheckpointError(f"{where}: {str(e)[:1000]}") from None
    except KeyError as e:
        raise CheckpointError(
            f"{where}: the {quoted(model_type)[1:-1]} config lacks the field {quoted(e.args[0])}."
        ) from None
    except (TypeError, ValueError, OverflowError, AttributeError) as e:
        raise CheckpointError(
            f"{where}: a field has the wrong type or value ({str(e)[:120]})."
        ) from None
    if paths.is_local(path) and _weight_files(path):
        _check_against_headers(path, where, desc, text_only, scheme)
    return desc


def _check_against_headers(
    path: str, where: str, desc: dict[str, Any], text_only: bool, scheme: Any = None
) -> None:
    """Refuses a config that the safetensors headers contradict (the number of layers, the
    embedding's shape), reading the headers only: what the family's rules make of the stored
    names and shapes (`mapping.produced`)."""
    with contextlib.ExitStack() as stack:
        try:
            weights = Safetensors(path, stack)
            prefixes, rules = registry.hf_mapping(desc)
            stored = weights.stored(prefixes, text_only)
            stored = quantized_parts.view(scheme, weights, stored, weights.real, where)[1]
            made = mapping.produced(rules, stored, desc, where)
        except CheckpointError:  # damaged weights or names: load_params says how
            return
        layers = {int(m.group(1)) for n in made if (m := _LAYER_WEIGHT.match(n)) is not None}
        if layers and len(layers) != desc["num_layers"]:
            raise CheckpointError(
                f"{where} describes {desc['num_layers']} layers but the safetensors weights "
                f"hold {len(layers)}; fix config.json to describe these weights."
            )
        want = (desc["vocab_size"], desc["embed_dim"])
        if "embedding" in made and made["embedding"] != want:
            name = next(
                n
                for n in stored
                if "embedding" in mapping.produced(rules, {n: stored[n]}, desc, where)
            )
            raise CheckpointError(
                f"{where} implies an embedding of shape {want} but the weights store "
                f"{weights.real(name)!r} as {tuple(stored[name][0])}; fix config.json to "
                f"describe these weights."
            )


# ------------------------------------------------------------------------------------ weights


def _check_inside(
    path: str, index: str | None, file: Any, name: str = "", what: str | None = None
) -> None:
    """Refuses a weight file (or, with `what`, that file of the directory: `config.json`,
    `tokenizer.json`) named outside the checkpoint directory, before anything is read.

    An index entry must be a relative path without `..` components, and the file it names must
    resolve (symlinks followed) to a place inside the directory (or, in the hub cache, inside the
    repository's `blobs`): an index could otherwise make ppl_jax read any file on the machine.
    """
    if not isinstance(file, str) or not file:
        raise CheckpointError(
            f"{index!r} maps the weight {name!r} to {file!r}, not a file name; fix its weight_map."
        )
    if paths.is_local(path):
        real, inside = paths.resolves_inside(path, file)
    else:  # no symlinks on object stores: a relative name without '..' stays inside
        real, inside = paths.join(paths.absolute(path), file), paths.scheme(file) is None
    if os.path.isabs(file) or ".." in file.replace("\\", "/").split("/") or not inside:
        where = (
            f"{index!r} names the shard {file!r} (for {name!r})"
            if index
            else f"{paths.join(path, file)!r} is a link"
        )
        if what is not None:
            raise CheckpointError(
                f"{where}, which lies outside the checkpoint directory {path!r} (at {real!r}); "
                f"its {what} is read only from inside it: copy the file into the directory."
            )
        raise CheckpointError(
            f"{where}, which lies outside the checkpoint directory {path!r} (at {real!r}); "
            f"weights are read only from files inside it. Put the shards in the directory and "
            f"name them by their file names in the index."
        )


def _local_only(path: str) -> None:
    """Refuses a remote directory's weights: safetensors reads (memory-maps) local files only."""
    if not paths.is_local(path):
        raise CheckpointError(
            f"{path!r}: Hugging Face weights are read from a local directory only (safetensors "
            f"memory-maps its files); copy the directory to a local disk (e.g. gcloud storage "
            f"cp -r) and set checkpoint.dir to the copy."
        )


class Safetensors:
    """A directory's safetensors tensors as a `ppl_jax.checkpoints.mapping.storage.Storage`: the
    stored name -> file map (from the index, or the single file's header), the headers read lazily
    with `safe_open`, and each region read on its own with a short-lived handle (the file pages it
    touched leave this process's memory once the block is placed).

    Names are the mapping rules' (`stored`): a family's prefix removed (`model.`), and for the
    text tower of a multimodal checkpoint only its own weights.
    """

    def __init__(self, path: str, stack: contextlib.ExitStack):
        self.path, self._stack, self._open = path, stack, {}
        self._headers: dict[str, dict[str, ranges.TensorRange]] = {}
        if paths.isfile(paths.join(path, INDEX)):
            index = paths.read_json_object(paths.join(path, INDEX), "")
            self.file_of = dict(index.get("weight_map") or {})
            for name, file in self.file_of.items():
                _check_inside(path, paths.join(path, INDEX), file, name)
            for file in sorted(set(self.file_of.values())):
                if not paths.isfile(paths.join(path, file)):
                    raise CheckpointError(
                        f"{path!r}: {INDEX} lists the shard {file!r}, which is missing; download "
                        f"every shard of the checkpoint."
                    )
            _local_only(path)
        elif paths.isfile(paths.join(path, SINGLE)):
            _check_inside(path, None, SINGLE)
            _local_only(path)
            self.file_of = {name: SINGLE for name in self._handle(SINGLE).keys()}
        elif _pickle_files(path):
            raise CheckpointError(
                f"{path!r} holds only pickled PyTorch weights ({', '.join(_pickle_files(path))}); "
                f"ppl_jax reads safetensors only and never unpickles (unpickling runs code). "
                f"Convert them where you trust the file: load the model with transformers and "
                f"call model.save_pretrained(dir, safe_serialization=True)."
            )
        else:
            raise CheckpointError(
                f"{path!r} has no {SINGLE} or {INDEX}; give a Hugging Face directory with "
                f"safetensors weights."
            )

    def _handle(self, file: str):
        if file not in self._open:
            try:
                self._open[file] = self._stack.enter_context(
                    safe_open(os.path.join(self.path, file), "np")
                )
            except Exception as e:  # safetensors raises its own SafetensorError
                raise CheckpointError(
                    f"{os.path.join(self.path, file)!r} is not a readable safetensors file ({e})."
                ) from None
        return self._open[file]

    def slice(self, name: str):
        """The stored tensor `name`, lazily, from the shard its index names.

        Raises:
          CheckpointError: the shard does not hold it (an index that does not match its shards:
            damage, named by weight and shard).
        """
        handle = self._handle(self.file_of[name])
        try:
            return handle.get_slice(name)
        except Exception:  # safetensors' own SafetensorError: "File does not contain tensor"
            if name in handle.keys():
                raise
        files = sorted(set(self.file_of.values()))
        holding = [f for f in files if name in self._handle(f).keys()]
        raise CheckpointError(
            f"{paths.join(self.path, INDEX)!r} names the shard {self.file_of[name]!r} for the "
            f"weight {name!r}, which that shard does not hold"
            f"{f' (it is in {holding[0]!r})' if holding else ''}: the index does not match its "
            f"shards, the checkpoint is damaged. Download the checkpoint again."
        )

    def stored(self, prefixes: tuple[str, ...], text_only: bool) -> dict[str, tuple[tuple, str]]:
        """The rules' names -> (shape, safetensors dtype), read from the headers: each name with
        the first of `prefixes` it starts with removed; `text_only`: only the text tower's.

        Raises:
          CheckpointError: an unreadable file; two stored names that become one.
        """
        self._real: dict[str, str] = {}
        self._prefix = ""  # the head stored names carry (for names the rules expect)
        out = {}
        for name in self.file_of:
            if text_only and not _is_text_tower(name):
                continue
            short = next((name[len(p) :] for p in prefixes if name.startswith(p)), name)
            if short in self._real:
                raise CheckpointError(
                    f"{self.path!r} stores both {self._real[short]!r} and {name!r}, one weight "
                    f"under two names; keep one of them."
                )
            self._real[short] = name
            self._prefix = name[: len(name) - len(short)] if short != name else self._prefix
            sl = self.slice(name)
            out[short] = (tuple(sl.get_shape()), sl.get_dtype())
        return out

    def real(self, name: str) -> str:
        """The stored name of a rules' name (for a name not stored, with the head the stored
        names carry)."""
        real = getattr(self, "_real", {})
        return real[name] if name in real else getattr(self, "_prefix", "") + name

    def read(self, stored_name: str, index: tuple[slice, ...]) -> np.ndarray:
        """The region `index` of a stored tensor (`storage.Storage.read`); a dtype NumPy does not
        name (float8: safetensors' NumPy reader has none) by its bytes
        (`safetensors_ranges.read_block`)."""
        real = self.real(stored_name)
        with _open_slice(os.path.join(self.path, self.file_of[real]), real) as sl:
            if sl.get_dtype() in BYTES_ONLY:
                file = self.file_of[real]
                if file not in self._headers:  # each file's header, once
                    self._headers[file] = ranges.read_header(self.path, file)
                entry = self._headers[file][real]
                index = tuple(index) + (slice(None),) * (len(entry.shape) - len(index))
                return ranges.read_block(self.path, entry, index)
            return np.asarray(sl[index] if index else sl[:])


@contextlib.contextmanager
def _open_slice(file: str, name: str):
    """The stored tensor `name` of `file`, lazily, through a handle closed on exit."""
    with safe_open(file, "np") as f:
        yield f.get_slice(name)


def load_params(path: str, target: Any) -> Any:
    """Reads the weights of a Hugging Face directory into the target shardings and dtype.

    Args:
      path: the directory (see `is_hf_checkpoint`).
      target: the params tree of `registry.build(read_description(path), dtype)`, with
        `jax.ShapeDtypeStruct(shape, dtype, sharding=NamedSharding)` leaves. Stored float32,
        float16 or bfloat16 weights are converted to each leaf's dtype (round to nearest even);
        quantized ones (`quantization_config`, `ppl_jax.checkpoints.quantized.parts`) are
        dequantized by block, then converted, or kept packed (`quantized.rows.place`).

    Returns:
      The params tree of `jax.Array`s, each with its target sharding.

    Raises:
      CheckpointError: pickled-only or missing weights files, a missing shard, non-float
        weights outside a quantized layout, a quantization or quantized part that does not fit
        (`quantized_parts.view`), and (all named at once) missing or misshapen weights and
        stored weights the architecture does not use.
    """
    config = read_config(path)
    desc = read_description(path, config)
    text_only = _config(path, config)[1]  # a multimodal checkpoint: its text tower only
    scheme = read_quantization(path, config)
    prefixes, rules = registry.hf_mapping(desc)
    expected = weight_paths(target)
    where = f"the weights in {path!r}"
    with contextlib.ExitStack() as stack:
        weights = Safetensors(path, stack)
        stored = weights.stored(prefixes, text_only)
        source, stored = quantized_parts.view(scheme, weights, stored, weights.real, where)
        quantized_parts.check_floats(stored, weights.real, where)
        sources = mapping.resolve(
            rules,
            stored,
            expected,
            desc,
            f"the weights in {path!r} do not match its config.json",
            shown=weights.real,
            remedy="Re-download the checkpoint, or fix config.json to describe these weights.",
        )
    # The headers were read above; each block's data is read below with its own handle.
    numbers = {k: v for k, v in desc.items() if isinstance(v, int | float)}
    placed = quantized_rows.place(blocks.place, source, sources, stored, expected, numbers)
    return nest_weights(placed)


# ---------------------------------------------------------------------------------- tokenizer


def read_tokenizer(path: str):
    """`ppl_jax.tokenizer.directory.read_tokenizer` of the directory, after refusing tokenizer
    files that are links leading out of it (see `_check_inside`).

    Raises:
      CheckpointError: such a link; else as `tokenizer.directory.read_tokenizer`.
    """
    if paths.is_local(path):
        for file in TOKENIZER_FILES:
            if os.path.lexists(os.path.join(path, file)):
                _check_inside(path, None, file, what=file)
    return tokenizer_directory.read_tokenizer(path)
