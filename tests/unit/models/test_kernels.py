"""The attention kernels' table (`ppl_jax.models.layers.kernels`): the config's choices are its
names, each refusal is the record's, and `auto` picks per kind of layer, as results.json's
`attention_layers` records (no kernel of the table lacks what only one kind of layer needs, so
the per-kind choice is shown with a splash record that lacked chunks, as splash did before
`ppl_jax.models.layers.splash_cases`). tokamax, an optional extra, is taken as installed or not
(`helpers.tokamax_installed`) whatever this Python has: its kernel's own tests are
tests/unit/models/test_tokamax_kernel.py, collected where it is installed."""

from __future__ import annotations

import dataclasses
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from test_families import FAMILY_DIR

from ppl_jax.checkpoints.formats import safetensors
from ppl_jax.config import defaults, settings
from ppl_jax.errors import ConfigError
from ppl_jax.models.layers import attention, fused, kernels
from ppl_jax.models.layers.attention import flash_note, layer_kernels, resolve_for

import helpers

BF16 = jnp.bfloat16


def _llama4():
    return safetensors.read_description(os.path.join(FAMILY_DIR, "llama4"))


@pytest.fixture
def without_tokamax(monkeypatch):
    helpers.tokamax_installed(monkeypatch, False)


@pytest.fixture
def with_tokamax(monkeypatch):
    helpers.tokamax_installed(monkeypatch, True)


@pytest.fixture
def splash_without_chunks(monkeypatch):
    """The table with a splash record that cannot run chunked attention."""
    record = dataclasses.replace(kernels.SPLASH, lacks=("chunk",))
    monkeypatch.setitem(kernels.KERNELS, "splash", record)


def test_the_configs_choices_are_the_tables_names():
    assert kernels.CHOICES == ("auto", "cudnn", "tokamax", "splash", "xla")
    assert attention.IMPLEMENTATIONS == kernels.CHOICES
    for name in kernels.CHOICES:
        c = defaults.get_config()
        c.model.attention = name
        assert settings.from_config(c).attention == name
    c.model.attention = "flash3"
    with pytest.raises(ConfigError, match="model.attention"):
        settings.from_config(c)


def test_auto_picks_the_fastest_kernel_that_can_do_the_layer(without_tokamax):
    chunked = kernels.Needs(chunk=True)
    assert kernels.pick("tpu", BF16, 64, chunked) is kernels.SPLASH
    assert kernels.pick("gpu", BF16, 64, kernels.Needs(softcap=True)) is kernels.XLA
    assert kernels.pick("tpu", BF16, 64, kernels.Needs(softcap=True)) is kernels.SPLASH
    assert kernels.pick("tpu", BF16, 64, kernels.Needs()) is kernels.SPLASH
    assert kernels.pick("gpu", BF16, 64, kernels.Needs(window=True)) is kernels.CUDNN
    assert kernels.pick("gpu", jnp.float32, 64, kernels.Needs()) is kernels.XLA
    assert kernels.pick("cpu", BF16, 64, kernels.Needs()) is kernels.XLA
    ring = kernels.Needs(context=2, context_attention="ring", chunk=True, window=True)
    assert kernels.pick("tpu", BF16, 64, ring) is kernels.SPLASH
    assert kernels.pick("gpu", BF16, 64, ring) is kernels.CUDNN


def test_auto_takes_tokamax_after_cudnn_where_it_is_installed(with_tokamax):
    """cuDNN first for what it can run; tokamax for 16-bit soft-capped layers with heads up to
    256 wide, on one device and over the context axis (gathered or ring); never on a TPU or CPU,
    nor for float32 (its Mosaic kernel takes 16-bit inputs)."""
    softcap = kernels.Needs(softcap=True)
    assert kernels.pick("gpu", BF16, 64, softcap).name == "tokamax"
    assert kernels.pick("gpu", jnp.float16, 256, softcap).name == "tokamax"
    assert kernels.pick("gpu", BF16, 512, softcap) is kernels.XLA
    assert kernels.pick("gpu", jnp.float32, 64, softcap) is kernels.XLA
    assert kernels.pick("gpu", BF16, 64, kernels.Needs(window=True)) is kernels.CUDNN
    assert kernels.pick("gpu", BF16, 256, kernels.Needs()).name == "tokamax"  # wider than cuDNN
    for how in ("all_gather", "ring"):
        needs = kernels.Needs(softcap=True, window=True, context=4, context_attention=how)
        assert kernels.pick("gpu", BF16, 128, needs).name == "tokamax"
    assert kernels.pick("tpu", BF16, 64, softcap) is kernels.SPLASH
    assert kernels.pick("cpu", BF16, 64, softcap) is kernels.XLA
    gemma2 = safetensors.read_description(os.path.join(FAMILY_DIR, "gemma2"))
    assert layer_kernels("auto", BF16, gemma2, platform="gpu") == {
        "sliding": "tokamax",
        "global": "tokamax",
    }
    assert resolve_for("auto", BF16, gemma2, platform="gpu") == "tokamax"
    assert resolve_for("tokamax", BF16, gemma2, platform="gpu", context=2) == "tokamax"


