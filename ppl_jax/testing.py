"""Tiny models, random checkpoints and real text for tests, examples and benchmarks.

Not for scoring real models: everything here is random or small, made to exercise the library on
one CPU in seconds.

```python
from ppl_jax import testing

testing.save_random_checkpoint("/tmp/ckpt", steps=(100, 200))  # an Orbax run of a tiny Llama
corpus = testing.write_corpus("/tmp/corpus", [testing.stdlib_text(20_000)])
testing.write_gguf_llama("/tmp/model.gguf", layers=2)  # a quantized GGUF file of random blocks
testing.split_gguf("/tmp/model.gguf", "/tmp/split", 3)  # the same as a split model of 3 parts
```
"""

from __future__ import annotations

import os
import sysconfig
from typing import Any

import jax
import numpy as np
import optax
from flax import nnx

from ppl_jax.checkpoints.formats import orbax
from ppl_jax.models.adapters import params_of_nnx
from ppl_jax.models.decoders.llama import Llama, LlamaConfig

# A 2-layer Llama with grouped-query attention and an untied head over byte ids (21k params).
TINY = LlamaConfig(
    vocab_size=256,
    embed_dim=32,
    num_layers=2,
    num_heads=4,
    num_kv_heads=2,
    head_dim=8,
    mlp_dim=64,
    max_positions=128,
    tie_embeddings=False,
)
# Standard-library modules whose source serves as real text (prose in docstrings and comments,
# and code); not the demo's held-out modules (`ppl_jax.config.defaults.HELD_OUT_MODULES`).
TEXT_MODULES = ("argparse.py", "difflib.py", "pprint.py", "calendar.py", "string.py")


def random_params(cfg: LlamaConfig = TINY, seed: int = 0) -> dict[str, Any]:
    """Random params of `cfg` (float32), with norm weights perturbed away from 1 so they matter."""
    params = params_of_nnx(Llama(cfg, nnx.Rngs(seed)))
    rng = np.random.default_rng(seed)

    def perturb(path, x):
        if str(path[-1].key).endswith("norm"):
            return x + 0.1 * rng.standard_normal(x.shape).astype(np.float32)
        return x

    return jax.tree_util.tree_map_with_path(perturb, params)


