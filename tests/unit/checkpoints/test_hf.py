"""Hugging Face checkpoints: tiny random transformers models (committed in tests/golden/hf), loaded by
ppl_jax and scored against PyTorch's own log-probabilities (stored beside them by
tests/golden/make_golden.py; tests/reference/test_hf_live.py runs PyTorch live); bad directories;
conversion to Orbax."""

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

from ppl_jax import tokenizer as tokenizer_lib
from ppl_jax.checkpoints.formats import orbax as checkpoint
from ppl_jax.checkpoints.formats import safetensors
from ppl_jax.config.defaults import DEFAULT_RULES
from ppl_jax.errors import CheckpointError, ConfigError
from ppl_jax.models import registry
from ppl_jax.models.decoders.llama import LlamaConfig
from ppl_jax.runtime import mesh as mesh_lib
from ppl_jax.scoring.nll import token_nll

import helpers

GOLDEN_HF = os.path.join(helpers.GOLDEN, "hf")
with open(os.path.join(GOLDEN_HF, "log_probs.json"), encoding="utf-8") as _f:
    GOLDEN = json.load(_f)
FAMILIES = ("llama", "mistral", "qwen2", "gpt2")
LLAMA3_ROPE = helpers.LLAMA3_ROPE


@pytest.fixture(scope="module")
def hf_dirs() -> dict[str, str]:
    """family -> its committed directory (tests/golden/hf; Llama in sharded safetensors)."""
    return {name: os.path.join(GOLDEN_HF, name) for name in FAMILIES}


def golden_tokens() -> np.ndarray:
    return np.asarray(GOLDEN["tokens"])


def _load(path, mesh, dtype=jnp.float32, description=None):
    model = registry.build(description or safetensors.read_description(path), dtype)
    shardings = mesh_lib.param_shardings(
        model.abstract_params, model.logical_axes, mesh, DEFAULT_RULES
    )
    target = jax.tree.map(
        lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
        model.abstract_params,
        shardings,
    )
    return model, safetensors.load_params(path, target), shardings


def _log_probs(model, params, tokens):
    """`[len(tokens) - 1]` float32 log-probabilities (nats) of `tokens[1:]` under ppl_jax."""
    x = jnp.asarray(tokens[None, :-1], jnp.int32)
    positions = jnp.arange(len(tokens) - 1, dtype=jnp.int32)[None]
    out = jax.jit(model.apply)(params, x, positions, jnp.ones_like(x))
    return -np.asarray(token_nll(out, jnp.asarray(tokens[None, 1:], jnp.int32)))[0]


MESH_CASES = [
    ("llama", (8, 1)),
    ("llama", (2, 4)),
    ("mistral", (8, 1)),
    ("qwen2", (8, 1)),
    ("gpt2", (8, 1)),
    ("gpt2", (2, 4)),
]


def check_log_probs(path: str, tokens: np.ndarray, ref: np.ndarray, mesh_shape) -> None:
    """ppl_jax loads `path` onto a mesh of `mesh_shape` with the planned shardings, and its
    log-probabilities of `tokens[1:]` are within 1e-4 of the reference's `ref`."""
    mesh = mesh_lib.make_mesh(*mesh_shape)
    model, params, shardings = _load(path, mesh)
    for leaf, sharding in zip(jax.tree.leaves(params), jax.tree.leaves(shardings), strict=True):
        assert leaf.sharding == sharding and leaf.dtype == jnp.float32
    if mesh_shape == (2, 4):  # heads, vocab and mlp are really split over the model axis
        q = params["layers"]["0"]["attn"]["q"]
        assert q.addressable_shards[0].data.shape[1] == q.shape[1] // 4
    ours = _log_probs(model, params, tokens)
    assert ours.shape == ref.shape == (len(tokens) - 1,)
    assert np.abs(ours - ref).max() < 1e-4