def test_auto_passes_over_tokamax_where_it_is_not_installed(without_tokamax):
    assert kernels.pick("gpu", BF16, 64, kernels.Needs(softcap=True)) is kernels.XLA
    assert kernels.candidates("gpu", BF16, 64) == (kernels.CUDNN, kernels.XLA)


def test_llama4_runs_one_kernel_under_auto():
    """Splash runs the chunked layers (`splash_cases`), cuDNN too: one kernel per platform."""
    d = _llama4()
    assert kernels.layer_needs(d)["chunked"].chunk and not kernels.layer_needs(d)["global"].chunk
    for context_attention in ("all_gather", "ring"):
        mesh = dict(context=2, context_attention=context_attention)
        picks = layer_kernels("auto", BF16, d, platform="tpu", **mesh)
        assert picks == {"chunked": "splash", "global": "splash"}
        assert resolve_for("auto", BF16, d, platform="tpu", **mesh) == "splash"
    assert resolve_for("splash", BF16, d, platform="tpu") == "splash"
    assert flash_note("auto", BF16, d, platform="tpu") is None


def test_two_kernels_under_auto_and_one_when_told(splash_without_chunks):
    d = _llama4()
    assert layer_kernels("auto", BF16, d, platform="tpu") == {"chunked": "xla", "global": "splash"}
    assert layer_kernels("auto", BF16, d, platform="gpu") == {"chunked": "cudnn", "global": "cudnn"}
    assert resolve_for("auto", BF16, d, platform="gpu") == "cudnn"
    assert layer_kernels("auto", BF16, d, platform="cpu") == {"chunked": "xla", "global": "xla"}
    assert layer_kernels("xla", BF16, d, platform="tpu") == {"chunked": "xla", "global": "xla"}
    assert resolve_for("auto", BF16, d, platform="tpu") == "auto"  # `attend` picks per layer
    assert resolve_for("auto", BF16, d, platform="cpu") == "xla"
    with pytest.raises(ConfigError, match="cannot run chunked attention"):
        resolve_for("splash", BF16, d, platform="tpu")


def test_one_kind_of_layer_is_named_attention(without_tokamax):
    d = {"num_layers": 2, "embed_dim": 64, "num_heads": 4, "attn_sinks": True}
    assert layer_kernels("auto", BF16, d, platform="gpu") == {"attention": "cudnn"}
    assert layer_kernels("auto", BF16, dict(d, attn_softcap=30.0), platform="gpu") == {
        "attention": "xla"
    }
    assert layer_kernels("auto", BF16, d, platform="tpu") == {"attention": "splash"}
    assert layer_kernels("auto", BF16, {"num_layers": 2}, platform="tpu") == {}  # Mamba2's
    sliding = dict(d, sliding_window=4, sliding_layers=[0])
    assert set(layer_kernels("auto", BF16, sliding, platform="tpu")) == {"sliding", "global"}


def test_attend_auto_picks_per_layer_on_the_default_backend():
    """On CPU every layer takes `xla`: `auto` equals it, with a chunk or without."""
    rng = np.random.default_rng(0)
    q, k, v = (jnp.asarray(rng.normal(size=(1, 16, 2, 8)), jnp.float32) for _ in range(3))
    seg = jnp.ones((1, 16), jnp.int32)
    pos = jnp.arange(16, dtype=jnp.int32)[None]
    for chunk in (None, 4):
        args = dict(segment_ids=seg, positions=pos, chunk=chunk)
        auto = attention.attend(q, k, v, implementation="auto", **args)
        np.testing.assert_array_equal(auto, attention.attend(q, k, v, implementation="xla", **args))
    assert attention.keeps_segments("auto") and attention.queries_apart("auto")
    assert jax.default_backend() == "cpu"


def test_the_refusals_are_the_records():
    assert kernels.CUDNN.refuses(kernels.Needs(softcap=True)).startswith("soft-cap")
    assert kernels.CUDNN.refuses(kernels.Needs(sinks=True, chunk=True, mla=True)) is None
    assert kernels.SPLASH.refuses(kernels.Needs(sinks=True)) is None
    assert kernels.XLA.refuses(kernels.Needs(chunk=True, softcap=True, mla=True)) is None
    with pytest.raises(ValueError, match="unknown attention implementation"):
        kernels.kernel("flash3")


