"""The token cache on two real processes (`ppl_jax.plans.token_cache`): each tokenizes half of a
corpus and the run scores as one process does without a cache; a bad share stops both."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys

import pytest
from test_token_cache import corpus

from ppl_jax.plans import protocols

import helpers


def run_two(tmp_path, name, flags):
    port = helpers.free_port()
    cmd = [sys.executable, "-m", "ppl_jax", *flags, "--config.output.progress=false"]
    procs = [
        subprocess.Popen(
            [*cmd, f"--config.output.dir={tmp_path / name}"],
            env=helpers.process_env(i, 2, port),
            cwd=helpers.REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(2)
    ]
    return [(p.wait(timeout=300), p.stderr.read()) for p in procs]


def run_one(tmp_path, name, flags):
    cmd = [sys.executable, "-m", "ppl_jax", *flags, "--config.output.progress=false"]
    proc = subprocess.run(
        [*cmd, f"--config.output.dir={tmp_path / name}"],
        cwd=helpers.REPO,
        capture_output=True,
        text=True,
        env=helpers.process_env(),
    )
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_every_protocol_on_two_processes_with_the_cache_scores_as_one_without(
    tmp_path, bpe_tokenizer
):
    """A suite of the four protocols over one corpus: two processes with a shared cache (each
    tokenizes half of the documents into the token cache for `sliding` and `lm_eval_rolling`;
    process 0 plans the joined text of `hf_strided` and `gptq_chunks` while process 1 waits) give
    the records of one process without a cache."""
    texts = [helpers.stdlib_text(200 + 50 * i)[i * 30 :] for i in range(10)]
    path = corpus(tmp_path, texts)
    entries = ",\n".join(
        f"        config_dict.ConfigDict(dict(name={name!r}, path={path!r}, format='jsonl', "
        f"protocol={name!r}, seq_len=64"
        f"{', long_documents=' + repr('sliding') if p.splits_documents else ''}))"
        for name, p in protocols.PROTOCOLS.items()
    )
    config = tmp_path / "four.py"
    config.write_text(
        "from ml_collections import config_dict\n"
        "from ppl_jax.config.defaults import get_config as _default\n"
        "def get_config():\n"
        "    c = _default()\n"
        f"    c.suite = (\n{entries},\n    )\n"
        "    return c\n"
    )
    ckpt = tmp_path / "ckpt"  # a tiny Llama of the BPE's 512 ids (lm_eval_rolling needs EOS)
    helpers.save_random_checkpoint(str(ckpt), dataclasses.replace(helpers.TINY, vocab_size=512))
    flags = [
        f"--config={config}",
        f"--config.checkpoint.dir={ckpt}",
        f"--config.data.tokenizer={bpe_tokenizer}",
        "--config.eval.seq_len=64",
    ]
    codes = run_two(tmp_path, "two", [*flags, f"--config.data.cache_dir={tmp_path / 'cache'}"])
    assert [c for c, _ in codes] == [0, 0], codes[0][1][-2000:] + codes[1][1][-2000:]
    run_one(tmp_path, "one", flags)

    def records(name):
        lines = (tmp_path / name / "results.jsonl").read_text().splitlines()
        return {r["dataset"]: r["sums"] for r in map(json.loads, lines) if r["kind"] == "dataset"}

    one, two = records("one"), records("two")
    assert sorted(one) == sorted(two) == sorted(protocols.PROTOCOLS)
    for name in one:
        assert {k: v for k, v in one[name].items() if k != "nll_sum"} == {
            k: v for k, v in two[name].items() if k != "nll_sum"
        }, name
        assert two[name]["nll_sum"] == pytest.approx(one[name]["nll_sum"], rel=1e-12), name
    # One token cache (both per-document protocols read the same files with one tokenizer),
    # written in two shares of five documents; a plan per protocol.
    cache = tmp_path / "cache"
    names = os.listdir(cache)
    (entry,) = [n for n in names if n.startswith("tokens-")]
    assert len(names) == 1 + len(protocols.PROTOCOLS)
    parts = json.loads((cache / entry / "parts.json").read_text())["parts"]
    assert parts == ["part-00000-of-00002", "part-00001-of-00002"]
    shares = [json.loads((cache / entry / p / "part.json").read_text())["documents"] for p in parts]
    assert shares == [[0, 5], [5, 10]]


def test_a_bad_share_stops_both_processes(tmp_path, demo_checkpoint):
    path = corpus(tmp_path, ["fine text"] * 3)
    with open(tmp_path / "b.jsonl", "a", encoding="utf-8") as f:
        f.write("{not json\n")
    flags = [
        f"--config.data.path={path}",
        "--config.data.format=jsonl",
        f"--config.data.cache_dir={tmp_path / 'cache'}",
    ]
    (c0, e0), (c1, e1) = run_two(tmp_path, "out", flags)
    assert (c0, c1) == (2, 2), e0[-2000:] + e1[-2000:]
    assert "b.jsonl:3: not valid JSON" in e1
    assert "process 1 could not tokenize its share of the corpus" in e0
