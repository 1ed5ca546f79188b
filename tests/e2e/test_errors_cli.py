"""The command line on bad input, end to end: one paragraph on stderr, status 2, no traceback,
no results written. Each case runs `python -m ppl_jax` in a subprocess on 8 fake CPU devices."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import optax
import pytest

from ppl_jax.checkpoints.formats import orbax as checkpoint

from helpers import GOLDEN, TINY, random_params, xla_flags

TMP_SUFFIX = ".orbax-checkpoint-tmp-1700000000"  # an interrupted Orbax save (local filesystem)
CORPUS = "def f(x):\n    return x + 1\n\nprint(f(41))\n"


def run_cli(args: list[str], cwd) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env["JAX_PLATFORMS"] = "cpu"
    env["XLA_FLAGS"] = xla_flags(8)
    return subprocess.run(
        [sys.executable, "-m", "ppl_jax", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("corpus") / "good.py"
    path.write_text(CORPUS, encoding="utf-8")
    return str(path)


@pytest.fixture(scope="module")
def checkpoint_without_a_weight(tmp_path_factory) -> str:
    """TINY's metadata, but a params tree that lacks `layers/0/mlp/up`."""
    path = str(tmp_path_factory.mktemp("ckpt") / "partial")
    params = random_params(TINY)
    del params["layers"]["0"]["mlp"]["up"]
    checkpoint.save_train_state(
        path,
        7,
        {"step": 7, "params": params, "opt_state": optax.adamw(1e-3).init(params)},
        {"model": TINY.to_dict(), "tokenizer": {"type": "byte"}},
    )
    return path


def base_args(ckpt: str, data: str, out: str) -> dict[str, str]:
    return {
        "checkpoint.dir": ckpt,
        "data.path": data,
        "output.dir": out,
        "output.progress": "False",
        "output.gzip_baseline": "False",
        "eval.seq_len": "16",
        "eval.stride": "16",
        "eval.batch_size": "8",
    }


def as_flags(settings: dict[str, str]) -> list[str]:
    return [f"--config.{k}={v}" for k, v in settings.items()]


def test_good_input_succeeds(tiny_checkpoint, corpus, tmp_path):
    """The control: the base arguments of the error cases below do work."""
    out = tmp_path / "out"
    r = run_cli(as_flags(base_args(tiny_checkpoint, corpus, str(out))), tmp_path)
    assert r.returncode == 0, r.stderr
    results = json.loads((out / "results.json").read_text())
    assert results["checkpoint"]["step"] == 5
    assert results["num_tokens"] == len(CORPUS.encode()) - 1
    assert results["num_bytes"] == len(CORPUS.encode()) - 1
    assert results["mesh"] == {"data": 8, "model": 1}


def bad_files(tmp_path) -> dict[str, str]:
    files = {
        "empty": tmp_path / "empty.txt",
        "latin1": tmp_path / "latin1.txt",
        "missing": tmp_path / "missing.txt",
    }
    files["empty"].write_bytes(b"")
    files["latin1"].write_bytes("ok\nna\u00efve\n".encode("latin-1"))
    files["json"] = tmp_path / "val.json"
    files["json"].write_text('{"text": "a document"}\n')
    files["surrogate"] = tmp_path / "val.jsonl"
    files["surrogate"].write_text('{"text": "a \\udc80 b"}\n')
    files["tokens"] = tmp_path / "wiki.test.tokens"
    files["tokens"].write_text(" = Title = \n \n Some <unk> words . \n")
    files["a_file"] = tmp_path / "a_file"
    files["a_file"].write_text("not a folder")
    # A Mamba2 config.json whose scan chunk is 0 (no weights: the config is refused first).
    files["chunk0"] = tmp_path / "mamba2"
    files["chunk0"].mkdir()
    with open(os.path.join(GOLDEN, "families", "mamba2", "config.json")) as f:
        (files["chunk0"] / "config.json").write_text(json.dumps({**json.load(f), "chunk_size": 0}))
    # A levanter run whose step folder is a link to a copy outside it.
    levanter = os.path.join(GOLDEN, "trainers", "levanter", "llama_scanned")
    files["levanter_arch"] = os.path.join(levanter, "description.json")
    files["levanter"] = tmp_path / "levanter"
    shutil.copytree(os.path.join(levanter, "run"), files["levanter"])
    shutil.move(files["levanter"] / "step-2", tmp_path / "step-2")
    os.symlink(tmp_path / "step-2", files["levanter"] / "step-2")
    # Mapping files: a FIFO no one writes to, and YAML with an alias.
    files["fifo"] = tmp_path / "map.fifo"
    os.mkfifo(files["fifo"])
    files["alias"] = tmp_path / "alias.yaml"
    files["alias"].write_text("a: &a [{from: x, to: y}]\nrules: *a\n")
    # A sharded index naming a shard that does not hold the weight.
    files["shards"] = tmp_path / "shards"
    shutil.copytree(os.path.join(GOLDEN, "hf", "llama"), files["shards"])
    with open(files["shards"] / "model.safetensors.index.json") as f:
        index = json.load(f)
    held = index["weight_map"]["model.norm.weight"]
    files["wrong_shard"] = next(f for f in sorted(set(index["weight_map"].values())) if f != held)
    index["weight_map"]["model.norm.weight"] = files["wrong_shard"]
    (files["shards"] / "model.safetensors.index.json").write_text(json.dumps(index))
    return {k: str(v) for k, v in files.items()}


