"""Restoring a scanned (stacked-layer) MaxText checkpoint on a 2-process mesh reads each weight's
bytes once per process share: every process reads only the chunks of its own shards, also when
one layer is sliced out of a stacked tensor (no full restore of a stacked array on every host).

The checkpoint is written as a pod writes it (each array sharded over 8 devices, so Orbax's chunks
are the shards); the two processes restore it on a `model`=8 mesh (4 devices each) and count the
bytes they read from the files (`rchar` of /proc/self/io) while restoring.
"""

from __future__ import annotations

import os

import jax
import numpy as np
import orbax.checkpoint as ocp

from ppl_jax.checkpoints import architecture, open_checkpoint
from ppl_jax.checkpoints.mapping import apply
from ppl_jax.config.defaults import DEFAULT_RULES
from ppl_jax.models.interface import nest_weights
from ppl_jax.runtime import mesh as mesh_lib

import range_reads

SIZES = ("maxtext:default base_emb_dim=64 base_num_query_heads=8 base_num_kv_heads=8 "
         "base_mlp_dim=512 base_num_decoder_layers=4 head_dim=16 vocab_size=1024 "
         "max_target_length=64")  # fmt: skip

WORKER = """
    from ppl_jax.checkpoints import architecture, open_checkpoint
    from ppl_jax.checkpoints.mapping import apply
    from ppl_jax.config.defaults import DEFAULT_RULES
    from ppl_jax.models.interface import weight_paths
    from ppl_jax.runtime import mesh as mesh_lib

    def rchar():
        with open("/proc/self/io") as f:
            return int(dict(line.split(": ") for line in f.read().splitlines())["rchar"])

    ckpt = open_checkpoint(os.environ["CKPT"], architecture=os.environ["ARCH"])
    model = architecture.resolve(ckpt).model()
    reads = {}
    for data, model_axis in ((8, 1), (1, 8)):  # replicated, then sharded over both processes
        mesh = mesh_lib.make_mesh(data, model_axis)
        target = mesh_lib.param_targets(model.abstract_params, model.logical_axes, mesh,
                                        DEFAULT_RULES)[0]
        apply.sources(ckpt, None, target)  # the tree metadata, read before counting
        before = rchar()
        params = ckpt.restore(None, target)
        jax.block_until_ready(params)
        reads[f"model={model_axis}"] = rchar() - before
    want = np.load(os.environ["WANT"])
    for name, leaf in weight_paths(params).items():
        for shard in leaf.addressable_shards:
            np.testing.assert_array_equal(np.asarray(shard.data),
                                          want[name.replace("/", ".")][shard.index])
    range_reads.report(**reads)
"""


def _write(tmp_path) -> tuple[str, int]:
    """A scanned MaxText checkpoint written shard by shard; returns its folder and data bytes."""
    ckpt_dir = tmp_path / "run" / "checkpoints"
    # Random stored weights, shaped as the preset reads them, sharded as the readers want them.
    probe = tmp_path / "probe"
    tree = {}
    rng = np.random.default_rng(0)
    d, h, hd, f, v, n = 64, 8, 16, 512, 1024, 4
    shapes = {"token_embedder/embedding": (v, d), "decoder/decoder_norm/scale": (d,),
              "decoder/logits_dense/kernel": (d, v)}  # fmt: skip
    layer = {"pre_self_attention_layer_norm/scale": (d, n), "post_self_attention_layer_norm/scale":
             (d, n), "self_attention/query/kernel": (d, n, h, hd), "self_attention/key/kernel":
             (d, n, h, hd), "self_attention/value/kernel": (d, n, h, hd),
             "self_attention/out/kernel": (h, n, hd, d), "mlp/wi_0/kernel": (d, n, f),
             "mlp/wi_1/kernel": (d, n, f), "mlp/wo/kernel": (f, n, d)}  # fmt: skip
    shapes |= {f"decoder/layers/{k}": s for k, s in layer.items()}
    for name, shape in shapes.items():
        tree[name] = rng.standard_normal(shape).astype(np.float32)
    with ocp.CheckpointManager(str(probe)) as m:  # unsharded, only to learn the mapping
        m.save(0, args=ocp.args.Composite(items=ocp.args.StandardSave(
            {"params": {"params": nest_weights(tree)}})))  # fmt: skip
        m.wait_until_finished()
    ckpt = open_checkpoint(str(probe), architecture=SIZES)
    model = architecture.resolve(ckpt).model()
    mesh = mesh_lib.make_mesh(1, 8)
    target = mesh_lib.param_targets(model.abstract_params, model.logical_axes, mesh, DEFAULT_RULES)[
        0
    ]
    from ppl_jax.checkpoints.mapping import blocks, storage
    from ppl_jax.models.interface import weight_paths

    sources = apply.sources(ckpt, 0, target)
    leaves = weight_paths(target)
    stored = {name: (shape, np.float32) for name, shape in shapes.items()}
    names = {k: v for k, v in model.description.items() if isinstance(v, int | float)}
    sharded, want = {}, {}
    for out, src in sources.items():
        sharding = blocks.stored_sharding([(src, leaves[out])], shapes[src.stored], stored, names)
        sharded[src.stored] = jax.device_put(tree[src.stored], sharding)
        whole = tuple(range(n) for n in leaves[out].shape)
        want[out.replace("/", ".")] = blocks.read_block(
            src, stored, leaves[out].shape, whole, storage.Arrays(tree), names, np.float32
        )
    np.savez(tmp_path / "want.npz", **want)
    with ocp.CheckpointManager(str(ckpt_dir)) as m:
        m.save(7, args=ocp.args.Composite(items=ocp.args.StandardSave(
            {"params": {"params": nest_weights(sharded)}, "step": np.int32(7)})))  # fmt: skip
        m.wait_until_finished()
    data = 0
    for root, _, files in os.walk(ckpt_dir / "7" / "items"):
        if os.sep + "d" in root[len(str(ckpt_dir)) :]:
            data += sum(os.path.getsize(os.path.join(root, x)) for x in files)
    return str(tmp_path / "run"), data


def test_two_processes_read_each_weight_once_per_share(tmp_path):
    ckpt, data_bytes = _write(tmp_path)
    env = {"CKPT": ckpt, "ARCH": SIZES, "WANT": str(tmp_path / "want.npz")}
    results = range_reads.run_workers(tmp_path, WORKER, env)
    print(f"stored array data: {data_bytes} bytes; read while restoring, per process: {results}")
    for r in results:
        # Replicated params: every process reads every chunk once (not once per layer).
        assert 0.95 * data_bytes < r["model=1"] < 1.3 * data_bytes, (r, data_bytes)
        # Sharded over both processes: each reads about half (its 4 of 8 shards).
        assert r["model=8"] < 0.7 * data_bytes, (r, data_bytes)
