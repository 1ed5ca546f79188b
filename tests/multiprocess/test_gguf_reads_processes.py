"""A quantized GGUF file restored on two processes: each process reads about half of the file's
tensor bytes (the byte ranges of its own devices' blocks), dequantizes them into float32 params
equal to the `gguf` package's dequantization, and its host memory grows by at most 1.2x its own
shard of the params plus the float reader's 64 MiB (tests/multiprocess/test_ranged_reads.py)
while reading (a quantized file never passes through a full-precision copy on one host).

The file is a Llama of 42 M parameters in Q8_0 and Q4_K (random valid blocks, 36 MB:
`ppl_jax.testing.write_gguf_llama`), placed on a `model`=8 mesh, 4 devices per process: every
weight but the norms is split between the two processes. The same holds for the file split into
3 parts as llama.cpp's `llama-gguf-split` does, opened by their folder (each tensor read from its
own part). Host memory is the process's resident set, sampled every 2 ms while reading.
"""

from __future__ import annotations

import os

import pytest

from ppl_jax import testing

import range_reads

WORKER = """
    import gguf
    from ppl_jax.checkpoints import architecture, open_checkpoint
    from ppl_jax.checkpoints.formats import gguf_file
    from ppl_jax.models.interface import weight_paths

    asked = {"bytes": 0}
    pread = gguf_file._pread

    def counted(path, ranges):
        asked["bytes"] += sum(n for _, n in ranges)
        return pread(path, ranges)

    gguf_file._pread = counted
    ckpt = open_checkpoint(os.environ["FILE"])
    target = range_reads.sharded_target(architecture.resolve(ckpt).model())
    ckpt.header  # the header, read before counting
    asked["bytes"] = 0
    params, figures = range_reads.measured(lambda: weight_paths(ckpt.restore(None, target)))
    reader = gguf.GGUFReader(os.environ["REFERENCE"])
    t = {t.name: t for t in reader.tensors}["blk.3.ffn_down.weight"]
    want = gguf.quants.dequantize(t.data, t.tensor_type).T  # [D, MLP]: the params' are [MLP, D]
    for s in params["layers/3/mlp/down"].addressable_shards:
        np.testing.assert_array_equal(np.asarray(s.data), want[s.index])
    range_reads.report(asked=asked["bytes"], own=range_reads.own_bytes(params), **figures)
"""


@pytest.mark.parametrize("parts", [1, 3])
def test_two_processes_each_read_their_half_within_bounded_memory(tmp_path, parts):
    path = tmp_path / "model.gguf"
    _, stored = testing.write_gguf_llama(str(path), layers=8)
    opened = str(path)
    if parts > 1:  # the same tensors split into 3 files, opened by their folder
        opened = os.path.dirname(testing.split_gguf(opened, str(tmp_path / "split"), parts)[0])
    env = {"FILE": opened, "REFERENCE": str(path)}
    results = range_reads.run_workers(tmp_path, WORKER, env)
    range_reads.check_half(results, stored, most=0.51)
