"""A GPTQ-quantized Hugging Face checkpoint on a bucket, read by byte ranges on two processes:
each process asks the bucket for about half of the quantized bytes (its devices' columns or rows
of `qweight`, `scales` and `qzeros`), dequantizes only its own shard, gets exactly the weights of
a float32 checkpoint holding the dequantized values (computed here in NumPy from the codes, not
by ppl_jax), and its host memory grows by at most 1.2x its own shard plus 64 MiB while reading
(the bound of the float reader, tests/multiprocess/test_ranged_reads.py; measured here: 1.41x
own).

The model is a Llama of 42 M parameters (34 M of them in 4-bit GPTQ, groups of 128,
`checkpoint_format` gptq_v2, 17 MB packed) on a `model`=8 mesh, 4 devices per process, restored
in float32: the projections and the embedding are split between the two processes.
"""

from __future__ import annotations

import numpy as np

import range_reads

GROUP = 128
QUANTIZATION = {"quant_method": "gptq", "bits": 4, "group_size": GROUP, "desc_act": False,
                "sym": False, "checkpoint_format": "gptq_v2"}  # fmt: skip


def _gptq(rng, out_f: int, in_f: int) -> list[dict[str, np.ndarray]]:
    """A GPTQ (v2) linear written by the format's formula: 4-bit codes packed 8 to a word along
    the input axis (code k of a word at bits 4k), zero points 8 to a word along the output
    axis, float16 scales per group of 128 rows (the quantized checkpoint's tensors); and its
    dequantized `weight` `[out, in]` float32 (`scales[g] * (codes - zeros[g])` in float16, as
    gptqmodel's kernel computes it: the float checkpoint's)."""
    groups = in_f // GROUP
    codes = rng.integers(0, 16, (in_f, out_f), dtype=np.uint32)
    zeros = rng.integers(0, 16, (groups, out_f), dtype=np.uint32)
    scales = (0.002 + 0.01 * rng.random((groups, out_f))).astype(np.float16)
    shifts = (4 * np.arange(8, dtype=np.uint32))[None, :, None]
    qweight = (codes.reshape(in_f // 8, 8, out_f) << shifts).sum(1, dtype=np.uint32)
    qzeros = (zeros.reshape(groups, out_f // 8, 8) << shifts[:, :, 0][:, None, :]).sum(
        2, dtype=np.uint32
    )
    g = np.arange(in_f) // GROUP
    diff = codes.astype(np.float32) - zeros[g].astype(np.float32)
    weight = (diff * scales[g].astype(np.float32)).astype(np.float16).astype(np.float32)
    parts = {
        "qweight": qweight.view(np.int32),
        "qzeros": qzeros.view(np.int32),
        "scales": scales,
        "g_idx": g.astype(np.int32),
    }
    return [parts, {"weight": np.ascontiguousarray(weight.T)}]


def test_two_processes_each_dequantize_their_half_within_bounded_memory(tmp_path):
    # The GPTQ directory on the bucket, and its dequantized float32 copy in a local folder.
    bucket, floats = tmp_path / "gcs", tmp_path / "float"
    stored = range_reads.write_llama([bucket / "models" / "gptq", floats], _gptq, QUANTIZATION)
    env = {"BUCKET": str(bucket), "CKPT": "gs://models/gptq", "WANT": str(floats)}
    results = range_reads.run_workers(tmp_path, "range_reads.bucket_worker()", env)
    # Its half of every split weight, the replicated norms and each g_idx whole.
    range_reads.check_half(results, stored, most=0.53)
