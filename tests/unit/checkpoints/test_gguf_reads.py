"""GGUF tensors read region by region: every type the `gguf` package dequantizes gives its values
bit for bit for any region (rows, columns that cut blocks, leading axes), and a process restoring
a model onto 8 devices reads each byte of the file's tensors once, each device's block of a
sharded weight only its own share of the bytes (rows of blocks, or the blocks of its columns in
each row where blocks are no wider than its columns)."""

from __future__ import annotations

import collections
import threading

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q

from ppl_jax.checkpoints import architecture, open_checkpoint
from ppl_jax.checkpoints.formats import gguf_file
from ppl_jax.config.defaults import DEFAULT_RULES
from ppl_jax.models.interface import weight_paths
from ppl_jax.runtime import mesh as mesh_lib

TYPES = [q for q in Q if gguf_file._dequantizes(q)]
SHAPE = (3, 4, 512)  # two super-blocks of 256 per row


def _write(path, tensors: dict[str, tuple[np.ndarray, Q]], arch: str = "llama", **keys) -> None:
    w = gguf.GGUFWriter(str(path), arch)
    for key, value in keys.items():
        getattr(w, f"add_{key}")(value)
    for name, (data, qtype) in tensors.items():
        w.add_tensor(name, data, raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def _random(shape: tuple[int, ...], qtype: Q, rng) -> np.ndarray:
    """Random bytes of a tensor of `qtype` (any bytes are valid blocks; NaNs compare equal)."""
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    if qtype == Q.F32:
        return rng.standard_normal(shape).astype(np.float32)
    if qtype == Q.F16:
        return rng.standard_normal(shape).astype(np.float16)
    return rng.integers(0, 256, (*shape[:-1], shape[-1] // block * size), dtype=np.uint8)


def test_the_types_include_the_k_quants_and_iq_types():
    names = {q.name for q in TYPES}
    assert names >= {"F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K",
                     "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS",
                     "IQ3_S", "IQ1_S", "IQ1_M", "IQ4_NL", "IQ4_XS", "MXFP4"}  # fmt: skip


def test_every_type_reads_any_region_as_the_gguf_package_dequantizes_it(tmp_path):
    rng = np.random.default_rng(0)
    path = tmp_path / "types.gguf"
    _write(path, {q.name: (_random(SHAPE, q, rng), q) for q in TYPES})
    header = gguf_file.read(str(path))
    reader = gguf.GGUFReader(str(path))
    regions = [
        (slice(0, 3), slice(0, 4), slice(0, 512)),  # all
        (slice(1, 3), slice(1, 3), slice(0, 512)),  # whole rows of two leading axes
        (slice(0, 2), slice(2, 4), slice(256, 512)),  # a super-block of each row
        (slice(2, 3), slice(0, 4), slice(37, 300)),  # columns that cut blocks
    ]
    with np.errstate(all="ignore"):  # random bytes make infinities and NaNs, compared by bits
        for t in reader.tensors:
            full = gguf.quants.dequantize(t.data, t.tensor_type)
            for region in regions:
                for dtype, bits in ((np.float32, np.uint32), ("bfloat16", np.uint16)):
                    got = gguf_file.read_region(header, t.name, region, dtype)
                    want = full[region].astype(dtype)
                    assert got.shape == want.shape and got.dtype == want.dtype
                    np.testing.assert_array_equal(got.view(bits), want.view(bits), t.name)


D, HEADS, FF, VOCAB = 256, 8, 256, 256
# q, k, v, gate, up: blocks along 256 columns, devices split the rows; o, down: 32-wide blocks
# (Q8_0), devices split the columns, 32 each; embedding and output: rows split (vocabulary).
PLAN = {"token_embd": Q.Q4_K, "output": Q.Q6_K, "attn_q": Q.Q4_K, "attn_k": Q.Q5_K,
        "attn_v": Q.IQ4_XS, "attn_output": Q.Q8_0, "ffn_gate": Q.Q2_K, "ffn_up": Q.Q3_K,
        "ffn_down": Q.Q8_0}  # fmt: skip


@pytest.fixture(scope="module")
def model_file(tmp_path_factory):
    rng = np.random.default_rng(1)
    shapes = {"token_embd": (VOCAB, D), "output": (VOCAB, D), "attn_q": (D, D),
              "attn_k": (D, D), "attn_v": (D, D), "attn_output": (D, D), "ffn_gate": (FF, D),
              "ffn_up": (FF, D), "ffn_down": (D, FF)}  # fmt: skip
    tensors = {}
    for short, shape in shapes.items():
        name = short + ".weight" if short in ("token_embd", "output") else f"blk.0.{short}.weight"
        tensors[name] = (_random(shape, PLAN[short], rng), PLAN[short])
    for name in ("blk.0.attn_norm.weight", "blk.0.ffn_norm.weight", "output_norm.weight"):
        tensors[name] = (np.ones(D, np.float32), Q.F32)
    path = tmp_path_factory.mktemp("gguf") / "model.gguf"
    _write(path, tensors, block_count=1, context_length=64, embedding_length=D,
           feed_forward_length=FF, head_count=HEADS, head_count_kv=HEADS,
           layer_norm_rms_eps=1e-5, vocab_size=VOCAB)  # fmt: skip
    return path


@pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning")  # random blocks: NaNs
@pytest.mark.filterwarnings("ignore:overflow:RuntimeWarning")
def test_each_byte_is_read_once_and_each_device_reads_its_share(model_file, monkeypatch):
    ckpt = open_checkpoint(str(model_file))
    header = ckpt.header
    model = architecture.resolve(ckpt).model()
    mesh = mesh_lib.make_mesh(1, 8)
    target = mesh_lib.param_targets(model.abstract_params, model.logical_axes, mesh,
                                    DEFAULT_RULES)[0]  # fmt: skip
    calls: list[tuple[str, list[tuple[int, int]]]] = []  # (tensor, the ranges one read asked)
    local = threading.local()
    pread, read_region = gguf_file._pread, gguf_file.read_region

    def counted_pread(path, asked):
        local.ranges.extend(asked)
        return pread(path, asked)

    def counted_region(file, name, index, dtype=np.float32):
        local.ranges = []
        try:
            return read_region(file, name, index, dtype)
        finally:
            calls.append((name, local.ranges))

    monkeypatch.setattr(gguf_file, "_pread", counted_pread)
    monkeypatch.setattr(gguf_file, "read_region", counted_region)
    params = weight_paths(ckpt.restore(None, target))
    # Every byte of every tensor read exactly once, and only from inside the tensor.
    read = collections.Counter()
    for name, asked in calls:
        t = header.tensors[name]
        for at, n in asked:
            assert t.start <= at and at + n <= t.start + t.nbytes, name
            read[name] += n
    assert read == {t.name: t.nbytes for t in header.tensors.values()}
    # Each device's block of a sharded weight: one read of its eighth of the tensor's bytes.
    for weight, name in (("layers/0/attn/q", "blk.0.attn_q.weight"),
                         ("layers/0/mlp/gate", "blk.0.ffn_gate.weight"),
                         ("layers/0/mlp/down", "blk.0.ffn_down.weight"),
                         ("layers/0/attn/o", "blk.0.attn_output.weight"),
                         ("embedding", "token_embd.weight")):  # fmt: skip
        assert "model" in params[weight].sharding.spec, weight
        sizes = [sum(n for _, n in asked) for tensor, asked in calls if tensor == name]
        assert sizes == [header.tensors[name].nbytes // 8] * 8, (weight, sizes)
