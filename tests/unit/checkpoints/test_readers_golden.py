"""Checkpoints of the readers issue 25 added, written by their own libraries
(tests/golden/readers/, from tests/golden/make_readers_golden.py): an Orbax v1 run and a bare
Orbax v1 checkpoint (`ocp.v1`), and a sharded bfloat16 safetensors directory (transformers), read
locally and from a bucket by byte ranges. ppl_jax's float32 logits equal the writer's own within
1e-5 of the largest logit; a sweep over the v1 run's steps equals single runs exactly."""

from __future__ import annotations

import dataclasses
import os
import shutil
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ppl_jax.checkpoints import architecture, open_checkpoint
from ppl_jax.checkpoints.readers.huggingface import HFDirectory
from ppl_jax.checkpoints.readers.orbax_v1 import OrbaxV1
from ppl_jax.config.defaults import DEFAULT_RULES
from ppl_jax.models.interface import weight_paths
from ppl_jax.runtime import mesh as mesh_lib

import helpers

READERS = os.path.join(helpers.GOLDEN, "readers")
RUN = os.path.join(READERS, "orbax_v1_run", "checkpoints")
BARE = os.path.join(READERS, "orbax_v1_bare")
SHARDED = os.path.join(READERS, "sharded_qwen3")
ENTRY = "trainer_models:linen_model"
RTOL = 1e-5  # |ppl_jax - library| <= RTOL * max |library logits|


@pytest.fixture(autouse=True)
def _highest_precision(monkeypatch):
    monkeypatch.syspath_prepend(helpers.GOLDEN)  # trainer_models, the writer's own model
    sys.modules.pop("trainer_models", None)
    with jax.default_matmul_precision("highest"):
        yield


def _logits(model, params, tokens):
    positions = np.broadcast_to(np.arange(tokens.shape[1], dtype=np.int32), tokens.shape)
    out = model.apply(params, jnp.asarray(tokens), jnp.asarray(positions), jnp.ones_like(tokens))
    if hasattr(out, "logits"):
        return np.asarray(out.logits, np.float32)
    hidden = out.hidden.astype(jnp.float32)
    return np.asarray(jnp.einsum("btd,dv->btv", hidden, out.unembedding.astype(jnp.float32)))


def _targets(model, data=-1, model_axis=2):
    mesh = mesh_lib.make_mesh(data, model_axis)
    return mesh_lib.param_targets(model.abstract_params, model.logical_axes, mesh, DEFAULT_RULES)[0]


def _close(got, want) -> float:
    diff = float(np.abs(got - want).max()) / float(np.abs(want).max())
    assert diff <= RTOL, diff
    return diff


def test_orbax_v1_run_logits_equal_the_writers():
    ckpt = open_checkpoint(RUN, architecture=ENTRY)
    assert isinstance(ckpt, OrbaxV1) and "Orbax v1 API" in ckpt.why
    assert ckpt.steps() == [1, 2] and ckpt.resolve_step(None) == 2
    assert ckpt.item(2) == "state" and "embed/embedding" in ckpt.stored(2)
    golden = np.load(os.path.join(os.path.dirname(RUN), "logits.npz"))
    model = architecture.resolve(ckpt).model()
    worst = max(
        _close(_logits(model, ckpt.restore(step, _targets(model)), golden["tokens"]),
               golden[f"step_{step}"])
        for step in (1, 2)
    )  # fmt: skip
    print(f"orbax_v1_run: max |logit difference| / max |logit| = {worst:.2e}")
    # The two steps differ: each was read.
    assert not np.array_equal(golden["step_1"], golden["step_2"])


def test_orbax_v1_bare_checkpoint_logits_equal_the_writers():
    ckpt = open_checkpoint(BARE, architecture=ENTRY)
    assert isinstance(ckpt, OrbaxV1) and "orbax.checkpoint" in ckpt.why
    assert ckpt.steps() == [] and ckpt.resolve_step(None) is None
    golden = np.load(os.path.join(READERS, "orbax_v1_bare_logits.npz"))
    model = architecture.resolve(ckpt).model()
    _close(_logits(model, ckpt.restore(None, _targets(model)), golden["tokens"]), golden["bare"])
    lines = ckpt.layout_lines(None)
    assert lines[0].startswith("checkpoint: checkpointables state (PyTreeHandler)"), lines


def test_sharded_safetensors_logits_equal_the_writers():
    ckpt = open_checkpoint(SHARDED)
    assert isinstance(ckpt, HFDirectory) and ckpt.steps() == []
    golden = np.load(os.path.join(SHARDED, "logits.npz"))
    model = architecture.resolve(ckpt).model()
    diff = _close(_logits(model, ckpt.restore(None, _targets(model)), golden["tokens"]),
                  golden["bare"])  # fmt: skip
    print(f"sharded_qwen3: max |logit difference| / max |logit| = {diff:.2e}")
    assert len({e.file for e in ckpt.entries(None).values()}) == 6


