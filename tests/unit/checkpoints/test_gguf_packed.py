"""A GGUF model's quantized weights kept packed on the device (`checkpoint.dequantize`): the
blocks placed as stored, sharded as the float weights, dequantized inside the layers, equal bit
for bit to the host's dequantization (`ppl_jax.models.layers.packed`,
`ppl_jax.checkpoints.architecture.packed`)."""

from __future__ import annotations

import json

import gguf
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ppl_jax import testing
from ppl_jax.checkpoints import architecture, open_checkpoint
from ppl_jax.checkpoints.mapping import operations
from ppl_jax.checkpoints.mapping.language import Source
from ppl_jax.config.defaults import get_config
from ppl_jax.config.settings import from_config
from ppl_jax.errors import CheckpointError, ConfigError
from ppl_jax.evaluation.run import evaluate
from ppl_jax.models.interface import weight_paths
from ppl_jax.models.layers import packed
from ppl_jax.outputs.folder import OutputDir
from ppl_jax.runtime import mesh as mesh_lib

from helpers import bits, host_and_packed_runs, restored_packed


@pytest.fixture(scope="module")
def gguf_path(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("packed") / "model.gguf")
    testing.write_gguf_llama(path, layers=2)
    return path


@pytest.mark.parametrize("shape", [pytest.param((8, 1), marks=pytest.mark.slow), (1, 8)])
def test_every_packed_weight_dequantizes_on_the_device_as_on_the_host(gguf_path, shape):
    mesh = mesh_lib.make_mesh(*shape)
    _, host, none = restored_packed(gguf_path, mesh, "host")
    model, device, found = restored_packed(gguf_path, mesh, "auto")
    assert not none.device and found.device and set(found.device.values()) <= {
        "Q8_0", "Q4_K"
    }  # fmt: skip
    flat_host, flat_device = weight_paths(host), weight_paths(device)
    assert flat_host.keys() == flat_device.keys()
    for name, weight in flat_device.items():
        if name in found.device:
            assert packed.is_packed(weight) and weight.data.dtype == jnp.uint8, name
            # Sharded as the float weight is, the bytes axis whole.
            want = flat_host[name].sharding.spec
            got = weight.data.sharding.spec
            assert tuple(got)[: len(want)] == tuple(want) or weight.data.ndim == 0, name
        np.testing.assert_array_equal(bits(weight), bits(flat_host[name]), err_msg=name)
    # The packed params hold the file's bytes of those weights, not their float copies.
    assert packed.packed_bytes(model.abstract_params) == found.packed_bytes
    on_device = sum(int(np.prod(flat_host[n].shape)) * 4 for n in found.device)  # float32 copies
    assert found.packed_bytes < on_device / 3


@pytest.mark.parametrize("dtype", ["float32", pytest.param("bfloat16", marks=pytest.mark.slow)])
def test_the_packed_model_scores_as_the_dequantized_one(gguf_path, dtype):
    mesh = mesh_lib.make_mesh(8, 1)
    host_model, host, _ = restored_packed(gguf_path, mesh, "host", dtype)
    model, device, found = restored_packed(gguf_path, mesh, "auto", dtype)
    assert found.device
    tokens = jnp.asarray(np.random.default_rng(0).integers(0, 8192, (2, 32)), jnp.int32)
    positions = jnp.broadcast_to(jnp.arange(32, dtype=jnp.int32), (2, 32))
    segments = jnp.ones((2, 32), jnp.int32)
    want = jax.jit(host_model.apply)(host, tokens, positions, segments)
    got = jax.jit(model.apply)(device, tokens, positions, segments)
    np.testing.assert_array_equal(bits(got.hidden), bits(want.hidden))
    np.testing.assert_array_equal(bits(got.unembedding), bits(want.unembedding))


