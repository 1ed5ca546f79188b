"""Benchmark: reading a GGUF file: its header (the walk of `ppl_jax.checkpoints.gguf_file`
against the `gguf` package's `GGUFReader`) and its weights dequantized onto the devices.

    python -m benchmarks.bench_gguf [--layers 8] [--vocab_tokens 150000] [--dir /tmp]

Writes a Llama of `--layers` layers (width 512, MLP 2,048, vocabulary 8,192; 42 M parameters at 8
layers) in Q4_K and Q8_0 (random valid blocks) with a byte-level vocabulary of `--vocab_tokens`
tokens and as many merges in its metadata; times, median of 3: the header read by the walk and by
`gguf.GGUFReader`, and `Checkpoint.restore` onto the process's devices in float32 and bfloat16
(parameters per second). Removes the file.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

import gguf
import jax
import numpy as np
from gguf import GGMLQuantizationType as Q

from ppl_jax.checkpoints import gguf_file, open_checkpoint
from ppl_jax.config.defaults import DEFAULT_RULES
from ppl_jax.runtime import mesh as mesh_lib

D, HEADS, MLP, VOCAB = 512, 8, 2048, 8192


def _blocks(shape: tuple[int, int], qtype: Q, rng) -> np.ndarray:
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, (shape[0] * shape[1] // block, size), dtype=np.uint8)
    for at in {Q.Q8_0: (0,), Q.Q4_K: (0, 2)}[qtype]:
        raw[:, at : at + 2] = np.full((len(raw), 1), 1e-3, np.float16).view(np.uint8)
    return raw.reshape(shape[0], -1)


def write(path: str, layers: int, tokens: int) -> int:
    """The file; returns its parameter count."""
    rng = np.random.default_rng(0)
    w = gguf.GGUFWriter(path, "llama")
    for key, value in dict(block_count=layers, context_length=128, embedding_length=D,
                           feed_forward_length=MLP, head_count=HEADS, head_count_kv=HEADS,
                           layer_norm_rms_eps=1e-5, vocab_size=VOCAB).items():  # fmt: skip
        getattr(w, f"add_{key}")(value)
    vocab = [f"t{i}" for i in range(tokens)]
    w.add_tokenizer_model("gpt2")
    w.add_token_list(vocab)
    w.add_token_types([1] * tokens)
    w.add_token_merges([f"{a} {b}" for a, b in zip(vocab, vocab[1:], strict=False)])
    count = 0

    def add(name, shape, qtype):
        nonlocal count
        data = np.ones(shape, np.float32) if qtype == Q.F32 else _blocks(shape, qtype, rng)
        w.add_tensor(name, data, raw_dtype=qtype)
        count += int(np.prod(shape))

    add("token_embd.weight", (VOCAB, D), Q.Q8_0)
    add("output.weight", (VOCAB, D), Q.Q4_K)
    add("output_norm.weight", (D,), Q.F32)
    for i in range(layers):
        for name, shape, qtype in (("attn_q", (D, D), Q.Q4_K), ("attn_k", (D, D), Q.Q4_K),
                                   ("attn_v", (D, D), Q.Q8_0), ("attn_output", (D, D), Q.Q8_0),
                                   ("ffn_gate", (MLP, D), Q.Q4_K), ("ffn_up", (MLP, D), Q.Q4_K),
                                   ("ffn_down", (D, MLP), Q.Q8_0), ("attn_norm", (D,), Q.F32),
                                   ("ffn_norm", (D,), Q.F32)):  # fmt: skip
            add(f"blk.{i}.{name}.weight", shape, qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return count


def _median(fn, repeats: int = 3) -> float:
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--vocab_tokens", type=int, default=150_000)
    parser.add_argument("--dir", default=tempfile.gettempdir())
    args = parser.parse_args()
    path = os.path.join(args.dir, "bench_gguf.gguf")
    try:
        params = write(path, args.layers, args.vocab_tokens)
        size = os.path.getsize(path)
        print(f"file: {size / 2**20:.1f} MiB, {params / 1e6:.1f} M parameters, "
              f"{args.vocab_tokens:,} tokens and merges")  # fmt: skip
        walk = _median(lambda: gguf_file.read(path))
        reader = _median(lambda: gguf.GGUFReader(path), repeats=1)
        print(f"header: walk {walk:.2f} s, gguf.GGUFReader {reader:.2f} s")
        mesh = mesh_lib.make_mesh(1, len(jax.devices()))
        for dtype in ("float32", "bfloat16"):
            ckpt = open_checkpoint(path)
            model = ckpt.model(dtype=dtype)
            target = mesh_lib.param_targets(model.abstract_params, model.logical_axes, mesh,
                                            DEFAULT_RULES)[0]  # fmt: skip
            ckpt.header  # noqa: B018  (read before timing)
            seconds = _median(lambda c=ckpt, t=target: jax.block_until_ready(c.restore(None, t)))
            print(f"restore ({dtype}, {len(jax.devices())} device(s)): {seconds:.2f} s, "
                  f"{params / seconds / 1e6:.0f} M parameters/s")  # fmt: skip
    finally:
        if os.path.exists(path):
            os.remove(path)


if __name__ == "__main__":
    main()