def save_random_checkpoint(
    path: str,
    cfg: LlamaConfig = TINY,
    steps: tuple[int, ...] = (5,),
    seed: int = 0,
    tokenizer: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Saves a training state (params and AdamW state) of random params at each step, with the
    architecture and tokenizer (`{"type": "byte"}` by default) ppl_jax reads; returns the params."""
    params = random_params(cfg, seed)
    opt_state = optax.adamw(1e-3).init(params)
    for step in steps:
        orbax.save_train_state(
            path,
            step,
            {"step": step, "params": params, "opt_state": opt_state},
            {"model": cfg.to_dict(), "tokenizer": tokenizer or {"type": "byte"}},
        )
    return params


def stdlib_text(num_chars: int, modules: tuple[str, ...] = TEXT_MODULES) -> str:
    """The first `num_chars` characters of the named standard-library sources, joined by blank
    lines: real, varied text present on every Python installation.

    Raises:
      ValueError: the modules hold fewer characters.
    """
    stdlib = sysconfig.get_paths()["stdlib"]
    parts, total = [], 0
    for name in modules:
        with open(os.path.join(stdlib, name), encoding="utf-8") as f:
            parts.append(f.read())
        total += len(parts[-1])
        if total >= num_chars:
            break
    text = "\n\n".join(parts)[:num_chars]
    if len(text) != num_chars:
        raise ValueError(f"the modules {modules} hold fewer than {num_chars} characters")
    return text


def write_corpus(folder: str, texts: list[str], name: str = "doc") -> str:
    """Writes each text to its own file in `folder`; returns the comma-separated paths (a
    `DatasetSpec.path`)."""
    os.makedirs(folder, exist_ok=True)
    paths = []
    for i, text in enumerate(texts):
        path = os.path.join(folder, f"{name}{i}.txt")
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
        paths.append(path)
    return ",".join(paths)


def write_gguf_llama(
    path: str, layers: int = 8, vocab_tokens: int = 0, seed: int = 0, float32: bool = False
) -> tuple[int, int]:
    """Writes a GGUF file (architecture `llama`) of random valid Q8_0 and Q4_K blocks.

    The model: width 512, 8 heads of 64 (as many key/value heads), MLP 2,048, vocabulary 8,192,
    128 positions, `layers` layers (42 M parameters at 8). Q8_0: the embedding, `attn_v`,
    `attn_output`, `ffn_down`; Q4_K: the output head, `attn_q`, `attn_k`, `ffn_gate`, `ffn_up`;
    the norms F32 ones. Each block holds random bytes (NumPy's generator of `seed`) with its
    float16 scales (Q8_0's `d`, Q4_K's `d` and `dmin`) set to 1e-3, so every dequantized value
    is finite. With `float32`, every matrix is float32 instead, N(0, 0.02^2) (an original to
    quantize: `requantize_gguf`). With `vocab_tokens` > 0, the metadata holds a byte-level BPE tokenizer (`gpt2`)
    of that many tokens `t0, t1, ...` and the merges of each token with the next; with 0, none.

    Returns:
      (parameters, bytes of the tensors' data in the file).
    """
    import gguf
    from gguf import GGMLQuantizationType as Q

    d, heads, mlp, vocab = 512, 8, 2048, 8192
    rng = np.random.default_rng(seed)
    writer = gguf.GGUFWriter(path, "llama")
    for key, value in dict(block_count=layers, context_length=128, embedding_length=d,
                           feed_forward_length=mlp, head_count=heads, head_count_kv=heads,
                           layer_norm_rms_eps=1e-5, vocab_size=vocab).items():  # fmt: skip
        getattr(writer, f"add_{key}")(value)
    if vocab_tokens:
        tokens = [f"t{i}" for i in range(vocab_tokens)]
        writer.add_tokenizer_model("gpt2")
        writer.add_token_list(tokens)
        writer.add_token_types([1] * vocab_tokens)
        writer.add_token_merges([f"{a} {b}" for a, b in zip(tokens, tokens[1:], strict=False)])
    parameters = stored = 0

    def add(name: str, shape: tuple[int, ...], qtype: Q) -> None:
        nonlocal parameters, stored
        if qtype == Q.F32 and len(shape) == 1:
            data = np.ones(shape, np.float32)
        elif float32:
            qtype = Q.F32
            data = (0.02 * rng.standard_normal(shape)).astype(np.float32)
        else:
            block, size = gguf.GGML_QUANT_SIZES[qtype]
            raw = rng.integers(0, 256, (shape[0] * shape[1] // block, size), dtype=np.uint8)
            for at in {Q.Q8_0: (0,), Q.Q4_K: (0, 2)}[qtype]:
                raw[:, at : at + 2] = np.full((len(raw), 1), 1e-3, np.float16).view(np.uint8)
            data = raw.reshape(shape[0], -1)
        writer.add_tensor(name, data, raw_dtype=qtype)
        parameters += int(np.prod(shape))
        stored += data.nbytes

    add("token_embd.weight", (vocab, d), Q.Q8_0)
    add("output.weight", (vocab, d), Q.Q4_K)
    add("output_norm.weight", (d,), Q.F32)
    for i in range(layers):
        for name, shape, qtype in (("attn_q", (d, d), Q.Q4_K), ("attn_k", (d, d), Q.Q4_K),
                                   ("attn_v", (d, d), Q.Q8_0), ("attn_output", (d, d), Q.Q8_0),
                                   ("ffn_gate", (mlp, d), Q.Q4_K), ("ffn_up", (mlp, d), Q.Q4_K),
                                   ("ffn_down", (d, mlp), Q.Q8_0), ("attn_norm", (d,), Q.F32),
                                   ("ffn_norm", (d,), Q.F32)):  # fmt: skip
            add(f"blk.{i}.{name}.weight", shape, qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return parameters, stored


def requantize_gguf(path: str, out: str, qtype_name: str) -> None:
    """Writes the GGUF file `path` again as `out`, its 2-D tensors but the embedding quantized
    to the GGML type `qtype_name` by the `gguf` package's own `quants.quantize` (Q8_0, Q4_0,
    Q4_1, Q5_0, ...), the metadata and the other tensors as they are: a quantized copy of an
    original for a study (`study.copies`)."""
    import gguf

    qtype = gguf.GGMLQuantizationType[qtype_name]
    reader = gguf.GGUFReader(path)
    writer = gguf.GGUFWriter(out, reader.fields["general.architecture"].contents())
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        kind = field.types[0]
        sub = {"sub_type": field.types[-1]} if kind == gguf.GGUFValueType.ARRAY else {}
        writer.add_key_value(key, field.contents(), kind, **sub)
    for t in reader.tensors:
        data = np.asarray(t.data).reshape([int(n) for n in reversed(t.shape)])
        if data.ndim == 2 and t.name != "token_embd.weight":
            writer.add_tensor(t.name, gguf.quants.quantize(data, qtype), raw_dtype=qtype)
        else:
            writer.add_tensor(t.name, data)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def split_gguf(path: str, folder: str, parts: int) -> list[str]:
    """Writes the GGUF file `path` again as a split model of `parts` files in `folder`, as
    llama.cpp's `llama-gguf-split --split` lays one out (gguf-py's `GGUFWriter` with
    `split_max_tensors`): `<stem>-00001-of-0000N.gguf`, ..., the tensors in the file's order, as
    many in each part (the last fewer), each tensor's bytes as the file stores them, all the
    metadata in the first part, and `split.no`, `split.count`, `split.tensors.count` in each.

    Returns:
      the parts' paths, the first first.
    """
    import pathlib

    import gguf

    os.makedirs(folder, exist_ok=True)
    reader = gguf.GGUFReader(path)
    arch = reader.fields["general.architecture"].contents()
    per_part = -(-len(reader.tensors) // parts)
    stem = pathlib.Path(path).stem
    writer = gguf.GGUFWriter(
        pathlib.Path(folder) / f"{stem}.gguf", arch, split_max_tensors=per_part
    )
    for name, field in reader.fields.items():
        if name.startswith("GGUF.") or name in ("general.architecture", "general.alignment"):
            continue
        kind = field.types[0]
        sub = field.types[-1] if kind == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(name, field.contents(), kind, sub_type=sub)
    if "general.alignment" in reader.fields:
        writer.data_alignment = int(reader.fields["general.alignment"].contents())
    for t in reader.tensors:
        writer.add_tensor(t.name, t.data, raw_dtype=t.tensor_type)
    names = [str(p) for p in writer.format_shard_names(writer.path)]  # gguf-py's own names
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return names