@pytest.mark.parametrize("family,mesh_shape", MESH_CASES)
def test_log_probs_match_pytorch(hf_dirs, family, mesh_shape):
    """Against PyTorch's log-probabilities stored by tests/golden/make_golden.py."""
    ref = np.asarray(GOLDEN["log_probs"][family], np.float32)
    check_log_probs(hf_dirs[family], golden_tokens(), ref, mesh_shape)


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
    real = safetensors._open_slice

    @contextlib.contextmanager
    def counting(file, name):
        with real(file, name) as sl:
            yield _CountingSlice(sl, name, reads)

    monkeypatch.setattr(safetensors, "_open_slice", counting)
    _, params, _ = _load(hf_dirs[family], mesh_lib.make_mesh(2, 4))
    assert sum(size for _, size in reads) == sum(leaf.size for leaf in jax.tree.leaves(params))
    name = (
        "transformer.h.0.attn.c_attn.weight"
        if family == "gpt2"
        else ("model.layers.0.self_attn.q_proj.weight")
    )
    assert {size for n, size in reads if n == name} == {32 * 8}  # one head of 8 at a time


def test_a_restore_reads_config_json_once(hf_dirs, monkeypatch):
    """`load_params` reads config.json once and passes it to what needs it (the description,
    the multimodal text tower, the quantization): it read it 4 times."""
    from ppl_jax.runtime import paths

    reads, real = [], paths.read_json_object

    def counting(where, *args, **kwargs):
        reads.append(where)
        return real(where, *args, **kwargs)

    model = registry.build(safetensors.read_description(hf_dirs["qwen2"]), jnp.float32)
    target = mesh_lib.param_targets(
        model.abstract_params, model.logical_axes, mesh_lib.make_mesh(-1, 1), DEFAULT_RULES
    )[0]
    monkeypatch.setattr(paths, "read_json_object", counting)
    safetensors.load_params(hf_dirs["qwen2"], target)
    assert [os.path.basename(w) for w in reads] == ["config.json"]


def check_descriptions(hf_dirs: dict[str, str]) -> None:
    """What ppl_jax reads from the config.json of each family as transformers saves it."""
    llama = safetensors.read_description(hf_dirs["llama"])
    assert (llama["rope_type"], llama["rope_theta"], llama["rope_original_max_positions"]) == (
        "llama3",
        5000.0,
        64,
    )
    assert (llama["num_kv_heads"], llama["tie_embeddings"], llama["qkv_bias"]) == (2, False, False)
    mistral = safetensors.read_description(hf_dirs["mistral"])
    assert (mistral["sliding_window"], mistral["sliding_layers"]) == (8, [0, 1])
    qwen2 = safetensors.read_description(hf_dirs["qwen2"])
    assert (qwen2["qkv_bias"], qwen2["o_bias"], qwen2["tie_embeddings"]) == (True, False, True)
    assert qwen2["sliding_window"] is None
    gpt2 = safetensors.read_description(hf_dirs["gpt2"])
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


def test_descriptions(hf_dirs):
    check_descriptions(hf_dirs)


CHANGES = [
    ("llama", {"rope_type": "default"}),
    ("mistral", {"sliding_window": None, "sliding_layers": []}),
]


def check_sees_change(path: str, tokens: np.ndarray, ref: np.ndarray, change: dict) -> None:
    """Without the llama3 scaling or the window, the log-probabilities move well beyond 1e-4."""
    model, params, _ = _load(
        path,
        mesh_lib.make_mesh(-1, 1),
        description={**safetensors.read_description(path), **change},
    )
    assert np.abs(_log_probs(model, params, tokens) - ref).max() > 1e-2


@pytest.mark.parametrize("family,change", CHANGES)
def test_the_comparison_sees_rope_scaling_and_sliding_window(hf_dirs, family, change):
    ref = np.asarray(GOLDEN["log_probs"][family], np.float32)
    check_sees_change(hf_dirs[family], golden_tokens(), ref, change)


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
    model = registry.build(old, jnp.float32)
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
        descs.append(safetensors.read_description(str(tmp_path / name)))
    assert descs[0] == descs[1]
    assert descs[0]["rope_factor"] == 8.0 and descs[0]["num_kv_heads"] == 4
    assert descs[0]["head_dim"] == 8 and descs[0]["norm_eps"] == 1e-6  # transformers' defaults


