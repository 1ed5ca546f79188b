"""What the multiprocess tests of reads by byte ranges share (test_ranged_reads.py,
test_quantized_reads.py, test_gguf_reads_processes.py, test_stacked_reads.py; this module is not
collected: no `test_` prefix).

Each test writes a checkpoint, restores it on two processes joined by `jax.distributed` (4 of the
8 fake CPU devices each, a `model`=8 mesh, so that every weight but the norms is split between
them), and each process reports how many bytes it read, its own shard's bytes and how far its
resident set grew while reading.

- In the test's process: `run_workers` starts a worker on the two processes and returns their
  RESULT lines; `check_half` prints them and asserts that each process read about half of the
  stored bytes within bounded memory; `write_llama` writes the sharded Hugging Face Llama
  (safetensors) of the bucket tests.
- In a worker (`run_workers` puts this folder on its `PYTHONPATH`): `counting_bucket` (a fake
  `gs://` over a local folder that counts the bytes asked of it), `sharded_target`, `measured`
  (a read under a resident-set sampler), `own_bytes`, `report`; `bucket_worker` is the whole
  worker of the bucket tests (a safetensors checkpoint on the bucket against a local one).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
CONSTANT = 64 << 20  # bytes a read may hold beyond 1.2x its own shard (measured: 40-65 MiB for
# own shards of 80 to 417 MiB: the read-ahead budget, 8 readers' buffers, the allocator's arenas)

# The bucket tests' Llama: 42 M parameters, 168 MB in float32.
D, LAYERS, HEADS, MLP, VOCAB = 512, 8, 8, 2048, 8192
HF_CONFIG = {
    "model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": VOCAB,
    "hidden_size": D, "intermediate_size": MLP, "num_hidden_layers": LAYERS,
    "num_attention_heads": HEADS, "num_key_value_heads": HEADS,
    "max_position_embeddings": 128, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
    "tie_word_embeddings": False, "hidden_act": "silu",
}  # fmt: skip

# A worker: the body of `main` runs once the process has joined the run.
_SCRIPT = """\
import json, os, sys
from absl import app


def main(argv):
    from ppl_jax.runtime import distributed
    assert distributed.initialize_from_env()
    import jax
    import numpy as np
    import range_reads
{body}


