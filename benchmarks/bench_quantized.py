"""Benchmark: dequantizing quantized Hugging Face weights on the host, by layout: weights per
second, and the temporary memory a block's read needs beyond the block it returns.

    python -m benchmarks.bench_quantized [--rows 4096] [--cols 14336]

Each layout's parts for one weight of `[rows, cols]` (Llama 3 8B's `down_proj` by default:
58.7 M weights) are made in memory with random codes and scales
(`ppl_jax.checkpoints.mapping.storage.Arrays`), and the whole weight is read as one device's block
through the reader ppl_jax uses (`quantized_parts.view`, then `Dequantized.read`): one thread, the
time of the best of three reads, and the peak of NumPy's allocations during a read (`tracemalloc`,
which NumPy reports to) beyond the block it returns. The float baseline casts the same weight stored
in bfloat16 to float32, as a float checkpoint's block is.
"""

from __future__ import annotations

import argparse
import functools
import time
import tracemalloc

import ml_dtypes
import numpy as np

from ppl_jax.checkpoints.mapping import storage
from ppl_jax.checkpoints.quantized import methods
from ppl_jax.checkpoints.quantized import parts as quantized_parts


def _packed(rng, shape, bits, axis) -> np.ndarray:
    """Random int32 words holding `shape`'s codes packed along `axis`."""
    words = list(shape)
    words[axis] = shape[axis] * bits // 32
    return rng.integers(0, 2**32, words, dtype=np.uint32).view(np.int32)


def layouts(rows: int, cols: int, rng) -> dict[str, tuple[dict, dict]]:
    """name -> (quantization_config, stored tensors of the weight `w`)."""
    g = cols // 128
    f16 = (rng.random((g, rows)) * 0.01).astype(np.float16)
    bf16 = (rng.random((rows, g)) * 0.01).astype(ml_dtypes.bfloat16)
    gptq = {"w.qweight": _packed(rng, (cols, rows), 4, 0), "w.scales": f16,
            "w.qzeros": _packed(rng, (g, rows), 4, 1),
            "w.g_idx": (np.arange(cols) // 128).astype(np.int32)}  # fmt: skip
    act = dict(gptq, **{"w.g_idx": rng.permutation(gptq["w.g_idx"]).astype(np.int32)})
    awq = {"w.qweight": _packed(rng, (cols, rows), 4, 1), "w.scales": f16,
           "w.qzeros": _packed(rng, (g, rows), 4, 1)}  # fmt: skip
    ct = {"w.weight_packed": _packed(rng, (rows, cols), 4, 1), "w.weight_scale": bf16,
          "w.weight_zero_point": _packed(rng, (rows, g), 4, 0)}  # fmt: skip
    fp8 = rng.standard_normal((rows, cols), np.float32).astype(ml_dtypes.float8_e4m3fn)
    blocks = rng.integers(0, 256, (1, rows, cols // 32, 16), dtype=np.uint8)
    group = {"type": "int", "num_bits": 4, "strategy": "group", "group_size": 128,
             "symmetric": False}  # fmt: skip
    return {
        "gptq 4-bit, groups of 128": ({"quant_method": "gptq", "bits": 4, "group_size": 128,
                                       "sym": False, "checkpoint_format": "gptq"}, gptq),
        "gptq 4-bit, act-order": ({"quant_method": "gptq", "bits": 4, "group_size": 128,
                                   "desc_act": True, "sym": False}, act),
        "awq 4-bit": ({"quant_method": "awq", "bits": 4, "group_size": 128}, awq),
        "compressed-tensors int4, groups of 128": (
            {"quant_method": "compressed-tensors", "format": "pack-quantized",
             "config_groups": {"g": {"weights": group}}}, ct),
        "compressed-tensors fp8 per channel": (
            {"quant_method": "compressed-tensors", "format": "float-quantized",
             "config_groups": {"g": {"weights": {"type": "float", "num_bits": 8,
                                                 "strategy": "channel"}}}},
            {"w.weight": fp8, "w.weight_scale": (rng.random((rows, 1)) * 0.01).astype(ml_dtypes.bfloat16)}),
        "fp8 blocks of 128 (DeepSeek-V3)": (
            {"quant_method": "fp8", "weight_block_size": [128, 128]},
            {"w": fp8, "w_scale_inv": rng.random((rows // 128, cols // 128), np.float32)}),
        "mxfp4 (one expert)": ({"quant_method": "mxfp4"},
                               {"w_blocks": blocks, "w_scales": np.full(blocks.shape[:-1], 120, np.uint8)}),
    }  # fmt: skip


DTYPE_NAMES = {"int32": "I32", "float16": "F16", "bfloat16": "BF16", "float32": "F32",
               "float8_e4m3fn": "F8_E4M3", "uint8": "U8"}  # fmt: skip


def measure(read) -> tuple[float, int, np.ndarray]:
    """(best seconds of three reads, the peak bytes allocated during one beyond what it
    returns, its block)."""
    seconds = []
    for _ in range(3):
        t0 = time.perf_counter()
        read()
        seconds.append(time.perf_counter() - t0)
    tracemalloc.start()
    tracemalloc.reset_peak()
    block = read()
    kept, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return min(seconds), peak - kept, block


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=4096)
    parser.add_argument("--cols", type=int, default=14336)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    n = args.rows * args.cols
    bf16 = rng.standard_normal((args.rows, args.cols), np.float32).astype(ml_dtypes.bfloat16)
    seconds, _, _ = measure(functools.partial(bf16.astype, np.float32))
    print(f"weight [{args.rows}, {args.cols}] ({n / 1e6:.1f} M), one thread")
    print(f"{'float baseline (bfloat16 to float32)':42s} {n / seconds / 1e6:7.0f} M weights/s")
    del bf16
    for name, (config, tensors) in layouts(args.rows, args.cols, rng).items():
        stored = {k: (v.shape, DTYPE_NAMES[v.dtype.name]) for k, v in tensors.items()}
        scheme = methods.parse({"quantization_config": config}, name)
        source, made = quantized_parts.view(scheme, storage.Arrays(tensors), stored, str, name)
        (target,) = source.tensors
        seconds, extra, block = measure(lambda s=source, t=target: s.read(t, ()))
        print(f"{name:42s} {n / seconds / 1e6:7.0f} M weights/s; block {block.nbytes / 2**20:.0f} "
              f"MiB ({block.dtype}), {extra / 2**20:.1f} MiB more while read")  # fmt: skip
        del block, source, tensors


if __name__ == "__main__":
    main()