def test_unsupported_model_type(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "bert"}))
    with pytest.raises(CheckpointError, match=r"model_type 'bert' is not supported; ") as e:
        safetensors.read_description(str(tmp_path))
    listed = str(e.value).split("model types ")[1].rstrip(".").split(", ")
    assert listed == sorted(listed)  # sorted, each once: a family added keeps the others
    expected = "gpt2 gpt_neox llama mamba2 mistral mixtral nemotron_h olmo2 olmo3 olmoe phi3 "
    expected += "qwen2 qwen2_moe qwen3 qwen3_5 qwen3_5_text qwen3_moe qwen3_next falcon_h1 deepseek_v3 gpt_oss llama4_text"
    assert set(expected.split()) <= set(listed)
    (tmp_path / "config.json").write_text(
        json.dumps({**BASE_CONFIG, "rope_parameters": {"rope_type": "proportional"}})
    )
    with pytest.raises(
        CheckpointError,
        match=r"config.json: rope_type 'proportional' is not supported "
        r"\(supported: default, linear, llama3, yarn, longrope, dynamic\)",
    ):
        safetensors.read_description(str(tmp_path))
    (tmp_path / "config.json").write_text(json.dumps({**BASE_CONFIG, "hidden_act": "gelu"}))
    with pytest.raises(CheckpointError, match="hidden_act 'gelu' is not supported"):
        safetensors.read_description(str(tmp_path))
    (tmp_path / "config.json").write_text(json.dumps({**BASE_CONFIG, "vocab_size": None}))
    with pytest.raises(CheckpointError, match="config.json: a field has the wrong type"):
        safetensors.read_description(str(tmp_path))
    (tmp_path / "config.json").write_text(
        json.dumps({"model_type": "gpt2", "n_embd": 32, "vocab_size": 9})
    )
    with pytest.raises(
        CheckpointError, match="config.json: the gpt2 config lacks the field 'n_layer'"
    ):
        safetensors.read_description(str(tmp_path))


class _Marker:
    """Unpickling this creates the marker file."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def test_pickled_weights_are_refused_unread(hf_dirs, tmp_path):
    d = tmp_path / "pickled"
    d.mkdir()
    (d / "config.json").write_text(open(os.path.join(hf_dirs["llama"], "config.json")).read())
    marker = tmp_path / "unpickled"
    (d / "pytorch_model.bin").write_bytes(pickle.dumps(_Marker(str(marker))))
    assert safetensors.is_hf_checkpoint(str(d))
    model = registry.build(safetensors.read_description(str(d)), jnp.float32)
    with pytest.raises(
        CheckpointError,
        match=r"only pickled PyTorch weights \(pytorch_model.bin\)"
        r".*safe_serialization=True",
    ):
        safetensors.load_params(str(d), model.abstract_params)
    assert not marker.exists()
    assert not safetensors.is_hf_checkpoint(str(tmp_path))


def test_missing_and_misshapen_weights_are_named(hf_dirs, tmp_path):
    from safetensors.numpy import load_file, save_file

    src = hf_dirs["qwen2"]
    d = tmp_path / "broken"
    d.mkdir()
    weights = load_file(os.path.join(src, "model.safetensors"))
    del weights["model.layers.1.mlp.up_proj.weight"]
    weights["model.layers.0.self_attn.k_proj.bias"] = np.zeros(17, np.float32)
    save_file(weights, str(d / "model.safetensors"))
    (d / "config.json").write_text(open(os.path.join(src, "config.json")).read())
    model = registry.build(safetensors.read_description(str(d)), jnp.float32)
    with pytest.raises(CheckpointError) as e:
        safetensors.load_params(str(d), model.abstract_params)
    assert (
        "the model weights 'layers/1/mlp/up' (stored as 'model.layers.1.mlp.up_proj.weight') are "
        "given by no stored weight" in str(e.value)
    )
    assert (
        "does not fit the stored 'model.layers.0.self_attn.k_proj.bias' of shape [17]: reshape "
        "[-1, 8] cannot hold [17]" in str(e.value)
    )


def check_bfloat16(path: str, bf16_path: str) -> None:
    """Float32 weights load as bfloat16 (rounded as `astype` rounds), and the same weights stored
    in bfloat16 (`bf16_path`) load exactly, into float32."""
    mesh = mesh_lib.make_mesh(-1, 1)
    _, p32, _ = _load(path, mesh)
    _, p16, _ = _load(path, mesh, jnp.bfloat16)
    for a, b in zip(jax.tree.leaves(p32), jax.tree.leaves(p16), strict=True):
        assert b.dtype == jnp.bfloat16
        np.testing.assert_array_equal(np.asarray(a.astype(jnp.bfloat16)), np.asarray(b))
    _, from_bf16, _ = _load(bf16_path, mesh)
    for a, b in zip(jax.tree.leaves(p16), jax.tree.leaves(from_bf16), strict=True):
        assert b.dtype == jnp.float32
        np.testing.assert_array_equal(np.asarray(a, np.float32), np.asarray(b))


def test_bfloat16(hf_dirs, tmp_path):
    """The bfloat16 copy is written by safetensors' own Flax writer (tests/reference/ has
    PyTorch's `save_pretrained` write it)."""
    from safetensors.flax import save_file
    from safetensors.numpy import load_file

    path, bf16 = hf_dirs["gpt2"], tmp_path / "bf16"
    bf16.mkdir()
    shutil.copy(os.path.join(path, "config.json"), bf16)
    weights = load_file(os.path.join(path, "model.safetensors"))
    assert {w.dtype for w in weights.values()} == {np.dtype(np.float32)}
    save_file(
        {k: jnp.asarray(w, jnp.bfloat16) for k, w in weights.items()},
        str(bf16 / "model.safetensors"),
    )
    check_bfloat16(path, str(bf16))