# (overrides of base_args, what the error line must contain), each a function of
# (checkpoints and corpus, bad files).
CASES = [
    pytest.param(
        lambda c, f: {"data.path": f["missing"]},
        lambda c, f: [f"data.path: no such file '{f['missing']}'"],
        id="missing_data_path",
    ),
    pytest.param(
        lambda c, f: {"data.path": f["empty"]},
        lambda c, f: [f"data.path='{f['empty']}' holds no text to score", "corpus is empty"],
        id="empty_corpus",
    ),
    pytest.param(
        lambda c, f: {"data.path": f["latin1"]},
        lambda c, f: [
            f"{f['latin1']}: not UTF-8 text at byte offset 5 (byte 0xef)",
            "--config.data.errors=replace",
        ],
        id="not_utf8",
    ),
    pytest.param(
        lambda c, f: {"data.tokenizer": f["bpe"]},
        lambda c, f: [
            "the tokenizer 'bpe.json' has 512 ids but the model's vocabulary has 256 (smaller)",
            "data.allow_tokenizer_mismatch=true",
        ],
        id="tokenizer_vocabulary_mismatch",
    ),
    pytest.param(
        lambda c, f: {"data.tokenizer": f["bpe"], "data.allow_tokenizer_mismatch": "true"},
        lambda c, f: [
            f"document 0 ({c['corpus']})",
            "outside the model's vocabulary of 256",
            "bpe.json, 512 ids",
        ],
        id="token_id_beyond_vocabulary",
    ),
    pytest.param(
        lambda c, f: {"checkpoint.dir": c["unfinalized"]},
        lambda c, f: [f"checkpoint.dir '{c['unfinalized']}' holds no finalized checkpoint step"],
        id="no_finalized_step",
    ),
    pytest.param(
        lambda c, f: {"checkpoint.step": "4"},
        lambda c, f: [
            f"checkpoint.step=4 is not in '{c['tiny']}'",
            "its finalized steps are [3, 5]",
        ],
        id="missing_step",
    ),
    pytest.param(
        lambda c, f: {"checkpoint.dir": c["partial"]},
        lambda c, f: ["'layers/0/mlp/up' is missing", f"step 7 of '{c['partial']}'"],
        id="missing_weight",
    ),
    pytest.param(
        lambda c, f: {"eval.seq_len": "129"},
        lambda c, f: [
            "eval.seq_len=129 is beyond the model's 128 positions",
            "--config.eval.seq_len=128",
        ],
        id="seq_len_beyond_positions",
    ),
    pytest.param(
        lambda c, f: {"eval.stride": "0"},
        lambda c, f: ["eval.stride=0 is outside 1..eval.seq_len (16)"],
        id="stride_zero",
    ),
    pytest.param(
        lambda c, f: {"eval.stride": "17"},
        lambda c, f: ["eval.stride=17 is outside 1..eval.seq_len (16)"],
        id="stride_beyond_seq_len",
    ),
    pytest.param(
        lambda c, f: {"data.cache_dir": f["a_file"]},
        lambda c, f: [f"data.cache_dir='{f['a_file']}': the token cache could not be written"],
        id="cache_dir_is_a_file",
    ),
    pytest.param(
        lambda c, f: {"data.cache_dir": f["a_file"] + "/cache"},
        lambda c, f: ["/cache': the token cache could not be written there (Not a directory)"],
        id="cache_dir_below_a_file",
    ),
    pytest.param(
        lambda c, f: {"data.path": f["json"]},
        lambda c, f: [f"data.path='{f['json']}' looks like a JSON document", "data.format=jsonl"],
        id="json_path_read_as_text",
    ),
    pytest.param(
        lambda c, f: {"data.path": f["surrogate"]},
        lambda c, f: [f"{f['surrogate']}:1: the field 'text' holds a lone surrogate (\\udc80"],
        id="lone_surrogate",
    ),
    pytest.param(
        lambda c, f: {
            "data.path": f["tokens"],
            "data.preparation": "lm_eval_wikitext",
            "eval.protocol": "lm_eval_rolling",
        },
        lambda c, f: [f"{f['tokens']}: holds '<unk>'", "wiki.test.raw"],
        id="tokenized_wikitext",
    ),
    pytest.param(
        lambda c, f: {"checkpoint.dir": f["chunk0"], "data.tokenizer": "byte"},
        lambda c, f: [f"{f['chunk0']}/config.json: chunk_size=0 is not a whole number from 1 to"],
        id="config_chunk_zero",
    ),
    pytest.param(
        lambda c, f: {
            "checkpoint.dir": f["levanter"],
            "checkpoint.architecture": f["levanter_arch"],
            "checkpoint.step": "2",
            "data.tokenizer": "byte",
            "data.allow_tokenizer_mismatch": "true",
        },
        lambda c, f: [
            f"'{f['levanter']}/step-2' in the checkpoint '{f['levanter']}' is a link to",
            "outside the checkpoint folder; ppl_jax reads no file outside it",
        ],
        id="levanter_step_linked_out",
    ),
    pytest.param(
        lambda c, f: {"checkpoint.mapping": f["fifo"]},
        lambda c, f: [f"checkpoint.mapping: cannot read '{f['fifo']}' (not a regular file)"],
        id="mapping_fifo",
    ),
    pytest.param(
        lambda c, f: {"checkpoint.mapping": f["alias"]},
        lambda c, f: [f"checkpoint.mapping '{f['alias']}' uses the YAML alias *a at line 2"],
        id="mapping_yaml_alias",
    ),
    pytest.param(
        lambda c, f: {
            "checkpoint.dir": f["shards"],
            "data.tokenizer": "byte",
            "data.allow_tokenizer_mismatch": "true",
        },
        lambda c, f: [
            f"names the shard '{f['wrong_shard']}' for the weight 'model.norm.weight'",
            "which that shard does not hold (it is in",
        ],
        id="index_names_the_wrong_shard",
    ),
    pytest.param(
        lambda c, f: {
            "eval.protocol": "whole_documents",
            "eval.seq_len": "64",
            "eval.short_context": "8",
            "eval.short_targets": "8",
            "longppl.evaluator.dir": c["tiny"],
            "longppl.evaluator.step": "999",
        },
        lambda c, f: [
            f"longppl.evaluator.step=999 is not in '{c['tiny']}'",
            "Set longppl.evaluator.step to one of them",
        ],
        id="longppl_evaluator_step",
    ),
    pytest.param(
        lambda c, f: {"mesh.data": "16"},
        lambda c, f: ["the mesh data=16 x model=1 needs 16 devices, but only 8 are present"],
        id="mesh_beyond_devices",
    ),
    pytest.param(
        lambda c, f: {"model.attention": "cudnn", "mesh.context": "2"},
        lambda c, f: [
            "model.attention=cudnn needs an NVIDIA GPU with cuDNN, and this run's devices (cpu)",
            "set model.attention=auto",
        ],
        id="cudnn_on_cpu",
    ),
]


