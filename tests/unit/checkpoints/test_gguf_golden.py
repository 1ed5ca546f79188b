"""GGUF files against transformers' own reading of them (tests/golden/gguf/, written by
tests/golden/make_gguf_golden.py in a side environment): each file opens by its path alone, its
tensors dequantize to the `gguf` package's values bit for bit, its tokenizer gives transformers'
ids on held-out text with transformers' BOS policy, and its model gives transformers' float32
log-probabilities of the next tokens (per token within 1e-5 relative, the sum within 1e-6).

The default tier scores the Llama file of K-quants and IQ types and Qwen3; the other
architectures (Llama with biases and a byte-level vocabulary, GPT-2, Qwen3-MoE, Gemma 2 and 3,
Phi-3, OLMo 2, GPT-OSS with MXFP4 experts) are scored in the slow tier.
"""

from __future__ import annotations

import functools
import json
import os

import gguf
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ppl_jax.checkpoints import architecture, open_checkpoint
from ppl_jax.checkpoints.formats import gguf_file
from ppl_jax.checkpoints.readers.gguf import GGUFCheckpoint
from ppl_jax.config.defaults import DEFAULT_RULES
from ppl_jax.models import registry
from ppl_jax.runtime import mesh as mesh_lib
from ppl_jax.scoring.nll import token_nll

import helpers

GGUF_DIR = os.path.join(helpers.GOLDEN, "gguf")
CASES = sorted(n[:-5] for n in os.listdir(GGUF_DIR) if n.endswith(".gguf"))
FAST = ("llama_kquants", "qwen3")


@functools.cache
def golden(name: str) -> dict:
    with open(os.path.join(GGUF_DIR, f"{name}.json"), encoding="utf-8") as f:
        return json.load(f)


def path(name: str) -> str:
    return os.path.join(GGUF_DIR, f"{name}.gguf")


def test_every_architecture_has_a_golden_file():
    assert {golden(n)["architecture"] for n in CASES} >= {
        "llama", "qwen3", "qwen3moe", "gemma2", "gemma3", "phi3", "gpt2", "olmo2", "gpt-oss"
    }  # fmt: skip


@pytest.mark.parametrize("name", CASES)
def test_opens_by_path_with_the_architecture_and_tokenizer_transformers_reads(name):
    g = golden(name)
    ckpt = open_checkpoint(path(name))
    assert isinstance(ckpt, GGUFCheckpoint)
    assert g["model_type"] in registry.for_description(ckpt.description()).hf_readers
    tok = ckpt.tokenizer()
    assert tok.encode([g["text"]])[0].tolist() == g["plain_ids"]
    assert (tok.add_bos_default, tok.bos_id, tok.eos_id) == (g["add_bos"], g["bos_id"], g["eos_id"])
    assert architecture.resolve(ckpt).model().vocab_size == len(
        ckpt.header.metadata["tokenizer.ggml.tokens"]
    )


@pytest.mark.parametrize("name", CASES)
def test_the_header_is_the_gguf_packages(name):
    """The metadata and tensor table the walk reads are `gguf.GGUFReader`'s."""
    header = gguf_file.read(path(name))
    reader = gguf.GGUFReader(path(name))
    want = {k: f.contents() for k, f in reader.fields.items() if not k.startswith("GGUF.")}
    assert header.metadata == want
    assert [(t.name, t.shape, t.type, t.start, t.nbytes) for t in header.tensors.values()] == [
        (t.name, tuple(int(n) for n in reversed(t.shape)), t.tensor_type.name, t.data_offset,
         t.n_bytes) for t in reader.tensors
    ]  # fmt: skip


@pytest.mark.parametrize("name", CASES)
def test_stored_tensors_dequantize_as_the_gguf_package_does(name):
    """Every tensor read through the reader protocol (`Checkpoint.read`, each device's block
    from its own byte ranges) equals `gguf.quants.dequantize` of the whole tensor, bit for bit."""
    ckpt = open_checkpoint(path(name))
    mesh = mesh_lib.make_mesh(1, 8)
    sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("model"))
    reader = gguf.GGUFReader(path(name))
    want = {t.name: gguf.quants.dequantize(t.data, t.tensor_type) for t in reader.tensors}
    stored = ckpt.stored(None)
    assert stored == {t.name: (want[t.name].shape, t.tensor_type.name) for t in reader.tensors}
    abstract = {
        n: jax.ShapeDtypeStruct(shape, np.float32, sharding=sharding if shape[0] % 8 == 0 else
                                jax.sharding.SingleDeviceSharding(jax.devices()[0]))
        for n, (shape, _) in stored.items()
    }  # fmt: skip
    got = ckpt.read(None, abstract)
    for n, w in want.items():
        np.testing.assert_array_equal(np.asarray(got[n]), w, n)


@functools.cache
def scored(name: str, dtype=jnp.float32, dequantize: str = "host") -> np.ndarray:
    """ppl_jax's NLL of each next token of the golden window, `[seq - 1] float64`, its quantized
    weights dequantized on the host or kept packed on the device (`checkpoint.dequantize`)."""
    g = golden(name)
    ckpt = open_checkpoint(path(name))
    model = architecture.resolve(ckpt).model(
        dtype="float32" if dtype == jnp.float32 else "bfloat16"
    )
    model, found = architecture.packed(ckpt, None, model, dequantize)
    assert bool(found.device) == (dequantize != "host")
    target, _ = mesh_lib.param_targets(
        model.abstract_params, model.logical_axes, mesh_lib.make_mesh(-1, 1), DEFAULT_RULES
    )
    params = ckpt.restore(None, target)
    ids = jnp.asarray(np.asarray(g["ids"][: g["seq"]], np.int32)[None])
    positions = jnp.arange(ids.shape[1])[None]
    nll = token_nll(
        jax.jit(model.apply)(params, ids[:, :-1], positions[:, :-1], jnp.ones_like(ids[:, :-1])),
        ids[:, 1:],
    )
    return np.asarray(nll, np.float64)[0]


def _tier(name: str):
    return name if name in FAST else pytest.param(name, marks=pytest.mark.slow)


@pytest.mark.parametrize("name", [_tier(n) for n in CASES])
def test_log_probs_match_transformers_on_the_same_file(name):
    g = golden(name)
    ours, ref = scored(name), -np.asarray(g["log_probs"], np.float64)
    assert ours.shape == ref.shape
    assert np.max(np.abs(ours - ref) / np.abs(ref)) < 1e-5
    assert abs(ours.sum() - ref.sum()) / ref.sum() < 1e-6


@pytest.mark.slow
def test_bfloat16_within_1e3_of_float32():
    f32, bf16 = scored("llama_kquants"), scored("llama_kquants", jnp.bfloat16)
    assert abs(bf16.sum() - f32.sum()) / f32.sum() < 1e-3


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize("name", [_tier(n) for n in CASES])
def test_the_packed_weights_score_as_the_host_dequantized_ones(name, dtype):
    """Every quantized weight the device can dequantize kept packed (`checkpoint.dequantize`
    `auto`): each token's NLL is the host path's (within 1e-6 relative; equal on CPU)."""
    host, device = scored(name, dtype), scored(name, dtype, "auto")
    np.testing.assert_allclose(device, host, rtol=1e-6, atol=0)