@pytest.mark.parametrize("dtype", ["float32", pytest.param("bfloat16", marks=pytest.mark.slow)])
def test_conversion_to_orbax_restores_the_same_params(hf_dirs, tmp_path, dtype):
    from ppl_jax.cli.convert import convert

    path = str(tmp_path / "llama")
    shutil.copytree(hf_dirs["llama"], path)
    _write_word_tokenizer(path)
    out = str(tmp_path / "orbax")
    convert(path, out, dtype)
    step, meta = checkpoint.read_metadata(out, None)
    assert step == 0 and meta["model"] == safetensors.read_description(path)
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
    """A word-level tokenizer.json whose post-processor prepends BOS `<s>`, as Llama's does, and a
    Llama-style tokenizer_config.json."""
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
        [sys.executable, "-m", "ppl_jax", "convert", f"--hf_dir={tmp_path}", f"--out={tmp_path}/o"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 2
    assert run.stderr.startswith("ppl-jax: error: --hf_dir=") and "Traceback" not in run.stderr
    run = subprocess.run(
        [sys.executable, "-m", "ppl_jax", "convert", "--dtype=float8"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 2 and run.stderr.startswith("ppl-jax: error: bad flag")


# ------------------------------------------------ issue 17/19: trust in config.json and families


def _family_copy(tmp_path, family="qwen3"):
    path = tmp_path / family
    shutil.copytree(os.path.join(helpers.GOLDEN, "families", family), path)
    os.remove(path / "golden.json")
    return path


def test_config_and_tokenizer_linked_out_of_the_directory_are_refused(tmp_path):
    path = _family_copy(tmp_path)
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    os.replace(path / "config.json", outside / "config.json")
    os.symlink(outside / "config.json", path / "config.json")
    with pytest.raises(CheckpointError, match=r"config.json' is a link, which lies outside"):
        safetensors.read_description(str(path))
    os.remove(path / "config.json")
    os.symlink("../elsewhere/config.json", path / "config.json")  # relative, still outside
    with pytest.raises(CheckpointError, match="its config.json is read only from inside it"):
        safetensors.read_description(str(path))
    os.remove(path / "config.json")
    os.replace(outside / "config.json", path / "config.json")
    _write_word_tokenizer(str(outside))
    os.symlink(outside / "tokenizer.json", path / "tokenizer.json")
    with pytest.raises(CheckpointError, match="its tokenizer.json is read only from inside it"):
        safetensors.read_tokenizer(str(path))


def test_a_tokenizer_folder_named_by_data_tokenizer_keeps_its_files_inside(tmp_path):
    """`data.tokenizer=<folder>` (and `ppl_jax.load_tokenizer`) follows the checkpoints' rule:
    a tokenizer file that is a link leading out of the folder is refused, naming the link; a
    link inside the folder is read."""
    import ppl_jax

    folder, outside = tmp_path / "tok", tmp_path / "elsewhere"
    folder.mkdir()
    outside.mkdir()
    _write_word_tokenizer(str(outside))
    os.replace(outside / "tokenizer_config.json", folder / "tokenizer_config.json")
    os.symlink("../elsewhere/tokenizer.json", folder / "tokenizer.json")
    with pytest.raises(ConfigError, match=r"tok/tokenizer.json' is a link to .*elsewhere/"):
        ppl_jax.load_tokenizer(str(folder))
    os.remove(folder / "tokenizer.json")
    os.replace(outside / "tokenizer.json", folder / "real.json")
    os.symlink("real.json", folder / "tokenizer.json")  # a link inside the folder
    assert ppl_jax.load_tokenizer(str(folder)).encode(["hello world"])[0].tolist() == [3, 4]


def test_hub_cache_config_links_into_blobs_are_read(tmp_path):
    """A hub-cache snapshot's files are links into the repository's blobs: allowed."""
    src = _family_copy(tmp_path / "src")
    repo = tmp_path / "hub" / "models--org--tiny"
    snapshot = repo / "snapshots" / ("a" * 40)
    (repo / "blobs").mkdir(parents=True)
    snapshot.mkdir(parents=True)
    for i, name in enumerate(sorted(os.listdir(src))):
        shutil.copy(src / name, repo / "blobs" / f"blob{i}")
        os.symlink(f"../../blobs/blob{i}", snapshot / name)
    assert safetensors.read_description(str(snapshot)) == safetensors.read_description(str(src))


def test_absurd_configs_are_one_short_sentence(tmp_path):
    path = _family_copy(tmp_path)
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, "num_hidden_layers": 1000}))
    with pytest.raises(CheckpointError) as e:
        safetensors.read_description(str(path))
    assert str(e.value).endswith(
        "config.json describes 1000 layers but the safetensors weights hold 2; fix config.json "
        "to describe these weights."
    )
    (path / "config.json").write_text(json.dumps({**config, "vocab_size": 99}))
    with pytest.raises(CheckpointError, match=r"implies an embedding of shape \(99, 32\)"):
        safetensors.read_description(str(path))
    for bad in ({"hidden_size": "x" * 75_695}, {"model_type": "y" * 75_695}):
        (path / "config.json").write_text(json.dumps({**config, **bad}))
        with pytest.raises(CheckpointError) as e:
            safetensors.read_description(str(path))
        # one line, bounded: a hostile value is shortened; the longest is the list of the
        # supported model types (30 of them)
        assert len(str(e.value)) < 700 and "\n" not in str(e.value)


