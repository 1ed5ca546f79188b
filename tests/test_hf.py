"""Hugging Face checkpoints: tiny random transformers models, loaded by ppl_jax and scored against
PyTorch's own log-probabilities; bad directories; conversion to Orbax."""

import contextlib
import json
import os
import pickle
import shutil
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ppl_jax import checkpoint, hf
from ppl_jax import mesh as mesh_lib
from ppl_jax import model as model_lib
from ppl_jax import tokenizer as tokenizer_lib
from ppl_jax.config import DEFAULT_RULES
from ppl_jax.errors import CheckpointError
from ppl_jax.nll import token_nll

torch = pytest.importorskip("torch", reason="the reference models need PyTorch")
tf = pytest.importorskip("transformers", reason="the reference models need transformers")

SEQ = 40
COMMON = dict(
    vocab_size=300,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=128,
    initializer_range=0.2,
    rms_norm_eps=1e-5,
)
LLAMA3_ROPE = {
    "rope_type": "llama3",
    "rope_theta": 5000.0,
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 64,
}  # head_dim 8: all three frequency bands


def _llama():
    return tf.LlamaForCausalLM(tf.LlamaConfig(**COMMON, rope_parameters=LLAMA3_ROPE))


def _mistral():
    return tf.MistralForCausalLM(tf.MistralConfig(**COMMON, sliding_window=8))


def _qwen2():
    return tf.Qwen2ForCausalLM(tf.Qwen2Config(**COMMON, tie_word_embeddings=True))


def _gpt2():
    return tf.GPT2LMHeadModel(
        tf.GPT2Config(
            vocab_size=300,
            n_embd=32,
            n_layer=2,
            n_head=4,
            n_positions=64,
            initializer_range=0.2,
            scale_attn_by_inverse_layer_idx=True,
            bos_token_id=0,
            eos_token_id=0,
        )
    )


FAMILIES = {"llama": _llama, "mistral": _mistral, "qwen2": _qwen2, "gpt2": _gpt2}


def _save(make, path, **kwargs):
    """A random model with its vectors (norm scales, biases; transformers starts them at 1 and 0)
    perturbed so that a wrongly loaded one shows; saved with `save_pretrained`."""
    torch.manual_seed(0)
    model = make().eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 1:
                p.add_(0.2 * torch.randn_like(p))
    model.save_pretrained(path, **kwargs)
    return model


@pytest.fixture(scope="module")
def hf_dirs(tmp_path_factory):
    """family -> (directory, the PyTorch model). Llama is saved in sharded safetensors."""
    root = tmp_path_factory.mktemp("hf")
    out = {}
    for name, make in FAMILIES.items():
        kwargs = {"max_shard_size": "20KB"} if name == "llama" else {}
        out[name] = (str(root / name), _save(make, str(root / name), **kwargs))
    return out


def _tokens(vocab=300, seed=0):
    return np.random.default_rng(seed).integers(0, vocab, size=SEQ + 1)


def _torch_log_probs(model, tokens):
    with torch.no_grad():
        logits = model(torch.tensor(tokens[None, :-1])).logits
    log_probs = torch.log_softmax(logits.float(), dim=-1)[0]
    return log_probs[torch.arange(SEQ), torch.tensor(tokens[1:])].numpy()


def _load(path, mesh, dtype=jnp.float32, description=None):
    model = model_lib.build(description or hf.read_description(path), dtype)
    shardings = mesh_lib.param_shardings(
        model.abstract_params, model.logical_axes, mesh, DEFAULT_RULES
    )
    target = jax.tree.map(
        lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
        model.abstract_params,
        shardings,
    )
    return model, hf.load_params(path, target), shardings


def _log_probs(model, params, tokens):
    x = jnp.asarray(tokens[None, :-1], jnp.int32)
    positions = jnp.arange(SEQ, dtype=jnp.int32)[None]
    out = jax.jit(model.apply)(params, x, positions, jnp.ones_like(x))
    return -np.asarray(token_nll(out, jnp.asarray(tokens[None, 1:], jnp.int32)))[0]


