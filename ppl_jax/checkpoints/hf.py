"""Hugging Face checkpoints: a `config.json` and safetensors weights, read into ppl_jax.

A Hugging Face directory (what `save_pretrained` writes) holds `config.json`, the weights as
`model.safetensors` or as shards listed in `model.safetensors.index.json`, and usually a tokenizer
(`tokenizer.json` or a SentencePiece `tokenizer.model`, with `tokenizer_config.json`).

- `read_description` turns `config.json` into the architecture dict of `ppl_jax.models.nnx.build`
  (the model types of `MODEL_TYPES`; a multimodal checkpoint's nested `text_config`).
- `load_params` reads each weight lazily with `safetensors.safe_open(...).get_slice`, converts it
  to the target layout and dtype, and places it straight into its sharding with
  `jax.make_array_from_callback`: each device's block is read on its own where the layout allows
  (a contiguous range of the stored tensor), otherwise one weight at most is read on the host.
  A model is never gathered whole in one host's memory.
- `load_tokenizer` reads the tokenizer and its BOS/EOS policy.

A remote directory (`gs://...`, see `ppl_jax.runtime.paths`) is recognised, and its `config.json`,
index (its shard names checked to lie inside it) and tokenizer are read through `etils.epath`;
its weights are not (safetensors memory-maps local files): `load_params` asks for a local copy.

Pickled weights (`pytorch_model.bin`, `.pt`, `.pth`) are refused and never unpickled: unpickling
runs arbitrary code, and so is a `config.json`, `tokenizer.json` or weight file reached through a
link that leads out of the directory (or, in the hub cache, out of the repository's `blobs`).
Weight names and layouts are in `ppl_jax.checkpoints.hf_layouts`.
"""

from __future__ import annotations

import contextlib
import os
import re
from typing import Any

import jax
import ml_dtypes  # noqa: F401  (registers bfloat16 with NumPy, so safetensors can read BF16)
import numpy as np
from safetensors import safe_open

from ppl_jax.checkpoints import hf_layouts as layouts
from ppl_jax.errors import CheckpointError
from ppl_jax.models import gemma, hf_config, mixture, olmo, phi3, qwen3
from ppl_jax.models.gpt2 import GPT2Config
from ppl_jax.models.gpt_neox import GPTNeoXConfig
from ppl_jax.models.interface import nest_weights, weight_paths
from ppl_jax.runtime import paths
from ppl_jax.tokenizer import directory as tokenizer_directory
from ppl_jax.tokenizer.directory import (
    TOKENIZER_FILES,
    has_tokenizer,  # noqa: F401  (re-exported)
)

# Hugging Face model type -> its config reader (each returns a config with `to_dict()`).
MODEL_TYPES = {
    "llama": hf_config.llama,
    "mistral": hf_config.llama,
    "qwen2": hf_config.llama,
    "gpt2": GPT2Config.from_hf_config,
    "qwen3": qwen3.from_hf_config,
    "olmo2": olmo.from_hf_config,
    "olmo3": olmo.from_hf_config,
    "gemma2": gemma.from_hf_config,
    "gemma3_text": gemma.from_hf_config,
    "phi3": phi3.from_hf_config,
    "gpt_neox": GPTNeoXConfig.from_hf_config,
    "mixtral": mixture.from_hf_config,
    "qwen2_moe": mixture.from_hf_config,
    "qwen3_moe": mixture.from_hf_config,
    "olmoe": mixture.from_hf_config,
}
SUPPORTED_MODEL_TYPES = tuple(MODEL_TYPES)
# A stored name of a decoder layer's weight, its layer number in group 1.
_LAYER_NAME = re.compile(
    r"^(?:model\.|model\.language_model\.|language_model\.model\.|gpt_neox\.|transformer\.)?"
    r"(?:layers|h)\.(\d+)\."
)
INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"
PICKLE_SUFFIXES = (".bin", ".pt", ".pth")
FLOAT_DTYPES = ("F64", "F32", "F16", "BF16")
BUFFER_SUFFIXES = layouts.BUFFER_SUFFIXES


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