class _Counting:
    """Bytes asked of the fake bucket, per file (every `cat_file`/`cat_ranges`/`open` read)."""

    asked: dict[str, int] = {}


@pytest.fixture
def bucket(tmp_path, monkeypatch):
    """A fake `gs://` over `tmp_path/'gcs'` (fsspec's DirFileSystem as fsspec's `gs`, reached
    through etils.epath and `paths.filesystem`), counting the bytes each read asks for."""
    from etils.epath import backend as epath_backend
    from fsspec.implementations.dirfs import DirFileSystem
    from fsspec.implementations.local import LocalFileSystem
    from fsspec.registry import _registry as fsspec_registry

    root = tmp_path / "gcs"
    root.mkdir()
    _Counting.asked = {}

    class CountingGCS(DirFileSystem):
        protocol = ("gs", "gcs")
        cachable = False

        def __init__(self, *args, **kwargs):
            super().__init__(path=str(root), fs=LocalFileSystem())

        def cat_file(self, path, start=None, end=None, **kwargs):
            data = super().cat_file(path, start=start, end=end, **kwargs)
            _Counting.asked[path] = _Counting.asked.get(path, 0) + len(data)
            return data

        def cat_ranges(self, paths, starts, ends, **kwargs):
            return [self.cat_file(p, s, e) for p, s, e in zip(paths, starts, ends, strict=True)]

    for name in ("gs", "gcs"):
        monkeypatch.setitem(fsspec_registry, name, CountingGCS)
    epath_backend.fsspec_backend._get_filesystem.cache_clear()
    yield root
    epath_backend.fsspec_backend._get_filesystem.cache_clear()


def test_sharded_safetensors_from_a_bucket_by_byte_ranges(bucket):
    shutil.copytree(SHARDED, bucket / "models" / "qwen3")
    remote = open_checkpoint("gs://models/qwen3")
    local = open_checkpoint(SHARDED)
    assert isinstance(remote, HFDirectory) and remote.description() == local.description()
    model = architecture.resolve(local).model()
    target = _targets(model)
    got, want = (
        weight_paths(remote.restore(None, target)),
        weight_paths(local.restore(None, target)),
    )
    for name, x in want.items():  # bit for bit, in the same shardings
        assert got[name].sharding == x.sharding, name
        np.testing.assert_array_equal(np.asarray(got[name]), np.asarray(x), err_msg=name)
    entries = local.entries(None).values()
    data = sum(e.end - e.begin for e in entries)
    headers = sum(min(e.begin for e in entries if e.file == f) for f in {e.file for e in entries})
    read = sum(n for path, n in _Counting.asked.items() if path.endswith(".safetensors"))
    # One process holds every device: each stored byte is asked for once, none twice (and each
    # header once).
    assert read == data + headers, (read, data, headers)
    # The stored tree by its own names, straight into shardings (the reader's `read`).
    name = "model.layers.0.mlp.down_proj.weight"
    shape, dtype = remote.stored(None)[name]
    sharding = jax.sharding.NamedSharding(
        mesh_lib.make_mesh(4, 2), jax.sharding.PartitionSpec(None, "model")
    )
    (array,) = remote.read(
        None, {name: jax.ShapeDtypeStruct(shape, dtype, sharding=sharding)}
    ).values()
    from safetensors import safe_open

    entry = local.entries(None)[name]
    with safe_open(os.path.join(SHARDED, entry.file), "np") as f:
        np.testing.assert_array_equal(np.asarray(array), f.get_tensor(name))


def test_a_sweep_over_the_v1_run_equals_single_runs(tmp_path):
    from ppl_jax.config import defaults, settings
    from ppl_jax.evaluation import run as run_lib
    from ppl_jax.outputs.folder import OutputDir

    # The model's vocabulary is 64 ids: text of the bytes 32-63 (digits, punctuation, space).
    (tmp_path / "val.txt").write_text("".join(chr(32 + (i * 7 + i // 5) % 32) for i in range(600)))

    def spec(step, out):
        c = defaults.get_config()
        c.checkpoint.dir = RUN
        c.checkpoint.architecture = ENTRY
        c.checkpoint.step = step
        c.data.path = str(tmp_path / "val.txt")
        c.data.tokenizer = "byte"
        c.data.allow_tokenizer_mismatch = True
        c.eval.seq_len = 16
        c.output.dir = str(tmp_path / out)
        return settings.from_config(c)

    sweep_spec = spec("all", "sweep")
    out = OutputDir.open(sweep_spec.output_dir)
    try:
        swept = run_lib.run(sweep_spec, out, printer=lambda line: None).evaluations
    finally:
        out.close()
    assert [e.step for e in swept] == [1, 2]
    for e in swept:
        single = run_lib.evaluate(spec(str(e.step), f"one{e.step}"))
        assert dataclasses.astuple(single.sums) == dataclasses.astuple(e.sums)
    assert swept[0].sums.nll_sum != swept[1].sums.nll_sum
