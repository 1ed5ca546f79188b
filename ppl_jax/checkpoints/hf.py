"""Hugging Face checkpoints: a `config.json` and safetensors weights, read into ppl_jax.

A Hugging Face directory (what `save_pretrained` writes) holds `config.json`, the weights as
`model.safetensors` or as shards listed in `model.safetensors.index.json`, and usually a tokenizer
(`tokenizer.json` or a SentencePiece `tokenizer.model`, with `tokenizer_config.json`).

- `read_description` turns `config.json` into the architecture dict of `ppl_jax.models.interface.build`:
  model types `llama`, `mistral` and `qwen2` become the `llama` family, `gpt2` the `gpt2` family.
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
runs arbitrary code. Weight names and layouts follow transformers' `modeling_llama`,
`modeling_mistral`, `modeling_qwen2` and `modeling_gpt2` (`nn.Linear` stores `[out, in]`, GPT-2's
`Conv1D` stores `[in, out]`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
from typing import Any

import jax
import ml_dtypes  # noqa: F401  (registers bfloat16 with NumPy, so safetensors can read BF16)
import numpy as np
from safetensors import safe_open

from ppl_jax.errors import CheckpointError
from ppl_jax.models.gpt2 import GPT2Config
from ppl_jax.models.interface import nest_weights, weight_paths
from ppl_jax.models.llama import LlamaConfig
from ppl_jax.runtime import paths
from ppl_jax.tokenizer.directory import has_tokenizer, load_tokenizer  # noqa: F401  (re-exported)

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2", "gpt2")
INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"
PICKLE_SUFFIXES = (".bin", ".pt", ".pth")
FLOAT_DTYPES = ("F64", "F32", "F16", "BF16")
# Stored buffers that are not parameters (causal-mask buffers of old GPT-2 checkpoints, rotary
# tables of old Llama checkpoints).
BUFFER_SUFFIXES = (".attn.bias", ".attn.masked_bias", ".rotary_emb.inv_freq")


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


def read_description(path: str) -> dict[str, Any]:
    """The architecture description of a Hugging Face directory, for `ppl_jax.models.interface.build`.

    Reads `config.json`: `llama` (Llama 1-3, rope scalings `linear` and `llama3`, `attention_bias`,
    `mlp_bias`), `mistral` (sliding window on every layer), `qwen2` (q/k/v biases, tied
    embeddings, optional sliding window) and `gpt2`; see `LlamaConfig.from_hf_config` and
    `GPT2Config.from_hf_config`.

    Returns:
      A JSON-able dict with `family` `llama` or `gpt2` (`LlamaConfig.to_dict()`,
      `GPT2Config.to_dict()`).

    Raises:
      CheckpointError: no or bad `config.json`, a missing field, an unsupported `model_type`
        (naming the supported ones), activation or rope scaling.
    """
    where = paths.join(path, "config.json")
    cfg = paths.read_json_object(
        where, "a Hugging Face checkpoint directory needs its config.json."
    )
    model_type = cfg.get("model_type")
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise CheckpointError(
            f"{where}: model_type {model_type!r} is not supported; ppl_jax loads Hugging Face "
            f"model types {', '.join(SUPPORTED_MODEL_TYPES)}."
        )

    try:
        if model_type == "gpt2":
            return GPT2Config.from_hf_config(cfg).to_dict()
        return LlamaConfig.from_hf_config(cfg).to_dict()
    except CheckpointError as e:
        raise CheckpointError(f"{where}: {e}") from None
    except KeyError as e:
        raise CheckpointError(f"{where}: the {model_type} config lacks the field {e}.") from None
    except (TypeError, ValueError) as e:
        raise CheckpointError(f"{where}: a field has the wrong type or value ({e}).") from None


# ------------------------------------------------------------------------------------ weights


@dataclasses.dataclass(frozen=True)
class _Source:
    """Where a ppl_jax weight comes from in the stored tensors.

    The stored tensor (of `shape`) is viewed with each of its axes split into the dims of
    `groups[axis]`; target axis `i` is view axis `perm[i]`. `offset` selects, along the last
    stored axis, where this weight starts in a fused tensor (GPT-2's `c_attn`).
    """

    names: tuple[str, ...]  # candidate stored names, first present wins
    shape: tuple[int, ...]
    groups: tuple[tuple[int, ...], ...]
    perm: tuple[int, ...]
    offset: int = 0


def _direct(names, groups, shape=None, offset=0) -> _Source:
    groups = tuple(tuple(g) for g in groups)
    shape = shape or tuple(math.prod(g) for g in groups)
    ndim = sum(len(g) for g in groups)
    return _Source(tuple(names), tuple(shape), groups, tuple(range(ndim)), offset)


def _linear(names, out_dims, in_dims) -> _Source:
    """A torch `nn.Linear` weight `[out, in]`, as a ppl_jax `[*in_dims, *out_dims]` weight."""
    src = _direct(names, (out_dims, in_dims))
    n_out, n_in = len(out_dims), len(in_dims)
    perm = tuple(range(n_out, n_out + n_in)) + tuple(range(n_out))
    return dataclasses.replace(src, perm=perm)


def _llama_sources(c: dict[str, Any]) -> dict[str, _Source]:
    d, h, kv, hd, f, v = (
        c["embed_dim"],
        c["num_heads"],
        c["num_kv_heads"],
        c["head_dim"],
        c["mlp_dim"],
        c["vocab_size"],
    )
    m = lambda name: (f"model.{name}", name)  # noqa: E731  (saved with or without the head)
    out = {
        "embedding": _direct(m("embed_tokens.weight"), ((v,), (d,))),
        "final_norm": _direct(m("norm.weight"), ((d,),)),
    }
    if not c["tie_embeddings"]:
        out["lm_head"] = _linear(("lm_head.weight",), (v,), (d,))
    for i in range(c["num_layers"]):
        p, s = f"layers/{i}/", f"layers.{i}."
        out[p + "attn_norm"] = _direct(m(s + "input_layernorm.weight"), ((d,),))
        out[p + "mlp_norm"] = _direct(m(s + "post_attention_layernorm.weight"), ((d,),))
        for name, heads in (("q", h), ("k", kv), ("v", kv)):
            proj = f"{s}self_attn.{name}_proj"
            out[f"{p}attn/{name}"] = _linear(m(proj + ".weight"), (heads, hd), (d,))
            if c.get("qkv_bias"):
                out[f"{p}attn/{name}_bias"] = _direct(m(proj + ".bias"), ((heads, hd),))
        out[p + "attn/o"] = _linear(m(s + "self_attn.o_proj.weight"), (d,), (h, hd))
        if c.get("o_bias"):
            out[p + "attn/o_bias"] = _direct(m(s + "self_attn.o_proj.bias"), ((d,),))
        for name, (o_dim, i_dim) in (("gate", (f, d)), ("up", (f, d)), ("down", (d, f))):
            out[f"{p}mlp/{name}"] = _linear(m(f"{s}mlp.{name}_proj.weight"), (o_dim,), (i_dim,))
            if c.get("mlp_bias"):
                out[f"{p}mlp/{name}_bias"] = _direct(m(f"{s}mlp.{name}_proj.bias"), ((o_dim,),))
    return out


def _gpt2_sources(c: dict[str, Any]) -> dict[str, _Source]:
    d, h, f, v = c["embed_dim"], c["num_heads"], c["mlp_dim"], c["vocab_size"]
    hd = d // h
    m = lambda name: (f"transformer.{name}", name)  # noqa: E731
    out = {
        "embedding": _direct(m("wte.weight"), ((v,), (d,))),
        "position_embedding": _direct(m("wpe.weight"), ((c["max_positions"],), (d,))),
        "final_norm": _direct(m("ln_f.weight"), ((d,),)),
        "final_norm_bias": _direct(m("ln_f.bias"), ((d,),)),
    }
    if not c["tie_embeddings"]:
        out["lm_head"] = _linear(("lm_head.weight",), (v,), (d,))
    for i in range(c["num_layers"]):
        p, s = f"layers/{i}/", f"h.{i}."
        for ours, theirs in (("attn_norm", "ln_1"), ("mlp_norm", "ln_2")):
            out[p + ours] = _direct(m(f"{s}{theirs}.weight"), ((d,),))
            out[p + ours + "_bias"] = _direct(m(f"{s}{theirs}.bias"), ((d,),))
        for j, name in enumerate(("q", "k", "v")):  # Conv1D c_attn: [in, 3 * embed]
            out[f"{p}attn/{name}"] = _direct(
                m(s + "attn.c_attn.weight"), ((d,), (h, hd)), shape=(d, 3 * d), offset=j * d
            )
            out[f"{p}attn/{name}_bias"] = _direct(
                m(s + "attn.c_attn.bias"), ((h, hd),), shape=(3 * d,), offset=j * d
            )
        out[p + "attn/o"] = _direct(m(s + "attn.c_proj.weight"), ((h, hd), (d,)))
        out[p + "attn/o_bias"] = _direct(m(s + "attn.c_proj.bias"), ((d,),))
        out[p + "mlp/fc"] = _direct(m(s + "mlp.c_fc.weight"), ((d,), (f,)))
        out[p + "mlp/fc_bias"] = _direct(m(s + "mlp.c_fc.bias"), ((f,),))
        out[p + "mlp/proj"] = _direct(m(s + "mlp.c_proj.weight"), ((f,), (d,)))
        out[p + "mlp/proj_bias"] = _direct(m(s + "mlp.c_proj.bias"), ((d,),))
    return out


def _allowed_roots(path: str) -> list[str]:
    """Where the weight files of `path` may really lie: the directory itself, and for a snapshot of
    the Hugging Face hub cache (`models--org--name/snapshots/<revision>`, whose files are symlinks
    into `models--org--name/blobs`), that repository's blobs. Remote paths have no symlinks."""
    if not paths.is_local(path):
        return [paths.absolute(path)]
    real = os.path.realpath(path)
    roots = [real]
    parent = os.path.dirname(real)
    if os.path.basename(parent) == "snapshots":
        roots.append(os.path.join(os.path.dirname(parent), "blobs"))
    return roots


def _check_inside(path: str, index: str | None, file: Any, name: str = "") -> None:
    """Refuses a weight file named outside the checkpoint directory, before anything is read.

    An index entry must be a relative path without `..` components, and the file it names must
    resolve (symlinks followed) to a place inside the directory (or, in the hub cache, inside the
    repository's `blobs`): an index could otherwise make ppl_jax read any file on the machine.
    """
    if not isinstance(file, str) or not file:
        raise CheckpointError(
            f"{index!r} maps the weight {name!r} to {file!r}, not a file name; fix its weight_map."
        )
    if paths.is_local(path):
        real = os.path.realpath(os.path.join(path, file))
        inside = any(os.path.commonpath([real, root]) == root for root in _allowed_roots(path))
    else:  # no symlinks on object stores: a relative name without '..' stays inside
        real, inside = paths.join(paths.absolute(path), file), paths.scheme(file) is None
    if os.path.isabs(file) or ".." in file.replace("\\", "/").split("/") or not inside:
        where = (
            f"{index!r} names the shard {file!r} (for {name!r})"
            if index
            else f"{paths.join(path, file)!r} is a link"
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


def _read_block(
    sl: Any, src: _Source, index: tuple[slice, ...], shape: tuple[int, ...]
) -> np.ndarray:
    """The target block at `index` (one device's shard), reading the fewest stored rows.

    Each stored axis is read as the contiguous range spanned by the block's first dim in that
    axis's group; the other dims of the group are cut out afterwards (they are whole in every
    layout that the default rules produce, so nothing extra is read there).
    """
    ranges = [range(*s.indices(n)) for s, n in zip(index, shape, strict=True)]
    view: list[range] = [range(0)] * len(ranges)
    for i, v in enumerate(src.perm):
        view[v] = ranges[i]
    stored, post, block_shape, axis = [], [], [], 0
    for g, group in enumerate(src.groups):
        inner = math.prod(group[1:])
        off = src.offset if g == len(src.groups) - 1 else 0
        first = view[axis]
        stored.append(slice(off + first.start * inner, off + first.stop * inner))
        post.append(slice(None))
        block_shape.append(len(first))
        for j in range(1, len(group)):
            post.append(slice(view[axis + j].start, view[axis + j].stop))
            block_shape.append(group[j])
        axis += len(group)
    block = np.asarray(sl[tuple(stored)]).reshape(block_shape)[tuple(post)]
    return np.transpose(block, src.perm)


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
    sources = _gpt2_sources(desc) if desc["family"] == "gpt2" else _llama_sources(desc)
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
            name = next((n for n in src.names if n in weights.file_of), None)
            if name is None:
                problems.append(f"'{src.names[0]}' is missing")
                continue
            used.add(name)
            sl = weights.slice(name)
            if tuple(sl.get_shape()) != src.shape:
                problems.append(
                    f"'{name}' has shape {tuple(sl.get_shape())}, config.json implies {src.shape}"
                )
            elif sl.get_dtype() not in FLOAT_DTYPES:
                problems.append(
                    f"'{name}' is {sl.get_dtype()}, not a float type (quantized "
                    f"checkpoints are not supported)"
                )
            resolved[key] = (name, src)
        unused = sorted(
            n
            for n in set(weights.file_of) - used
            if not n.endswith(BUFFER_SUFFIXES) and n != "lm_head.weight"
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
        name, src = resolved[key]
        file = os.path.join(path, weights.file_of[name])
        cache: dict[tuple, np.ndarray] = {}

        def block(index, name=name, file=file, src=src, leaf=leaf, cache=cache):
            k = tuple(s.indices(n)[:2] for s, n in zip(index, leaf.shape, strict=True))
            if k not in cache:  # devices holding the same block share one read
                with _open_slice(file, name) as sl:
                    data = _read_block(sl, src, index, leaf.shape)
                cache[k] = data.astype(leaf.dtype, copy=False)
            return cache[k]

        out[key] = jax.make_array_from_callback(leaf.shape, leaf.sharding, block)
        cache.clear()
    return nest_weights(out)


# ---------------------------------------------------------------------------------- tokenizer
