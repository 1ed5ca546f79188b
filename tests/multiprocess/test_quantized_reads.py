"""A GPTQ-quantized Hugging Face checkpoint on a bucket, read by byte ranges on two processes:
each process asks the bucket for about half of the quantized bytes (its devices' columns or rows
of `qweight`, `scales` and `qzeros`), dequantizes only its own shard, gets exactly the weights of
a float32 checkpoint holding the dequantized values (computed here in NumPy from the codes, not
by ppl_jax), and its host memory grows by at most 1.2x its own shard plus 64 MiB while reading
(the bound of the float reader, tests/multiprocess/test_ranged_reads.py).

The model is a Llama of 42 M parameters (34 M of them in 4-bit GPTQ, groups of 128,
`checkpoint_format` gptq_v2, 17 MB packed) on a `model`=8 mesh, 4 devices per process, restored
in float32: the projections and the embedding are split between the two processes.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import textwrap

import numpy as np
from safetensors.numpy import save_file

import helpers

D, LAYERS, HEADS, MLP, VOCAB, GROUP = 512, 8, 8, 2048, 8192, 128
CONSTANT = 64 << 20  # as tests/multiprocess/test_ranged_reads.py (measured here: 1.41x own)

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
        import jax, numpy as np
        from etils.epath import backend as epath_backend
        from fsspec.implementations.dirfs import DirFileSystem
        from fsspec.implementations.local import LocalFileSystem
        from fsspec.registry import _registry
        asked = {"bytes": 0}

        class CountingGCS(DirFileSystem):
            protocol = ("gs", "gcs")
            cachable = False

            def __init__(self, *args, **kwargs):
                super().__init__(path=os.environ["BUCKET"], fs=LocalFileSystem())

            def cat_file(self, path, start=None, end=None, **kwargs):
                data = super().cat_file(path, start=start, end=end, **kwargs)
                if path.endswith(".safetensors"):
                    asked["bytes"] += len(data)
                return data

            def cat_ranges(self, paths, starts, ends, **kwargs):
                return [self.cat_file(p, s, e) for p, s, e in zip(paths, starts, ends)]

        _registry["gs"] = _registry["gcs"] = CountingGCS
        epath_backend.fsspec_backend._get_filesystem.cache_clear()
        from ppl_jax.checkpoints import open_checkpoint
        from ppl_jax.config.defaults import DEFAULT_RULES
        from ppl_jax.models.interface import weight_paths
        from ppl_jax.runtime import mesh as mesh_lib
        ckpt = open_checkpoint("gs://models/gptq")
        model = ckpt.model()
        mesh = mesh_lib.make_mesh(1, 8)
        target = mesh_lib.param_targets(model.abstract_params, model.logical_axes, mesh,
                                        DEFAULT_RULES)[0]
        ckpt.entries(None)  # the headers, read before counting
        asked["bytes"] = 0
        before, peak, done = rss(), [0], threading.Event()

        def sample():
            while not done.is_set():
                peak[0] = max(peak[0], rss())
                time.sleep(0.002)

        sampler = threading.Thread(target=sample)
        sampler.start()
        t0 = time.perf_counter()
        params = jax.block_until_ready(ckpt.restore(None, target))
        seconds = time.perf_counter() - t0
        done.set()
        sampler.join()
        peak[0] = max(peak[0], rss())
        own = sum(s.data.nbytes for x in weight_paths(params).values() for s in x.addressable_shards)
        want = weight_paths(open_checkpoint(os.environ["FLOAT"]).restore(None, target))
        for name, x in weight_paths(params).items():
            for a, b in zip(x.addressable_shards, want[name].addressable_shards):
                assert a.index == b.index
                np.testing.assert_array_equal(np.asarray(a.data), np.asarray(b.data), name)
        print("RESULT " + json.dumps({"process": jax.process_index(), "asked": asked["bytes"],
              "own": own, "grew": peak[0] - before, "seconds": seconds}), flush=True)

    app.run(main)
    """
)


