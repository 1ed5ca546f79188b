"""A quantized GGUF file restored on two processes: each process reads about half of the file's
tensor bytes (the byte ranges of its own devices' blocks), dequantizes them into float32 params
equal to the `gguf` package's dequantization, and its host memory grows by at most 1.2x its own
shard of the params plus the constant of tests/multiprocess/test_ranged_reads.py while reading
(a quantized file never passes through a full-precision copy on one host).

The file is a Llama of 42 M parameters in Q8_0 and Q4_K (random valid blocks, 36 MB), placed on a
`model`=8 mesh, 4 devices per process: every weight but the norms is split between the two
processes. Host memory is the process's resident set, sampled every 2 ms while reading.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import textwrap

import gguf
import numpy as np
from gguf import GGMLQuantizationType as Q

import helpers

D, LAYERS, HEADS, MLP, VOCAB = 512, 8, 8, 2048, 8192
CONSTANT = 64 << 20  # as tests/multiprocess/test_ranged_reads.py

WORKER = textwrap.dedent(
    """
    import json, os, sys, threading, time
    from absl import app

    def rss():
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    def main(argv):
        from ppl_jax.runtime import distributed
        assert distributed.initialize_from_env()
        import gguf, jax, numpy as np
        from ppl_jax.checkpoints import gguf_file, open_checkpoint
        from ppl_jax.config.defaults import DEFAULT_RULES
        from ppl_jax.models.interface import weight_paths
        from ppl_jax.runtime import mesh as mesh_lib
        asked = {"bytes": 0}
        pread = gguf_file._pread

        def counted(path, ranges):
            asked["bytes"] += sum(n for _, n in ranges)
            return pread(path, ranges)

        gguf_file._pread = counted
        ckpt = open_checkpoint(os.environ["FILE"])
        model = ckpt.model()
        mesh = mesh_lib.make_mesh(1, 8)
        target = mesh_lib.param_targets(model.abstract_params, model.logical_axes, mesh,
                                        DEFAULT_RULES)[0]
        ckpt.header  # the header, read before counting
        asked["bytes"] = 0
        before, peak, done = rss(), [0], threading.Event()

        def sample():
            while not done.is_set():
                peak[0] = max(peak[0], rss())
                time.sleep(0.002)

        sampler = threading.Thread(target=sample)
        sampler.start()
        t0 = time.perf_counter()
        params = weight_paths(jax.block_until_ready(ckpt.restore(None, target)))
        seconds = time.perf_counter() - t0
        done.set()
        sampler.join()
        peak[0] = max(peak[0], rss())
        own = sum(s.data.nbytes for x in params.values() for s in x.addressable_shards)
        reader = gguf.GGUFReader(os.environ["FILE"])
        tensors = {t.name: t for t in reader.tensors}
        t = tensors["blk.3.ffn_down.weight"]  # [D, MLP]: the params' down is [MLP, D]
        want = gguf.quants.dequantize(t.data, t.tensor_type).T
        for s in params["layers/3/mlp/down"].addressable_shards:
            np.testing.assert_array_equal(np.asarray(s.data), want[s.index])
        print("RESULT " + json.dumps({"process": jax.process_index(), "asked": asked["bytes"],
              "own": own, "grew": peak[0] - before, "seconds": seconds}), flush=True)

    app.run(main)
    """
)


def _blocks(shape: tuple[int, int], qtype: Q, rng) -> np.ndarray:
    """Random valid blocks (random quants, float16 scales of 1e-3)."""
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    n = shape[0] * shape[1] // block
    raw = rng.integers(0, 256, (n, size), dtype=np.uint8)
    scale = np.full((n, 1), 1e-3, np.float16).view(np.uint8)
    for at in {Q.Q8_0: (0,), Q.Q4_K: (0, 2)}[qtype]:
        raw[:, at : at + 2] = scale
    return raw.reshape(shape[0], -1)


def _write(path) -> int:
    """The file; returns the bytes of its tensors."""
    rng = np.random.default_rng(0)
    w = gguf.GGUFWriter(str(path), "llama")
    for key, value in dict(block_count=LAYERS, context_length=128, embedding_length=D,
                           feed_forward_length=MLP, head_count=HEADS, head_count_kv=HEADS,
                           layer_norm_rms_eps=1e-5, vocab_size=VOCAB).items():  # fmt: skip
        getattr(w, f"add_{key}")(value)
    total = 0

    def add(name, shape, qtype):
        nonlocal total
        data = np.ones(shape, np.float32) if qtype == Q.F32 else _blocks(shape, qtype, rng)
        w.add_tensor(name, data, raw_dtype=qtype)
        total += data.nbytes

    add("token_embd.weight", (VOCAB, D), Q.Q8_0)
    add("output.weight", (VOCAB, D), Q.Q4_K)
    add("output_norm.weight", (D,), Q.F32)
    for i in range(LAYERS):
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
    return total


def test_two_processes_each_read_their_half_within_bounded_memory(tmp_path):
    stored = _write(tmp_path / "model.gguf")
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for i in range(2):
        env = {**helpers.process_env(i, 2, port), "FILE": str(tmp_path / "model.gguf")}
        procs.append(subprocess.Popen([sys.executable, str(script)], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))  # fmt: skip
    results = []
    for p in procs:
        out, err = p.communicate(timeout=540)
        assert p.returncode == 0, err[-3000:]
        results += [json.loads(x[7:]) for x in out.splitlines() if x.startswith("RESULT ")]
    mib = 1 << 20
    for r in results:
        print(
            f"process {r['process']}: read {r['asked'] / mib:.1f} MiB of {stored / mib:.1f} MiB "
            f"({r['asked'] / stored:.3f}); own shard {r['own'] / mib:.1f} MiB (float32); resident "
            f"set grew {r['grew'] / mib:.1f} MiB ({r['grew'] / r['own']:.2f}x own) in "
            f"{r['seconds']:.1f} s"
        )
    assert len(results) == 2
    for r in results:
        assert 0.49 * stored < r["asked"] < 0.51 * stored, (r, stored)
        assert r["grew"] <= 1.2 * r["own"] + CONSTANT, r