def test_the_layers_scan_over_packed_weights_one_layer_at_a_time(gguf_path):
    """Two identical layers run as one scan whose step switches over the stored layers' blocks:
    the compiled step's temporaries hold about one layer's float weights, not the model's."""
    mesh = mesh_lib.make_mesh(8, 1)
    model, device, found = restored_packed(gguf_path, mesh, "auto")
    tokens = jnp.zeros((1, 16), jnp.int32)
    seg = jnp.ones((1, 16), jnp.int32)
    compiled = jax.jit(model.apply).lower(device, tokens, tokens, seg).compile()
    stats = compiled.memory_analysis()
    flat = weight_paths(device)
    layer_floats = sum(
        int(np.prod(w.shape)) * 4 for n, w in flat.items() if n.startswith("layers/0/")
    )
    args = stats.argument_size_in_bytes
    assert args < sum(int(np.prod(w.shape)) * 4 for w in flat.values()) / 3
    # One layer's float weights, the embedding rows taken and the float32 head at most.
    head = 8192 * 512 * 4
    assert stats.temp_size_in_bytes < 1.5 * layer_floats + 2 * head


def test_a_setting_other_than_auto_device_or_host_is_refused(gguf_path):
    ckpt = open_checkpoint(gguf_path)
    model = architecture.resolve(ckpt).model()
    with pytest.raises(CheckpointError, match="checkpoint.dequantize='gpu' is not one of"):
        architecture.packed(ckpt, None, model, "gpu")


def test_device_refuses_a_checkpoint_of_which_nothing_can_be_packed(gguf_path, monkeypatch):
    ckpt = open_checkpoint(gguf_path)
    model = architecture.resolve(ckpt).model()
    monkeypatch.setattr(type(ckpt), "device_layouts", lambda self, step, flat: ({}, {"w": "IQ2"}))
    with pytest.raises(CheckpointError, match="set checkpoint.dequantize=host"):
        architecture.packed(ckpt, None, model, "device")
    same, dequantization = architecture.packed(ckpt, None, model, "auto")
    assert same is model and dequantization.note().startswith("1 quantized weight(s)")


def _steps(plan):
    return [(s.kind, s.before, s.after) for s in plan.steps]