def test_the_flash_note_names_the_slow_layers_and_the_missing_capability(
    splash_without_chunks, without_tokamax
):
    """Gemma 2 on a GPU without tokamax: every kind of layer on `xla` for cuDNN's want of a
    soft-cap and tokamax's absence, with the command that installs it; Llama 4 on a TPU with a
    splash that lacked chunks: its chunked layers; no note where the fused kernel runs every
    layer, or on CPU."""
    gemma2 = safetensors.read_description(os.path.join(FAMILY_DIR, "gemma2"))
    assert flash_note("auto", BF16, gemma2, platform="gpu") == (
        "sliding, global layers run the flash kernel (xla), slower: cudnn cannot soft-cap "
        "attention scores (attn_logit_softcapping), and tokamax is not installed "
        "(pip install 'ppl_jax[gpu]', on Python >= 3.12)"
    )
    assert flash_note("xla", BF16, gemma2, platform="gpu") == flash_note(
        "auto", BF16, gemma2, platform="gpu"
    )
    assert flash_note("auto", BF16, gemma2, platform="tpu") is None
    assert flash_note("auto", BF16, gemma2, platform="cpu") is None
    assert flash_note("auto", BF16, _llama4(), platform="tpu") == (
        "chunked layers run the flash kernel (xla), slower: splash cannot run chunked attention"
    )
    assert flash_note("auto", BF16, _llama4(), platform="gpu") is None
    one = {"num_layers": 2, "embed_dim": 64, "num_heads": 4, "attn_softcap": 30.0}
    assert flash_note("auto", BF16, one, platform="gpu").startswith("every layer runs")
    assert flash_note("auto", jnp.float32, dict(one, attn_softcap=None), platform="gpu") == (
        "every layer runs the flash kernel (xla), slower: cudnn runs only 16-bit params with "
        "heads a multiple of 8 up to 128 wide, 256 on Hopper or newer (here float32, heads of 16), "
        "and tokamax runs only 16-bit params with heads up to 256 wide (here float32, heads of 16)"
    )
    wide = dict(one, attn_softcap=None, head_dim=256)  # Gemma 3's heads: before Hopper
    assert "(here bfloat16, heads of 256)" in flash_note("auto", BF16, wide, platform="gpu")
    assert flash_note("xla", BF16, dict(one, attn_softcap=None), platform="gpu") is None


@pytest.mark.parametrize("major,picked", [(8, "xla"), (9, "cudnn"), (10, "cudnn")])
def test_heads_wider_than_128_take_cudnn_on_hopper_or_newer(monkeypatch, major, picked):
    """JAX's cuDNN entry takes heads up to 256 wide on compute capability 9.0 or newer (Gemma 2
    and 3's 256, DeepSeek-V3's 192 keys), 128 before; 264 nowhere, nor widths off a multiple of
    8."""
    monkeypatch.setattr(fused, "compute_major", lambda platform: major)
    helpers.tokamax_installed(monkeypatch, False)  # else it would take what cuDNN cannot
    gemma3 = {"num_layers": 2, "embed_dim": 64, "num_heads": 4, "head_dim": 256}
    assert attention.resolve("auto", BF16, 256, platform="gpu") == picked
    assert attention.resolve("auto", BF16, 192, platform="gpu", value_dim=128) == picked
    assert attention.resolve("auto", BF16, 264, platform="gpu") == "xla"
    assert attention.resolve("auto", BF16, 204, platform="gpu") == "xla"
    assert (flash_note("auto", BF16, gemma3, platform="gpu") is None) == (picked == "cudnn")


def test_no_flash_note_for_soft_caps_where_tokamax_runs_them(with_tokamax):
    """Gemma 2 on a GPU with tokamax: no layer runs `xla` under `auto`, nor a note when `xla` is
    asked (a fused kernel could have run it); float32 names both kernels' reasons."""
    gemma2 = safetensors.read_description(os.path.join(FAMILY_DIR, "gemma2"))
    assert flash_note("auto", BF16, gemma2, platform="gpu") is None
    assert flash_note("xla", BF16, gemma2, platform="gpu") is None
    assert flash_note("auto", jnp.float32, gemma2, platform="gpu") == (
        "sliding, global layers run the flash kernel (xla), slower: cudnn cannot soft-cap "
        "attention scores (attn_logit_softcapping), and tokamax runs only 16-bit params with "
        "heads up to 256 wide (here float32, heads of 16)"
    )


@pytest.mark.parametrize("installed", [False, True])
def test_explicit_tokamax_where_it_cannot_run_is_refused_before_the_weights(
    monkeypatch, tiny_checkpoint, installed
):
    """Not installed, on any platform; installed, on a platform without an NVIDIA GPU (this
    CPU): one sentence, while the run's attention is resolved for its mesh."""
    from ppl_jax.checkpoints import architecture, open_checkpoint
    from ppl_jax.runtime import mesh as mesh_lib

    helpers.tokamax_installed(monkeypatch, installed)
    message = (
        r"model.attention=tokamax needs an NVIDIA GPU, and this run's devices \(cpu\) have none"
        if installed
        else r"model.attention=tokamax needs tokamax, which is not installed here "
        r"\(pip install 'ppl_jax\[gpu\]', on Python >= 3.12\); set model.attention=auto"
    )
    arch = architecture.resolve(open_checkpoint(tiny_checkpoint), 5)
    with pytest.raises(ConfigError, match=message):
        arch.attention("tokamax", "bfloat16", mesh_lib.make_mesh(-1, 1))
    with pytest.raises(ConfigError, match=message):
        attention.resolve("tokamax", BF16, 64, platform="gpu" if not installed else "cpu")
    if installed:
        assert attention.resolve("tokamax", BF16, 64, platform="gpu", softcap=True) == "tokamax"