def test_unknown_model_type_lists_every_family(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "mamba"}))
    with pytest.raises(CheckpointError) as e:
        safetensors.read_description(str(tmp_path))
    for family in ("qwen3", "olmo2", "olmo3", "gemma2", "gemma3_text", "gpt_neox", "phi3"):
        assert family in str(e.value)


def test_dynamic_rope_is_default_within_max_positions(tmp_path):
    """transformers' dynamic NTK scaling changes nothing up to max_position_embeddings (and past
    it depends on the longest sequence seen so far): ppl_jax scores windows up to that length
    with the default frequencies, and the model's max_positions stops longer ones."""
    from ppl_jax.models.layers import rope

    descs = []
    for name, rope_parameters in (
        ("dynamic", {"rope_type": "dynamic", "factor": 4.0, "rope_theta": 5000.0}),
        ("default", {"rope_type": "default", "rope_theta": 5000.0}),
    ):
        (tmp_path / name).mkdir()
        config = {**BASE_CONFIG, "rope_parameters": rope_parameters}
        (tmp_path / name / "config.json").write_text(json.dumps(config))
        descs.append(
            registry.build(safetensors.read_description(str(tmp_path / name)), jnp.float32)
        )
    dynamic, default = (LlamaConfig.from_dict(m.description) for m in descs)
    assert dynamic.rope_type == "dynamic" and descs[0].max_positions == 128
    np.testing.assert_array_equal(rope.inv_freq(dynamic), rope.inv_freq(default))