@pytest.mark.parametrize(
    "rule, stored, moved",
    [
        ({"transpose": [1, 0], "reshape": [64, 2, 32]}, (64, 64), 0),  # q: [d, heads, head_dim]
        ({"transpose": [1, 0], "reshape": [2, 32, 64]}, (64, 64), 1),  # o: [heads, head_dim, d]
        ({"transpose": [1, 0], "rope": {"axis": 1}}, (64, 64), 0),  # q/k rows unpermuted
        ({"split": {"axis": 0}, "to": ["a", "b"]}, (64, 64), 1),  # a fused projection's rows
        ({"transpose": [1, 0], "reshape": [4, 16, 64]}, (64, 64), (0, 2)),  # o: heads of 16
        ({"transpose": [1, 0], "reshape": [2, 8, 4, 64]}, (64, 64), (1, 2)),  # blocks of 8 x 4
        ({"transpose": [1, 0], "reshape": [4, 16, 64], "rope": {"axis": 2}}, (64, 64), None),
        ({"rope": {"axis": 1}}, (64, 64), None),  # reorders values inside blocks
    ],
)
def test_a_block_plan_moves_whole_blocks_as_the_float_plan_moves_values(rule, stored, moved):
    rule = {"from": "w", **rule}
    src = Source("w", None, 0 if "split" in rule else None, rule, 1.0)
    plan = operations.plan(src, stored, (), {})
    got = operations.block_plan(plan, 32)
    if moved is None:
        assert got is None
        return
    block_plan, axis, span = got
    assert (axis, span) == (moved if isinstance(moved, tuple) else (moved, 1))
    values = np.arange(np.prod(stored), dtype=np.float64).reshape(stored)
    want = plan.apply(values, (0,) * len(stored), tuple(range(n) for n in plan.shape))
    blocks = values.reshape(*stored[:-1], stored[-1] // 32, 32)  # a block: 32 values
    rows = np.empty(blocks.shape[:-1], dtype=object)
    for index in np.ndindex(rows.shape):
        rows[index] = blocks[index]
    moved_blocks = block_plan.apply(
        rows, (0,) * rows.ndim, tuple(range(n) for n in block_plan.shape)
    )
    expanded = np.stack([np.stack(list(r)) for r in moved_blocks.reshape(-1)]).reshape(
        *moved_blocks.shape, 32
    )
    np.testing.assert_array_equal(np.moveaxis(expanded, -1, axis + 1).reshape(want.shape), want)
    layout = packed.Layout(None, "T", axis, 32, 1, tuple(want.shape), "float64", span)
    assert layout.packed_shape == (*block_plan.shape, 1)


def test_a_run_records_the_packed_weights_and_fingerprints_them(gguf_path, tmp_path):
    runs = host_and_packed_runs(tmp_path, gguf_path)
    host, auto = runs["host"], runs["auto"]
    assert "packed_on_device" not in host["model"]
    assert auto["model"]["packed_on_device"]["weights"] > 0
    assert auto["nll_sum"] == host["nll_sum"]
    assert auto["fingerprint"] != host["fingerprint"]
    packed_count = auto["model"]["packed_on_device"]["weights"]
    assert auto["quantization"]["dequantized"] == {
        "setting": "auto", "on_device": packed_count, "on_host": 0, "host_reasons": {}
    }  # fmt: skip
    found = host["quantization"]["dequantized"]
    assert (found["on_device"], found["on_host"]) == (0, packed_count)


@pytest.mark.slow  # 30-40 s: four models compiled (the study's parts: test_study.py)
def test_a_study_scores_packed_copies_against_their_original_in_one_pass(tmp_path):
    """An original GGUF in float32 and its Q8_0 and Q4_0 copies (`gguf.quants.quantize`): the
    copies stay packed on the device, each copy's KL and NLL are those of a run with the
    original as its reference model, and the table gives each one's size and bits per weight."""
    original = str(tmp_path / "f32.gguf")
    testing.write_gguf_llama(original, layers=2, float32=True)
    copies = {}
    for kind in ("Q8_0", "Q4_0"):
        copies[kind] = str(tmp_path / f"{kind}.gguf")
        testing.requantize_gguf(original, copies[kind], kind)
    corpus = tmp_path / "c.txt"
    corpus.write_text("t1 t2 t3 t1t2 t3t4 " * 40)

    def run(name, **keys):
        c = get_config()
        c.data.path, c.data.tokenizer, c.data.allow_tokenizer_mismatch = str(corpus), "byte", True
        c.eval.seq_len = 32
        c.output.dir, c.output.progress = str(tmp_path / name), False
        for key, value in keys.items():
            node, *path = key.split(".")
            target = c[node]
            for part in path[:-1]:
                target = target[part]
            target[path[-1]] = value
        spec = from_config(c)
        with OutputDir.open(spec.output_dir) as out:
            evaluate(spec, out=out)
        return json.loads((tmp_path / name / "results.json").read_text())

    listed = ",".join(f"{k}={v}" for k, v in copies.items())
    found = run("study", **{"checkpoint.dir": original, "study.copies": listed})["study"]
    assert found["original"]["bits_per_weight"] == pytest.approx(32, rel=0.01)
    q8, q4 = found["copies"]["Q8_0"], found["copies"]["Q4_0"]
    for kind, got in (("Q8_0", q8), ("Q4_0", q4)):  # the file's tensor bytes, as gguf reads them
        stored = sum(int(t.n_bytes) for t in gguf.GGUFReader(copies[kind]).tensors)
        assert got["size_bytes"] == stored
    assert 32 > q8["bits_per_weight"] > q4["bits_per_weight"]
    assert 0 < q8["kl_mean"] < q4["kl_mean"]
    alone = run("q4", **{"checkpoint.dir": copies["Q4_0"], "reference.checkpoint.dir": original})
    assert alone["model"]["packed_on_device"]["types"] == {"Q4_0": 15}  # 7 a layer and the head
    assert q4["nll_sum"] == pytest.approx(alone["nll_sum"], rel=1e-6)
    assert q4["kl_mean"] == pytest.approx(alone["divergence"]["kl_mean"], rel=1e-6)


def test_a_setting_of_the_command_line_other_than_the_three_is_one_sentence():
    c = get_config()
    c.checkpoint.dequantize = "gpu"
    with pytest.raises(ConfigError, match=r"checkpoint.dequantize='gpu' is not one of auto, dev"):
        from_config(c)