app.run(main)
"""


def run_workers(tmp_path, body: str, env: dict[str, str], processes: int = 2) -> list[dict]:
    """Runs a worker on `processes` processes of one JAX run on localhost, 8 fake CPU devices in
    all (`helpers.process_env`), each with `env` added to its environment.

    `body` is the source of the worker's `main` (any common indentation is removed), run after
    the process has joined the run, with `json`, `os`, `sys`, `jax`, `np` (NumPy) and this module
    (`range_reads`) imported; it prints its one result with `report`.

    Returns:
      Each process's result (the JSON object of its RESULT line), in process order.

    Raises:
      AssertionError: a process exited non-zero (the end of its stderr) or printed other than
        one RESULT line.
    """
    import helpers

    script = tmp_path / "worker.py"
    script.write_text(_SCRIPT.format(body=textwrap.indent(textwrap.dedent(body).strip(), " " * 4)))
    port = helpers.free_port()
    procs = []
    try:
        for i in range(processes):
            penv = {**helpers.process_env(i, processes, port), **env}
            penv["PYTHONPATH"] = os.pathsep.join(p for p in (HERE, penv.get("PYTHONPATH")) if p)
            procs.append(subprocess.Popen([sys.executable, str(script)], env=penv,
                                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))  # fmt: skip
        results = []
        for p in procs:
            out, err = p.communicate(timeout=540)
            assert p.returncode == 0, err[-3000:]
            lines = [json.loads(x[7:]) for x in out.splitlines() if x.startswith("RESULT ")]
            assert len(lines) == 1, out[-3000:]
            results += lines
        return results
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


def check_half(results: list[dict], stored: int, most: float) -> None:
    """Prints each process's figures, and asserts of each that it read more than 0.49 and less
    than `most` of the `stored` bytes (`asked`: its half of every split weight, plus what every
    process reads whole) and that its resident set grew (`grew`) by at most 1.2x its own shard
    of the restored params (`own`) plus `CONSTANT`."""
    mib = 1 << 20
    for r in results:
        print(
            f"process {r['process']}: read {r['asked'] / mib:.1f} MiB of {stored / mib:.1f} MiB "
            f"({r['asked'] / stored:.3f}); own shard {r['own'] / mib:.1f} MiB as restored; "
            f"resident set grew {r['grew'] / mib:.1f} MiB ({r['grew'] / r['own']:.2f}x own) in "
            f"{r['seconds']:.1f} s"
        )
    for r in results:
        assert 0.49 * stored < r["asked"] < most * stored, (r, stored)
        assert r["grew"] <= 1.2 * r["own"] + CONSTANT, r


def _float_linear(rng, out_f: int, in_f: int) -> list[dict[str, np.ndarray]]:
    return [{"weight": (0.02 * rng.standard_normal((out_f, in_f))).astype(np.float32)}]


def write_llama(
    folders: list,
    linear: Callable[[Any, int, int], list[dict[str, np.ndarray]]] = _float_linear,
    quantization: dict | None = None,
) -> int:
    """Writes the Llama of `HF_CONFIG` as a Hugging Face directory in each of `folders` (created):
    9 safetensors shards (the tables, then one per layer), random float32 tables and norms
    (NumPy's generator of seed 0), and each projection `[out, in]` as `linear(rng, out, in)`
    gives it: one dict of tensors by suffix for each folder (by default one float32 `weight` of
    standard deviation 0.02, in one folder). `quantization` is the first folder's
    `quantization_config`.

    Returns:
      The bytes of the first folder's tensors.
    """
    from safetensors.numpy import save_file

    rng = np.random.default_rng(0)
    for i, folder in enumerate(folders):
        folder.mkdir(parents=True)
        extra = {"quantization_config": quantization} if quantization and i == 0 else {}
        (folder / "config.json").write_text(json.dumps({**HF_CONFIG, **extra}))
    maps: list[dict[str, str]] = [{} for _ in folders]
    totals = [0] * len(folders)

    def w(*shape):
        return (0.02 * rng.standard_normal(shape)).astype(np.float32)

    def shard(name: str, plain: dict[str, np.ndarray], linears: dict[str, tuple[int, int]]):
        copies = [dict(plain) for _ in folders]
        for head, (out_f, in_f) in linears.items():
            for copy, parts in zip(copies, linear(rng, out_f, in_f), strict=True):
                copy.update({f"{head}.{k}": v for k, v in parts.items()})
        for i, (folder, tensors) in enumerate(zip(folders, copies, strict=True)):
            save_file(tensors, str(folder / name))
            maps[i].update(dict.fromkeys(tensors, name))
            totals[i] += sum(t.nbytes for t in tensors.values())

    shard("tables.safetensors", {"model.embed_tokens.weight": w(VOCAB, D),
          "lm_head.weight": w(VOCAB, D), "model.norm.weight": 1 + w(D)}, {})  # fmt: skip
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        plain = {p + "input_layernorm.weight": 1 + w(D),
                 p + "post_attention_layernorm.weight": 1 + w(D)}  # fmt: skip
        linears = {**{f"{p}self_attn.{n}_proj": (D, D) for n in "qkvo"},
                   p + "mlp.gate_proj": (MLP, D), p + "mlp.up_proj": (MLP, D),
                   p + "mlp.down_proj": (D, MLP)}  # fmt: skip
        shard(f"layer{i}.safetensors", plain, linears)
    for folder, weight_map, total in zip(folders, maps, totals, strict=True):
        index = {"metadata": {"total_size": total}, "weight_map": weight_map}
        (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    return totals[0]


# ---- In a worker.


def rss() -> int:
    """This process's resident set, bytes."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def counting_bucket(root: str, suffix: str) -> dict[str, int]:
    """Makes `gs://` (and `gcs://`) the local folder `root` in this process: fsspec's
    DirFileSystem, registered as fsspec's `gs` implementation, so that etils.epath and
    `ppl_jax.runtime.paths.filesystem` reach it as they reach gcsfs; it adds the bytes each read
    of a file whose name ends in `suffix` returns to the count it returns (`{"bytes": n}`)."""
    from etils.epath import backend as epath_backend
    from fsspec.implementations.dirfs import DirFileSystem
    from fsspec.implementations.local import LocalFileSystem
    from fsspec.registry import _registry

    asked = {"bytes": 0}

    class CountingGCS(DirFileSystem):
        protocol = ("gs", "gcs")
        cachable = False

        def __init__(self, *args, **kwargs):
            super().__init__(path=root, fs=LocalFileSystem())

        def cat_file(self, path, start=None, end=None, **kwargs):
            data = super().cat_file(path, start=start, end=end, **kwargs)
            if path.endswith(suffix):
                asked["bytes"] += len(data)
            return data

        def cat_ranges(self, paths, starts, ends, **kwargs):
            return [self.cat_file(p, s, e) for p, s, e in zip(paths, starts, ends, strict=True)]

    _registry["gs"] = _registry["gcs"] = CountingGCS
    epath_backend.fsspec_backend._get_filesystem.cache_clear()
    return asked


def sharded_target(model) -> Any:
    """The targets (`jax.ShapeDtypeStruct`s with their shardings) of `model`'s params on a
    `model`=8 mesh over the run's 8 devices."""
    from ppl_jax.config.defaults import DEFAULT_RULES
    from ppl_jax.runtime import mesh as mesh_lib

    mesh = mesh_lib.make_mesh(1, 8)
    return mesh_lib.param_targets(model.abstract_params, model.logical_axes, mesh, DEFAULT_RULES)[0]


def measured(read: Callable[[], Any]) -> tuple[Any, dict[str, float]]:
    """Runs `read` until what it returns is ready, with the resident set sampled every 2 ms.

    Returns:
      What `read` returned, and `{"grew": the peak resident set less the one before, bytes,
      "seconds": wall time of the read}`.
    """
    import jax

    before, peak, done = rss(), [0], threading.Event()

    def sample():
        while not done.is_set():
            peak[0] = max(peak[0], rss())
            time.sleep(0.002)

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        t0 = time.perf_counter()
        out = jax.block_until_ready(read())
        seconds = time.perf_counter() - t0
    finally:
        done.set()
        sampler.join()
    peak[0] = max(peak[0], rss())
    return out, {"grew": peak[0] - before, "seconds": seconds}


def own_bytes(tree) -> int:
    """Bytes of this process's shards of the arrays in `tree`."""
    import jax

    return sum(s.data.nbytes for x in jax.tree.leaves(tree) for s in x.addressable_shards)


def report(**figures) -> None:
    """Prints this process's RESULT line (its index and `figures`, JSON) for `run_workers`."""
    import jax

    print("RESULT " + json.dumps({"process": jax.process_index(), **figures}), flush=True)


def bucket_worker() -> None:
    """The bucket tests' worker: restores `CKPT` (on the counting bucket over the folder `BUCKET`,
    its `.safetensors` reads counted once the headers are read) onto `sharded_target` under
    `measured`, asserts that every shard equals that of the local checkpoint `WANT` restored on
    the same target, and reports the bytes asked, its own shard's bytes, `grew` and `seconds`."""
    from ppl_jax.checkpoints import architecture, open_checkpoint
    from ppl_jax.models.interface import weight_paths

    asked = counting_bucket(os.environ["BUCKET"], ".safetensors")
    ckpt = open_checkpoint(os.environ["CKPT"])
    target = sharded_target(architecture.resolve(ckpt).model())
    ckpt.entries(None)  # the headers, read before counting
    asked["bytes"] = 0
    params, figures = measured(lambda: ckpt.restore(None, target))
    want = weight_paths(open_checkpoint(os.environ["WANT"]).restore(None, target))
    for name, x in weight_paths(params).items():
        for a, b in zip(x.addressable_shards, want[name].addressable_shards, strict=True):
            assert a.index == b.index
            np.testing.assert_array_equal(np.asarray(a.data), np.asarray(b.data), name)
    report(asked=asked["bytes"], own=own_bytes(params), **figures)