@pytest.mark.parametrize(
    "family,mesh_shape",
    [
        ("llama", (8, 1)),
        ("llama", (2, 4)),
        ("mistral", (8, 1)),
        ("qwen2", (8, 1)),
        ("gpt2", (8, 1)),
        ("gpt2", (2, 4)),
    ],
)
def test_log_probs_match_pytorch(hf_dirs, family, mesh_shape):
    path, torch_model = hf_dirs[family]
    tokens = _tokens()
    mesh = mesh_lib.make_mesh(*mesh_shape)
    model, params, shardings = _load(path, mesh)
    for leaf, sharding in zip(jax.tree.leaves(params), jax.tree.leaves(shardings), strict=True):
        assert leaf.sharding == sharding and leaf.dtype == jnp.float32
    if mesh_shape == (2, 4):  # heads, vocab and mlp are really split over the model axis
        q = params["layers"]["0"]["attn"]["q"]
        assert q.addressable_shards[0].data.shape[1] == q.shape[1] // 4
    ref = _torch_log_probs(torch_model, tokens)
    ours = _log_probs(model, params, tokens)
    assert np.abs(ours - ref).max() < 1e-4


class _CountingSlice:
    """Wraps a safetensors slice, recording the elements of every read."""

    def __init__(self, sl, name, reads):
        self.sl, self.name, self.reads = sl, name, reads

    def __getitem__(self, index):
        block = self.sl[index]
        self.reads.append((self.name, block.size))
        return block

    def get_shape(self):
        return self.sl.get_shape()

    def get_dtype(self):
        return self.sl.get_dtype()


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_each_block_is_read_once_and_alone(hf_dirs, monkeypatch, family):
    """On a 2x4 mesh every stored element is read exactly once: replicated weights once for all
    devices, split weights as disjoint per-device blocks (GPT-2's fused c_attn included)."""
    reads = []
    real = hf._open_slice

    @contextlib.contextmanager
    def counting(file, name):
        with real(file, name) as sl:
            yield _CountingSlice(sl, name, reads)

    monkeypatch.setattr(hf, "_open_slice", counting)
    _, params, _ = _load(hf_dirs[family][0], mesh_lib.make_mesh(2, 4))
    assert sum(size for _, size in reads) == sum(leaf.size for leaf in jax.tree.leaves(params))
    name = (
        "transformer.h.0.attn.c_attn.weight"
        if family == "gpt2"
        else ("model.layers.0.self_attn.q_proj.weight")
    )
    assert {size for n, size in reads if n == name} == {32 * 8}  # one head of 8 at a time


def test_descriptions(hf_dirs):
    llama = hf.read_description(hf_dirs["llama"][0])
    assert (llama["rope_type"], llama["rope_theta"], llama["rope_original_max_positions"]) == (
        "llama3",
        5000.0,
        64,
    )
    assert (llama["num_kv_heads"], llama["tie_embeddings"], llama["qkv_bias"]) == (2, False, False)
    mistral = hf.read_description(hf_dirs["mistral"][0])
    assert (mistral["sliding_window"], mistral["sliding_layers"]) == (8, [0, 1])
    qwen2 = hf.read_description(hf_dirs["qwen2"][0])
    assert (qwen2["qkv_bias"], qwen2["o_bias"], qwen2["tie_embeddings"]) == (True, False, True)
    assert qwen2["sliding_window"] is None
    gpt2 = hf.read_description(hf_dirs["gpt2"][0])
    assert gpt2 == {
        "family": "gpt2",
        "vocab_size": 300,
        "embed_dim": 32,
        "num_layers": 2,
        "num_heads": 4,
        "mlp_dim": 128,
        "max_positions": 64,
        "norm_eps": 1e-5,
        "activation": "gelu_new",
        "scale_attn_weights": True,
        "scale_attn_by_inverse_layer_idx": True,
        "tie_embeddings": True,
    }


@pytest.mark.parametrize(
    "family,change",
    [
        ("llama", {"rope_type": "default"}),
        ("mistral", {"sliding_window": None, "sliding_layers": []}),
    ],
)
def test_the_comparison_sees_rope_scaling_and_sliding_window(hf_dirs, family, change):
    """Without the llama3 scaling or the window, the log-probabilities move well beyond 1e-4."""
    path, torch_model = hf_dirs[family]
    tokens = _tokens()
    model, params, _ = _load(
        path, mesh_lib.make_mesh(-1, 1), description={**hf.read_description(path), **change}
    )
    assert (
        np.abs(_log_probs(model, params, tokens) - _torch_log_probs(torch_model, tokens)).max()
        > 1e-2
    )


BASE_CONFIG = {
    "model_type": "llama",
    "vocab_size": 300,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "max_position_embeddings": 128,
}


