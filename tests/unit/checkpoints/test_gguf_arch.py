"""What a GGUF file's metadata means (`ppl_jax.checkpoints.readers.gguf_arch`), for the fields the
golden files do not vary: Llama 3's rotary factors (`rope_freqs`) recognized as its `llama3`
scaling, YaRN keys, Phi-3's `longrope` factors, Gemma's attention scale on the 27B models
(llama.cpp's rule, by layer count), Qwen3-MoE's dense layers, what is refused, and that each
architecture is read by one family (`Family.gguf`) as one of its model types."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from ppl_jax.checkpoints.formats.gguf_file import GGUFFile, Tensor
from ppl_jax.checkpoints.readers import gguf_arch
from ppl_jax.errors import CheckpointError
from ppl_jax.models import registry
from ppl_jax.models.families import qwen3


def header(arch: str, tensors: dict[str, tuple[int, ...]] | None = None, **keys) -> GGUFFile:
    """An in-memory header of `arch` (a small model's keys, `keys` on top)."""
    base = {"block_count": 2, "context_length": 4096, "embedding_length": 256,
            "feed_forward_length": 512, "attention.head_count": 4,
            "attention.head_count_kv": 2, "attention.layer_norm_rms_epsilon": 1e-5}  # fmt: skip
    meta = {"general.architecture": arch, **{f"{arch}.{k}": v for k, v in {**base, **keys}.items()}}
    shapes = {"token_embd.weight": (1000, 256), **(tensors or {})}
    found = {
        n: Tensor(n, s, "F32", 0, 4 * math.prod(s), 1, 4, "model.gguf") for n, s in shapes.items()
    }
    return GGUFFile("model.gguf", 0, 3, meta, found)


def llama3_factors(theta: float, head_dim: int, factor: float) -> np.ndarray:
    """Llama 3.1's per-frequency factors as llama.cpp's converter computes them."""
    out = []
    for f in 1.0 / theta ** (np.arange(0, head_dim, 2) / head_dim):
        wavelen = 2 * math.pi / f
        if wavelen < 8192 / 4:
            out.append(1.0)
        elif wavelen > 8192:
            out.append(factor)
        else:
            smooth = (8192 / wavelen - 1) / 3
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.asarray(out, np.float32)


@pytest.mark.parametrize("factor", [8.0, 32.0])
def test_llama3_rotary_factors_are_its_scaling(factor):
    rows = {"rope_freqs.weight": llama3_factors(500000.0, 64, factor)}
    h = header("llama", {"rope_freqs.weight": (32,)}, **{"rope.freq_base": 500000.0})
    d = gguf_arch.description(h, rows.__getitem__)
    assert (d["rope_type"], d["rope_factor"], d["rope_original_max_positions"]) == (
        "llama3", factor, 8192
    )  # fmt: skip


def test_rotary_factors_of_no_known_scaling_are_refused():
    rows = {"rope_freqs.weight": np.linspace(1, 3, 32, dtype=np.float32)}
    h = header("llama", {"rope_freqs.weight": (32,)})
    with pytest.raises(CheckpointError, match="rotary factors .* of no Llama 3 scaling"):
        gguf_arch.description(h, rows.__getitem__)


def test_yarn_keys():
    h = header("qwen3", **{"rope.scaling.type": "yarn", "rope.scaling.factor": 4.0,
                           "rope.scaling.original_context_length": 1024,
                           "rope.freq_base": 1e6})  # fmt: skip
    d = gguf_arch.description(h, None)
    got = (d["rope_type"], d["rope_factor"], d["rope_original_max_positions"])
    assert got == ("yarn", 4.0, 1024)
    assert d["rope_theta"] == 1e6


def test_phi3_longrope_from_its_factor_tensors():
    short, long = np.linspace(1, 2, 32, dtype=np.float32), np.linspace(1, 8, 32, dtype=np.float32)
    rows = {"rope_factors_short.weight": short, "rope_factors_long.weight": long}
    tensors = {"rope_factors_short.weight": (32,), "rope_factors_long.weight": (32,)}
    h = header("phi3", tensors, **{"rope.scaling.original_context_length": 1024})
    d = gguf_arch.description(h, rows.__getitem__)
    assert d["rope_type"] == "longrope" and d["rope_original_max_positions"] == 1024
    np.testing.assert_allclose(d["rope_long_factor"], long)
    np.testing.assert_allclose(d["rope_short_factor"], short)


@pytest.mark.parametrize("arch,layers,scale", [
    ("gemma2", 2, 64 ** -0.5), ("gemma2", 46, (256 / 4) ** -0.5),
    ("gemma3", 2, 32 ** -0.5), ("gemma3", 62, (256 / 4) ** -0.5),
])  # fmt: skip
def test_gemma_attention_scale_is_llama_cpps(arch, layers, scale):
    h = header(arch, block_count=layers, **{"attention.key_length": 64 if arch == "gemma2" else 32,
                                            "attention.sliding_window": 512})  # fmt: skip
    d = gguf_arch.description(h, None)
    assert d["query_scale"] == pytest.approx(scale)
    assert d["norm_offset"] == 1.0 and d["embed_scale"]


def test_gemma3_has_one_global_layer_in_six():
    h = header("gemma3", block_count=12, **{"attention.sliding_window": 512,
                                            "rope.freq_base": 1e6})  # fmt: skip
    d = gguf_arch.description(h, None)
    assert list(d["sliding_layers"]) == [0, 1, 2, 3, 4, 6, 7, 8, 9, 10]
    assert d["rope_theta"] == 1e6 and d["sliding_rope"]["rope_theta"] == 10000.0


def test_qwen3moe_layers_without_a_router_are_dense():
    tensors = {"blk.1.ffn_gate_inp.weight": (8, 256)}
    h = header("qwen3moe", tensors, expert_count=8, expert_used_count=2,
               expert_feed_forward_length=64)  # fmt: skip
    d = gguf_arch.description(h, None)
    assert list(d["moe_layers"]) == [1] and d["moe_norm_topk_prob"] and d["moe_mlp_dim"] == 64


@pytest.mark.parametrize("change,match", [
    ({"general.architecture": "mamba"}, "the GGUF architecture 'mamba', which ppl_jax does not "
                                        "read"),
    ({"llama.attention.head_count": [4, 4]}, "gives llama.attention.head_count per layer"),
    ({"llama.embedding_length": None}, "llama.embedding_length = None is not a whole number"),
    ({"llama.block_count": 5000}, "num_layers=5000 is not a size ppl_jax builds"),
    ({"llama.rope.scaling.type": "dynamic"}, "the rope scaling 'dynamic', which ppl_jax does not "
                                             "read"),
])  # fmt: skip
def test_refused_in_one_sentence_naming_the_file(change, match):
    h = header("llama")
    h.metadata.update(change)
    with pytest.raises(CheckpointError, match=match) as e:
        gguf_arch.description(h, None)
    assert "model.gguf" in str(e.value)


def test_a_missing_key_is_named():
    h = header("llama")
    del h.metadata["llama.block_count"]
    with pytest.raises(CheckpointError, match="lacks the metadata key llama.block_count"):
        gguf_arch.description(h, None)


def test_gpt_oss_without_its_experts_width_is_named():
    h = header("gpt-oss")
    with pytest.raises(CheckpointError, match="lacks the metadata key "
                       "gpt-oss.expert_feed_forward_length"):  # fmt: skip
        gguf_arch.description(h, None)


def test_each_architecture_is_read_as_a_model_type_of_its_own_family():
    for family in registry.families().values():
        for arch, reader in family.gguf.items():
            assert reader.model_type in family.hf_readers, (family.name, arch)


def test_two_families_may_not_read_one_architecture(monkeypatch):
    claims = dataclasses.replace(qwen3.FAMILY, gguf={**qwen3.FAMILY.gguf, "llama": None})
    monkeypatch.setattr(qwen3, "FAMILY", claims)
    registry.families.cache_clear()
    try:
        with pytest.raises(RuntimeError, match="two families read one GGUF architecture"):
            registry.families()
    finally:
        monkeypatch.undo()
        registry.families.cache_clear()
    assert registry.for_gguf_architecture("llama").model_type == "llama"


@pytest.mark.parametrize("window", [0, -1])
def test_gpt_oss_window_below_one_is_refused(window):
    h = header("gpt-oss", **{"expert_feed_forward_length": 512, "attention.sliding_window": window})
    with pytest.raises(
        CheckpointError, match=r"gpt-oss\.attention\.sliding_window=.* is no window"
    ):
        gguf_arch.description(h, None)


def test_gpt_oss_without_a_window_takes_the_released_128():
    h = header("gpt-oss", **{"expert_feed_forward_length": 512})
    assert gguf_arch.description(h, None)["sliding_window"] == 128
