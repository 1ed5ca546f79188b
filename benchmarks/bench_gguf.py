"""Benchmark: reading a GGUF file: its header (the walk of `ppl_jax.checkpoints.formats.gguf_file`
against the `gguf` package's `GGUFReader`) and its weights dequantized onto the devices.

    python -m benchmarks.bench_gguf [--layers 8] [--vocab_tokens 150000] [--dir /tmp]

Writes a Llama of `--layers` layers (width 512, MLP 2,048, vocabulary 8,192; 42 M parameters at 8
layers) in Q4_K and Q8_0 (random valid blocks, `ppl_jax.testing.write_gguf_llama`) with a
byte-level vocabulary of `--vocab_tokens` tokens and as many merges in its metadata; times,
median of 3: the header read by the walk and by `gguf.GGUFReader`, and `Checkpoint.restore` onto
the process's devices in float32 and bfloat16 (parameters per second), each with the weights
dequantized on the host (`checkpoint.dequantize=host`) and kept packed on the device (`auto`: the
bytes read and placed, nothing dequantized), against one plain read of the file. Removes the
file.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

import gguf
import jax

from ppl_jax import testing
from ppl_jax.checkpoints import architecture, open_checkpoint, resolve_architecture
from ppl_jax.checkpoints.formats import gguf_file
from ppl_jax.config.defaults import DEFAULT_RULES
from ppl_jax.runtime import mesh as mesh_lib


def _median(fn, repeats: int = 3) -> float:
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def _read_all(path: str) -> None:
    with open(path, "rb") as f:
        while f.read(64 << 20):
            pass


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--vocab_tokens", type=int, default=150_000)
    parser.add_argument("--dir", default=tempfile.gettempdir())
    args = parser.parse_args()
    path = os.path.join(args.dir, "bench_gguf.gguf")
    try:
        params, _ = testing.write_gguf_llama(path, args.layers, args.vocab_tokens)
        size = os.path.getsize(path)
        print(f"file: {size / 2**20:.1f} MiB, {params / 1e6:.1f} M parameters, "
              f"{args.vocab_tokens:,} tokens and merges")  # fmt: skip
        walk = _median(lambda: gguf_file.read(path))
        reader = _median(lambda: gguf.GGUFReader(path), repeats=1)
        print(f"header: walk {walk:.2f} s, gguf.GGUFReader {reader:.2f} s")
        mesh = mesh_lib.make_mesh(1, len(jax.devices()))
        for dtype in ("float32", "bfloat16"):
            for setting in ("host", "auto"):
                ckpt = open_checkpoint(path)
                model = resolve_architecture(ckpt).model(dtype=dtype)
                model, found = architecture.packed(ckpt, None, model, setting)
                target = mesh_lib.param_targets(model.abstract_params, model.logical_axes, mesh,
                                                DEFAULT_RULES)[0]  # fmt: skip
                ckpt.header  # noqa: B018  (read before timing)
                seconds = _median(
                    lambda c=ckpt, t=target: jax.block_until_ready(c.restore(None, t))
                )
                how = "dequantized on the host" if setting == "host" else (
                    f"{len(found.device)} weights packed on the device")  # fmt: skip
                print(f"restore ({dtype}, {how}, {len(jax.devices())} device(s)): "
                      f"{seconds:.2f} s, {params / seconds / 1e6:.0f} M parameters/s, "
                      f"{size / seconds / 2**20:.0f} MiB/s of the file")  # fmt: skip
        disk = _median(lambda: _read_all(path))
        print(
            f"reading the file once (cold or cached, as the OS has it): {disk:.2f} s, "
            f"{size / disk / 2**20:.0f} MiB/s"
        )
    finally:
        if os.path.exists(path):
            os.remove(path)


if __name__ == "__main__":
    main()