def test_descriptions_stored_before_the_hf_fields_still_build():
    old = {
        "family": "llama",
        "vocab_size": 256,
        "embed_dim": 32,
        "num_layers": 1,
        "num_heads": 4,
        "num_kv_heads": 2,
        "head_dim": 8,
        "mlp_dim": 64,
        "max_positions": 128,
        "rope_theta": 10000.0,
        "norm_eps": 1e-5,
        "tie_embeddings": True,
    }
    model = model_lib.build(old, jnp.float32)
    assert sorted(model.abstract_params["layers"]["0"]["attn"]) == ["k", "o", "q", "v"]
    assert (
        model.description["rope_type"] == "default" and model.description["sliding_window"] is None
    )
    assert sorted(model.abstract_params) == ["embedding", "final_norm", "layers"]


def test_old_and_new_rope_spellings_agree(tmp_path):
    base = BASE_CONFIG
    old = {
        **base,
        "rope_theta": 5000.0,
        "rope_scaling": {
            "type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64,
        },
    }
    new = {**base, "rope_parameters": LLAMA3_ROPE}
    descs = []
    for name, cfg in (("old", old), ("new", new)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text(json.dumps(cfg))
        descs.append(hf.read_description(str(tmp_path / name)))
    assert descs[0] == descs[1]
    assert descs[0]["rope_factor"] == 8.0 and descs[0]["num_kv_heads"] == 4
    assert descs[0]["head_dim"] == 8 and descs[0]["norm_eps"] == 1e-6  # transformers' defaults


def test_unsupported_model_type(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "bert"}))
    with pytest.raises(
        CheckpointError,
        match=r"model_type 'bert' is not supported; .* llama, "
        r"mistral, qwen2, gpt2",
    ):
        hf.read_description(str(tmp_path))
    (tmp_path / "config.json").write_text(
        json.dumps({**BASE_CONFIG, "rope_parameters": {"rope_type": "yarn", "factor": 2.0}})
    )
    with pytest.raises(
        CheckpointError,
        match=r"config.json: rope_type 'yarn' is not supported "
        r"\(supported: default, linear, llama3\)",
    ):
        hf.read_description(str(tmp_path))
    (tmp_path / "config.json").write_text(json.dumps({**BASE_CONFIG, "hidden_act": "gelu"}))
    with pytest.raises(CheckpointError, match="hidden_act 'gelu' is not supported"):
        hf.read_description(str(tmp_path))
    (tmp_path / "config.json").write_text(json.dumps({**BASE_CONFIG, "vocab_size": None}))
    with pytest.raises(CheckpointError, match="config.json: a field has the wrong type"):
        hf.read_description(str(tmp_path))
    (tmp_path / "config.json").write_text(
        json.dumps({"model_type": "gpt2", "n_embd": 32, "vocab_size": 9})
    )
    with pytest.raises(
        CheckpointError, match="config.json: the gpt2 config lacks the field 'n_layer'"
    ):
        hf.read_description(str(tmp_path))