def _gptq(rng, out_f: int, in_f: int) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """A GPTQ (v2) linear written by the format's formula: 4-bit codes packed 8 to a word along
    the input axis (code k of a word at bits 4k), zero points 8 to a word along the output
    axis, float16 scales per group of 128 rows; and its dequantized weight `[out, in]` float32
    (`scales[g] * (codes - zeros[g])` in float16, as gptqmodel's kernel computes it)."""
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
    return parts, np.ascontiguousarray(weight.T)


def _write(bucket, floats) -> int:
    """The GPTQ directory (one shard per layer) under `bucket`, and its dequantized float32 copy
    under `floats`; returns the quantized bytes."""
    rng = np.random.default_rng(0)
    config = {
        "model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": VOCAB,
        "hidden_size": D, "intermediate_size": MLP, "num_hidden_layers": LAYERS,
        "num_attention_heads": HEADS, "num_key_value_heads": HEADS,
        "max_position_embeddings": 128, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
        "tie_word_embeddings": False, "hidden_act": "silu",
    }  # fmt: skip
    quantization = {"quant_method": "gptq", "bits": 4, "group_size": GROUP, "desc_act": False,
                    "sym": False, "checkpoint_format": "gptq_v2"}  # fmt: skip
    total = 0
    for folder, quantized in ((bucket, True), (floats, False)):
        folder.mkdir(parents=True)
        (folder / "config.json").write_text(
            json.dumps({**config, **({"quantization_config": quantization} if quantized else {})})
        )
    maps: dict = {bucket: {}, floats: {}}

    def shard(name, plain, linears):
        nonlocal total
        q, f = dict(plain), dict(plain)
        for head, (out_f, in_f) in linears.items():
            parts, weight = _gptq(rng, out_f, in_f)
            q.update({f"{head}.{k}": v for k, v in parts.items()})
            f[f"{head}.weight"] = weight
        for folder, tensors in ((bucket, q), (floats, f)):
            save_file(tensors, str(folder / name))
            maps[folder].update(dict.fromkeys(tensors, name))
        total += sum(t.nbytes for t in q.values())

    def w(*shape):
        return (0.02 * rng.standard_normal(shape)).astype(np.float32)

    shard("tables.safetensors", {"model.embed_tokens.weight": w(VOCAB, D),
          "lm_head.weight": w(VOCAB, D), "model.norm.weight": 1 + w(D)}, {})  # fmt: skip
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        plain = {
            p + "input_layernorm.weight": 1 + w(D),
            p + "post_attention_layernorm.weight": 1 + w(D),
        }
        linears = {**{f"{p}self_attn.{n}_proj": (D, D) for n in "qkvo"},
                   p + "mlp.gate_proj": (MLP, D), p + "mlp.up_proj": (MLP, D),
                   p + "mlp.down_proj": (D, MLP)}  # fmt: skip
        shard(f"layer{i}.safetensors", plain, linears)
    for folder in (bucket, floats):
        index = {"metadata": {}, "weight_map": maps[folder]}
        (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    return total


def test_two_processes_each_dequantize_their_half_within_bounded_memory(tmp_path):
    bucket = tmp_path / "gcs"
    stored = _write(bucket / "models" / "gptq", tmp_path / "float")
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for i in range(2):
        env = {**helpers.process_env(i, 2, port), "BUCKET": str(bucket),
               "FLOAT": str(tmp_path / "float")}  # fmt: skip
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
            f"process {r['process']}: asked {r['asked'] / mib:.1f} MiB of {stored / mib:.1f} MiB "
            f"({r['asked'] / stored:.3f}); own shard {r['own'] / mib:.1f} MiB (float32); "
            f"resident set grew {r['grew'] / mib:.1f} MiB ({r['grew'] / r['own']:.2f}x own) in "
            f"{r['seconds']:.1f} s"
        )
    assert len(results) == 2
    for r in results:
        # Its half of every split weight, the replicated norms and each g_idx whole.
        assert 0.49 * stored < r["asked"] < 0.53 * stored, (r, stored)
        assert r["grew"] <= 1.2 * r["own"] + CONSTANT, r
