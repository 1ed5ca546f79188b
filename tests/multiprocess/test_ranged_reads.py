"""A sharded safetensors checkpoint on a bucket, read by byte ranges on two processes (issue 25):
each process asks the bucket for about half of the weights' bytes (its shards' ranges, counted
by the filesystem), gets exactly the weights a local read gives, and its host memory grows by at
most 1.2x its own shard of the weights plus a constant while reading.

The bucket is a fake `gs://` (fsspec's DirFileSystem over a local folder, registered as fsspec's
`gs` implementation in each process, so that etils.epath and `ppl_jax.runtime.paths.filesystem`
reach it as they reach gcsfs) that counts the bytes each read asks for. The model (a Llama of
42 M float32 parameters, 168 MB in 9 shards) is placed on a `model`=8 mesh, 4 devices per
process: every weight but the norms is split between the two processes. Host memory is the
process's resident set, sampled every 2 ms while reading.
"""

from __future__ import annotations

import json

import numpy as np

import range_reads


def test_two_processes_each_fetch_their_half_within_bounded_memory(tmp_path):
    bucket = tmp_path / "gcs"
    folder = bucket / "models" / "llama"
    stored = range_reads.write_llama([folder])
    env = {"BUCKET": str(bucket), "CKPT": "gs://models/llama", "WANT": str(folder)}
    results = range_reads.run_workers(tmp_path, "range_reads.bucket_worker()", env)
    # Its half of every split weight, and the (tiny) replicated norms whole.
    range_reads.check_half(results, stored, most=0.51)


TS_WORKER = """
    import tensorstore as ts
    from jax.sharding import NamedSharding, PartitionSpec as P
    from ppl_jax.checkpoints.mapping import storage
    from ppl_jax.runtime import mesh as mesh_lib

    def bytes_read():
        found = ts.experimental_collect_matching_metrics("/tensorstore/kvstore/file/bytes_read")
        return sum(v["value"] for m in found for v in m["values"])

    names = json.loads(os.environ["NAMES"])
    mesh = mesh_lib.make_mesh(1, 8)
    specs, abstract = {}, {}
    for name, (shape, axis) in names.items():
        spec = [None, None]
        spec[axis] = "model"
        specs[name] = {"driver": "zarr", "kvstore": storage.tensorstore_kvstore(
            os.path.join(os.environ["TREE"], name))}
        abstract[name] = jax.ShapeDtypeStruct(tuple(shape), np.float32,
                                              sharding=NamedSharding(mesh, P(*spec)))
    before = bytes_read()
    got, figures = range_reads.measured(
        lambda: storage.place(abstract, storage.tensorstore_read(specs)))
    for name, x in got.items():
        for s in x.addressable_shards:
            want = np.load(os.path.join(os.environ["TREE"], name + ".npy"), mmap_mode="r")
            np.testing.assert_array_equal(np.asarray(s.data), want[s.index], name)
    range_reads.report(asked=bytes_read() - before, own=range_reads.own_bytes(got), **figures)
"""


def test_two_processes_each_read_their_half_of_tensorstore_arrays(tmp_path):
    # A tree of TensorStore (zarr, uncompressed) arrays, one per leaf, as levanter, EasyDeL and
    # T5X keep them, chunked as a pod writes them (one chunk per shard of 8): placed on the
    # `model`=8 mesh by `storage.place` over `storage.tensorstore_read`, each process reads the
    # chunks of its own 4 shards (TensorStore's own count of the file bytes it read).
    import tensorstore as ts

    tree = tmp_path / "tree"
    rng = np.random.default_rng(0)
    names, stored = {}, 0
    for i in range(8):
        shape, axis = (2048, 2048), i % 2
        chunks = [2048, 2048]
        chunks[axis] = 256
        data = rng.standard_normal(shape).astype(np.float32)
        spec = {"driver": "zarr", "kvstore": {"driver": "file", "path": str(tree / f"w{i}") + "/"},
                "metadata": {"shape": list(shape), "chunks": chunks, "dtype": "<f4",
                             "compressor": None}}  # fmt: skip
        array = ts.open(spec, create=True, delete_existing=True).result()
        array[...] = data
        np.save(tree / f"w{i}.npy", data)
        names[f"w{i}"] = (shape, axis)
        stored += data.nbytes
    env = {"TREE": str(tree), "NAMES": json.dumps(names)}
    results = range_reads.run_workers(tmp_path, TS_WORKER, env)
    range_reads.check_half(results, stored, most=0.52)