class _Marker:
    """Unpickling this creates the marker file."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def test_pickled_weights_are_refused_unread(hf_dirs, tmp_path):
    d = tmp_path / "pickled"
    d.mkdir()
    (d / "config.json").write_text(open(os.path.join(hf_dirs["llama"][0], "config.json")).read())
    marker = tmp_path / "unpickled"
    (d / "pytorch_model.bin").write_bytes(pickle.dumps(_Marker(str(marker))))
    assert hf.is_hf_checkpoint(str(d))
    model = model_lib.build(hf.read_description(str(d)), jnp.float32)
    with pytest.raises(
        CheckpointError,
        match=r"only pickled PyTorch weights \(pytorch_model.bin\)"
        r".*safe_serialization=True",
    ):
        hf.load_params(str(d), model.abstract_params)
    assert not marker.exists()
    assert not hf.is_hf_checkpoint(str(tmp_path))


def test_missing_and_misshapen_weights_are_named(hf_dirs, tmp_path):
    from safetensors.numpy import load_file, save_file

    src = hf_dirs["qwen2"][0]
    d = tmp_path / "broken"
    d.mkdir()
    weights = load_file(os.path.join(src, "model.safetensors"))
    del weights["model.layers.1.mlp.up_proj.weight"]
    weights["model.layers.0.self_attn.k_proj.bias"] = np.zeros(17, np.float32)
    save_file(weights, str(d / "model.safetensors"))
    (d / "config.json").write_text(open(os.path.join(src, "config.json")).read())
    model = model_lib.build(hf.read_description(str(d)), jnp.float32)
    with pytest.raises(CheckpointError) as e:
        hf.load_params(str(d), model.abstract_params)
    assert "'model.layers.1.mlp.up_proj.weight' is missing" in str(e.value)
    assert "'model.layers.0.self_attn.k_proj.bias' has shape (17,), config.json implies (16,)" in (
        str(e.value)
    )


def test_bfloat16(hf_dirs, tmp_path):
    """Float32 weights load as bfloat16 (rounded as `astype` rounds), and stored bfloat16 weights
    load exactly."""
    path, torch_model = hf_dirs["gpt2"]
    mesh = mesh_lib.make_mesh(-1, 1)
    _, p32, _ = _load(path, mesh)
    _, p16, _ = _load(path, mesh, jnp.bfloat16)
    for a, b in zip(jax.tree.leaves(p32), jax.tree.leaves(p16), strict=True):
        assert b.dtype == jnp.bfloat16
        np.testing.assert_array_equal(np.asarray(a.astype(jnp.bfloat16)), np.asarray(b))
    torch_model.to(torch.bfloat16).save_pretrained(str(tmp_path / "bf16"))
    torch_model.to(torch.float32)
    _, from_bf16, _ = _load(str(tmp_path / "bf16"), mesh)
    for a, b in zip(jax.tree.leaves(p16), jax.tree.leaves(from_bf16), strict=True):
        assert b.dtype == jnp.float32
        np.testing.assert_array_equal(np.asarray(a, np.float32), np.asarray(b))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_conversion_to_orbax_restores_the_same_params(hf_dirs, tmp_path, dtype):
    from ppl_jax.convert import convert

    path = str(tmp_path / "llama")
    shutil.copytree(hf_dirs["llama"][0], path)
    _write_word_tokenizer(path)
    out = str(tmp_path / "orbax")
    convert(path, out, dtype)
    step, meta = checkpoint.read_metadata(out, None)
    assert step == 0 and meta["model"] == hf.read_description(path)
    tok = tokenizer_lib.from_description(meta["tokenizer"])
    assert (tok.bos_id, tok.eos_id, tok.add_bos_default) == (1, 2, True)
    assert tok.encode(["hello world hello"])[0].tolist() == [3, 4, 3]
    jdtype = jnp.dtype(dtype)
    model, direct, shardings = _load(
        path, mesh_lib.make_mesh(-1, 1), jdtype, description=meta["model"]
    )
    target = jax.tree.map(
        lambda a, s: jax.ShapeDtypeStruct(a.shape, jdtype, sharding=s),
        model.abstract_params,
        shardings,
    )
    restored = checkpoint.restore_params(out, step, target)
    for a, b in zip(jax.tree.leaves(direct), jax.tree.leaves(restored), strict=True):
        assert b.dtype == jdtype and b.sharding == a.sharding
        np.testing.assert_array_equal(
            np.asarray(a.astype(jnp.float32)), np.asarray(b.astype(jnp.float32))
        )


def _write_word_tokenizer(path):
    """A word-level tokenizer.json whose post-processor adds BOS, as Llama's does (transformers 5
    ignores `add_bos_token` beside a tokenizer.json), and a Llama-style tokenizer_config.json."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    tok = Tokenizer(
        models.WordLevel(
            {"<unk>": 0, "<s>": 1, "</s>": 2, "hello": 3, "world": 4}, unk_token="<unk>"
        )
    )
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.add_special_tokens(["<unk>", "<s>", "</s>"])
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", 1)]
    )
    tok.save(os.path.join(path, "tokenizer.json"))
    with open(os.path.join(path, "tokenizer_config.json"), "w") as f:
        json.dump({"bos_token": "<s>", "eos_token": {"content": "</s>"}, "add_bos_token": True}, f)


def test_convert_command_line_errors(tmp_path):
    run = subprocess.run(
        [sys.executable, "-m", "ppl_jax.convert", f"--hf_dir={tmp_path}", f"--out={tmp_path}/o"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 2
    assert run.stderr.startswith("ppl-jax: error: --hf_dir=") and "Traceback" not in run.stderr
    run = subprocess.run(
        [sys.executable, "-m", "ppl_jax.convert", "--dtype=float8"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 2 and run.stderr.startswith("ppl-jax: error: bad flag")