def test_older_multimodal_prefix_language_model_model(tmp_path):
    """Multimodal checkpoints saved before transformers 5 keep the text tower under
    `language_model.model.` (and `language_model.lm_head.`): read as the newer
    `model.language_model.` ones, the vision tower ignored."""
    from safetensors.numpy import load_file, save_file

    src = os.path.join(helpers.GOLDEN, "families", "gemma3_multimodal")
    path = tmp_path / "old"
    path.mkdir()
    shutil.copy(os.path.join(src, "config.json"), path)
    weights = load_file(os.path.join(src, "model.safetensors"))
    renamed = {
        k.replace("model.language_model.", "language_model.model.", 1): v
        for k, v in weights.items()
    }
    assert any(k.startswith("language_model.model.") for k in renamed)
    assert any("vision_tower" in k for k in renamed)
    save_file(renamed, str(path / "model.safetensors"))
    tokens = np.arange(2, 40)
    logs = []
    for p in (src, str(path)):
        model, params, _ = _load(p, mesh_lib.make_mesh(-1, 1))
        logs.append(_log_probs(model, params, tokens))
    np.testing.assert_array_equal(logs[0], logs[1])


# ------------------------------------------------- issue 26: absurd sizes, one sentence in seconds


def _seconds(fn, *args):
    import time

    start = time.monotonic()
    with pytest.raises(CheckpointError) as e:
        fn(*args)
    assert time.monotonic() - start < 10.0
    assert "\n" not in str(e.value) and len(str(e.value)) < 500
    return str(e.value)


def test_a_billion_experts_or_a_zero_sparse_step_is_one_sentence(tmp_path):
    """A `config.json` claiming 10^9 experts was minutes of building per-expert weights (and
    memory); `decoder_sparse_step: 0` was a ZeroDivisionError."""
    path = _family_copy(tmp_path, "qwen3_moe")
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, "num_local_experts": 10**9}))
    assert "num_local_experts=1000000000 is not a whole number from 0 to 16,384" in _seconds(
        safetensors.read_description, str(path)
    )
    (path / "config.json").write_text(json.dumps({**config, "decoder_sparse_step": 0}))
    assert "decoder_sparse_step=0 is not a whole number from 1 to" in _seconds(
        safetensors.read_description, str(path)
    )
    (path / "config.json").write_text(json.dumps({**config, "num_hidden_layers": -3}))
    _seconds(safetensors.read_description, str(path))


def test_absurd_descriptions_are_one_sentence_before_anything_is_built(tmp_path):
    """A description of 1,000 layers and a 2*10^9 vocabulary: its sizes are bounded before
    anything is built, and a layer count that the stored weights contradict is refused before
    the model is built (building 1,000 layers takes minutes)."""
    from ppl_jax import testing
    from ppl_jax.checkpoints import architecture, open_checkpoint

    big = {**testing.TINY.to_dict(), "num_layers": 1000, "vocab_size": 2 * 10**9}
    message = _seconds(registry.build, big, jnp.float32)
    assert "vocab_size=2000000000 is not a size ppl_jax builds" in message
    for bad in ({"num_heads": 0}, {"embed_dim": -4}, {"head_dim": "x"}, {"num_layers": 10**9}):
        _seconds(registry.build, {**testing.TINY.to_dict(), **bad}, jnp.float32)
    ckpt = str(tmp_path / "ckpt")
    testing.save_random_checkpoint(ckpt, steps=(1,))
    (tmp_path / "arch.json").write_text(json.dumps({**testing.TINY.to_dict(), "num_layers": 1000}))
    opened = open_checkpoint(ckpt, architecture=str(tmp_path / "arch.json"))
    message = _seconds(lambda: architecture.resolve(opened).model())
    assert "the architecture describes 1000 layers but the checkpoint stores 2" in message