# The default tiers run one case of each kind (data, tokenizer, checkpoint, window, mesh); the slow
# tier runs them all.
DEFAULT_CASES = {
    "missing_data_path",
    "not_utf8",
    "token_id_beyond_vocabulary",
    "missing_weight",
    "seq_len_beyond_positions",
    "mesh_beyond_devices",
    "config_chunk_zero",
    "cudnn_on_cpu",
}
CASES = [
    c if c.id in DEFAULT_CASES else pytest.param(*c.values, id=c.id, marks=pytest.mark.slow)
    for c in CASES
]


@pytest.mark.parametrize(("overrides", "named"), CASES)
def test_bad_input_is_one_clear_error(
    overrides, named, tiny_checkpoint, corpus, checkpoint_without_a_weight, bpe_tokenizer, tmp_path
):
    unfinalized = tmp_path / "interrupted"
    unfinalized.mkdir()
    shutil.copytree(os.path.join(tiny_checkpoint, "5"), unfinalized / f"5{TMP_SUFFIX}")
    ckpts = {
        "tiny": tiny_checkpoint,
        "partial": checkpoint_without_a_weight,
        "unfinalized": str(unfinalized),
        "corpus": corpus,
    }
    files = bad_files(tmp_path) | {"bpe": bpe_tokenizer}  # a byte-level BPE of 512 ids
    out = tmp_path / "out"
    settings = base_args(tiny_checkpoint, corpus, str(out)) | overrides(ckpts, files)

    r = run_cli(as_flags(settings), tmp_path)

    assert r.returncode == 2, (r.returncode, r.stderr[-2000:])
    assert "Traceback" not in r.stderr, r.stderr[-2000:]
    error_lines = [line for line in r.stderr.splitlines() if line.startswith("ppl-jax: error: ")]
    assert len(error_lines) == 1, r.stderr[-2000:]
    for part in named(ckpts, files):
        assert part in error_lines[0], (part, error_lines[0])
    assert r.stdout == ""
    assert not (out / "results.json").exists()
    assert not list(tmp_path.rglob("results.json"))


def test_a_bad_environment_value_is_one_sentence(tiny_checkpoint, corpus, tmp_path, monkeypatch):
    monkeypatch.setenv("PPL_JAX_NUM_PROCESSES", "two")
    r = run_cli(as_flags(base_args(tiny_checkpoint, corpus, str(tmp_path / "out"))), tmp_path)
    assert r.returncode == 2, r.stderr[-2000:]
    assert r.stderr.strip().splitlines() == [
        "ppl-jax: error: PPL_JAX_NUM_PROCESSES='two' is not a number of processes (at least 1); "
        "unset it or fix it."
    ]