def _short(value: Any, limit: int = 60) -> str:
    """`repr(value)` cut to `limit` characters (a config's bad value may be megabytes long)."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _config(path: str) -> tuple[dict[str, Any], bool]:
    """`config.json`, or the `text_config` it nests (multimodal checkpoints, whose text tower is
    the language model), and whether it was nested."""
    where = paths.join(path, "config.json")
    if paths.is_local(path):
        _check_inside(path, None, "config.json", what="config.json")
    cfg = paths.read_json_object(
        where, "a Hugging Face checkpoint directory needs its config.json."
    )
    text = cfg.get("text_config")
    if cfg.get("model_type") not in MODEL_TYPES and isinstance(text, dict):
        inherited = {k: cfg[k] for k in ("tie_word_embeddings",) if k in cfg}
        return {**inherited, **text}, True
    return cfg, False


def _is_text_tower(name: str) -> bool:
    """Whether a stored weight of a multimodal checkpoint belongs to its language model."""
    return name.startswith(("model.language_model.", "language_model.", "lm_head."))


def read_description(path: str) -> dict[str, Any]:
    """The architecture description of a Hugging Face directory, for `ppl_jax.models.nnx.build`.

    Reads `config.json` (or the `text_config` it nests, for the text tower of a multimodal
    checkpoint) of a model type in `MODEL_TYPES`: `llama`, `mistral`, `qwen2`, `qwen3`, `olmo2`,
    `olmo3`, `gemma2`, `gemma3_text`, `phi3` and the mixtures `mixtral`, `qwen2_moe`, `qwen3_moe`
    and `olmoe` become the `llama` family (see `ppl_jax.models.hf_config` and the family
    modules), `gpt2` and `gpt_neox` their own. For a
    local directory the config is compared with the safetensors headers (layers, embedding
    shape) before anything is built.

    Returns:
      A JSON-able dict with `family` `llama`, `gpt2` or `gpt_neox` (the config's `to_dict()`).

    Raises:
      CheckpointError: no or bad `config.json` (or one reached through a link out of the
        directory), a missing field, an unsupported `model_type` (naming the supported ones),
        activation or rope scaling, or a config that the weights contradict.
    """
    where = paths.join(path, "config.json")
    cfg, _ = _config(path)
    model_type = cfg.get("model_type")
    if model_type not in MODEL_TYPES:
        raise CheckpointError(
            f"{where}: model_type {_short(model_type)} is not supported; ppl_jax loads Hugging "
            f"Face model types {', '.join(MODEL_TYPES)}."
        )
    try:
        desc = MODEL_TYPES[model_type](cfg).to_dict()
    except CheckpointError as e:
        raise CheckpointError(f"{where}: {str(e)[:300]}") from None
    except KeyError as e:
        raise CheckpointError(
            f"{where}: the {model_type} config lacks the field {_short(e.args[0])}."
        ) from None
    except (TypeError, ValueError, OverflowError) as e:
        raise CheckpointError(
            f"{where}: a field has the wrong type or value ({str(e)[:120]})."
        ) from None
    if paths.is_local(path) and _weight_files(path):
        _check_against_headers(path, where, desc)
    return desc


def _check_against_headers(path: str, where: str, desc: dict[str, Any]) -> None:
    """Refuses a config that the safetensors headers contradict (the number of layers, the
    embedding's shape), reading the headers only."""
    with contextlib.ExitStack() as stack:
        try:
            weights = _Weights(path, stack)
        except CheckpointError:  # damaged weights: load_params says how
            return
        names = list(weights.file_of)
        layers = {int(match.group(1)) for n in names if (match := _LAYER_NAME.match(n)) is not None}
        if layers and len(layers) != desc["num_layers"]:
            raise CheckpointError(
                f"{where} describes {desc['num_layers']} layers but the safetensors weights "
                f"hold {len(layers)}; fix config.json to describe these weights."
            )
        embedding = layouts.sources(desc)["embedding"]
        name = next((n for n in embedding.names if n in weights.file_of), None)
        if name is not None:
            shape = tuple(weights.slice(name).get_shape())
            if shape != embedding.shape:
                raise CheckpointError(
                    f"{where} implies an embedding of shape {embedding.shape} but the weights "
                    f"store {name!r} as {shape}; fix config.json to describe these weights."
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


class _Weights:
    """The stored tensors of a directory: name -> file, opened lazily with `safe_open`."""

    def __init__(self, path: str, stack: contextlib.ExitStack):
        self.path, self._stack, self._open = path, stack, {}
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
        return self._handle(self.file_of[name]).get_slice(name)


@contextlib.contextmanager
def _open_slice(file: str, name: str):
    """The stored tensor `name` of `file`, lazily, through a handle closed on exit."""
    with safe_open(file, "np") as f:
        yield f.get_slice(name)


def load_params(path: str, target: Any) -> Any:
    """Reads the weights of a Hugging Face directory into the target shardings and dtype.

    Args:
      path: the directory (see `is_hf_checkpoint`).
      target: the params tree of `nnx_lib.build(read_description(path), dtype)`, with
        `jax.ShapeDtypeStruct(shape, dtype, sharding=NamedSharding)` leaves. Stored float32,
        float16 or bfloat16 weights are converted to each leaf's dtype (round to nearest even).

    Returns:
      The params tree of `jax.Array`s, each with its target sharding.

    Raises:
      CheckpointError: pickled-only or missing weights files, a missing shard, and (all named at
        once) missing, misshapen or non-float weights and stored weights the architecture does
        not use.
    """
    desc = read_description(path)
    text_only = _config(path)[1]  # a multimodal checkpoint: its text tower only
    sources = layouts.sources(desc)
    leaves = list(weight_paths(target).items())
    with contextlib.ExitStack() as stack:
        weights = _Weights(path, stack)
        resolved, problems, used = {}, [], set()
        for key, _ in leaves:
            src = sources.get(key)
            if src is None:
                raise CheckpointError(
                    f"the target weight '{key}' is not part of the architecture "
                    f"in {path!r}; build the target from read_description."
                )
            found = []
            for candidates in src.stack or (src.names,):
                name = next((n for n in candidates if n in weights.file_of), None)
                if name is None:
                    problems.append(f"'{candidates[0]}' is missing")
                    break
                used.add(name)
                found.append(name)
                sl = weights.slice(name)
                if tuple(sl.get_shape()) != src.shape:
                    problems.append(
                        f"'{name}' has shape {tuple(sl.get_shape())}, config.json implies "
                        f"{src.shape}"
                    )
                elif sl.get_dtype() not in FLOAT_DTYPES:
                    problems.append(
                        f"'{name}' is {sl.get_dtype()}, not a float type (quantized "
                        f"checkpoints are not supported)"
                    )
            resolved[key] = (found, src)
        unused = sorted(
            n
            for n in set(weights.file_of) - used
            if not n.endswith(layouts.BUFFER_SUFFIXES)
            and n not in layouts.TIED_HEADS
            and (not text_only or _is_text_tower(n))
        )
        if unused:
            problems.append(
                f"{len(unused)} stored weights are not used by this architecture "
                f"(e.g. {', '.join(repr(n) for n in unused[:3])})"
            )
        if problems:
            raise CheckpointError(
                f"the weights in {path!r} do not match its config.json: "
                + "; ".join(problems)
                + ". Re-download the checkpoint, or fix config.json to describe these weights."
            )
    # The headers were read above; each weight's data is read below with its own short-lived
    # handle, so the file pages it touched leave this process's memory once it is placed.
    out = {}
    for key, leaf in leaves:
        names, src = resolved[key]
        files = [os.path.join(path, weights.file_of[n]) for n in names]
        cache: dict[tuple, np.ndarray] = {}

        def block(index, names=names, files=files, src=src, leaf=leaf, cache=cache):
            k = tuple(s.indices(n)[:2] for s, n in zip(index, leaf.shape, strict=True))
            if k not in cache:  # devices holding the same block share one read
                if src.stack:  # one stored tensor per slice of the first axis
                    parts = []
                    for e in range(*index[0].indices(leaf.shape[0])):
                        with _open_slice(files[e], names[e]) as sl:
                            parts.append(layouts.read_block(sl, src, index[1:], leaf.shape[1:]))
                    data = np.stack(parts)
                else:
                    with _open_slice(files[0], names[0]) as sl:
                        data = layouts.read_block(sl, src, index, leaf.shape)
                cache[k] = data.astype(leaf.dtype, copy=False)
            return cache[k]

        out[key] = jax.make_array_from_callback(leaf.shape, leaf.sharding, block)
        cache.clear()
    return nest_weights(out)


# ---------------------------------------------------------------------------------- tokenizer


def load_tokenizer(path: str):
    """`ppl_jax.tokenizer.directory.load_tokenizer` of the directory, after refusing tokenizer
    files that are links leading out of it (see `_check_inside`).

    Raises:
      CheckpointError: such a link; else as `tokenizer.directory.load_tokenizer`.
    """
    if paths.is_local(path):
        for file in TOKENIZER_FILES:
            if os.path.lexists(os.path.join(path, file)):
                _check_inside(path, None, file, what=file)
    return tokenizer_directory.load_tokenizer(path)
