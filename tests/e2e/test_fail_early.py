"""Bad input stops a run before the work, never after: the output folder before the corpus, every
check that needs no weights before the weights; and what scoring produces is always written."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from ppl_jax.checkpoints import Checkpoint
from ppl_jax.config.defaults import get_config
from ppl_jax.config.settings import from_config
from ppl_jax.errors import ConfigError, DataError
from ppl_jax.evaluation.run import evaluate
from ppl_jax.evaluation.spec import RunSpec

import helpers


def cli(*flags: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    env["XLA_FLAGS"] = helpers.xla_flags(8)
    return subprocess.run(
        [sys.executable, "-m", "ppl_jax", "--config.output.progress=false", *flags],
        env=env,
        cwd=helpers.REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )


def settings(checkpoint: str, corpus: str, **overrides) -> RunSpec:
    c = get_config()
    c.checkpoint.dir = checkpoint
    c.data.path = corpus
    c.eval.seq_len = 32
    c.output.progress = False
    for key, value in overrides.items():
        section, name = key.split("__")
        setattr(getattr(c, section), name, value)
    return from_config(c)


def test_an_unusable_output_folder_is_reported_before_the_corpus_is_read(tmp_path):
    blocker = tmp_path / "out"
    blocker.write_text("a file in the way")
    proc = cli(f"--config.output.dir={blocker}", f"--config.data.path={tmp_path}/missing.txt")
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    # The output folder is named, not the missing corpus: it was checked first.
    assert f"output.dir={str(blocker)!r} is a file" in proc.stderr
    assert "missing.txt" not in proc.stderr
    assert not list(tmp_path.glob("**/*.tmp"))


def test_few_words_overflow_to_a_noted_null_in_strict_json(tmp_path):
    """Text with few whitespace-separated words: word perplexity overflows float64. The run still
    writes strict JSON, with null and the reason, and the summary says so."""
    corpus = tmp_path / "cjk.txt"
    corpus.write_text("戦場のヴァルキュリア" * 150, encoding="utf-8")  # one word, 4,500 bytes
    out = tmp_path / "out"
    proc = cli(
        f"--config.output.dir={out}",
        f"--config.data.path={corpus}",
        "--config.eval.seq_len=128",
        "--config.output.gzip_baseline=false",
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    text = (out / "results.json").read_text()
    results = json.loads(text, parse_constant=lambda c: pytest.fail(f"non-JSON {c}"))
    assert results["num_words"] == 1
    assert results["word_perplexity"] is None
    assert "overflow" in results["notes"]["word_perplexity"]
    assert results["perplexity"] > 1  # the other metrics are there
    assert "word perplexity  inf (overflow" in proc.stdout


def test_a_whitespace_only_corpus_is_an_error(tiny_checkpoint, tmp_path):
    corpus = tmp_path / "blank.txt"
    corpus.write_text(" \n\t\n   \n", encoding="utf-8")
    with pytest.raises(DataError, match="holds only whitespace"):
        evaluate(settings(tiny_checkpoint, str(corpus)))


def test_batch_size_and_mesh_are_checked_before_the_weights(tiny_checkpoint, tmp_path, monkeypatch):
    corpus = tmp_path / "text.txt"
    corpus.write_text("some text " * 50, encoding="utf-8")

    def no_weights(*args, **kwargs):
        raise AssertionError("the weights were read before a check that needs none")

    monkeypatch.setattr(Checkpoint, "restore", no_weights)
    with pytest.raises(ConfigError, match="eval.batch_size=6 is not divisible"):
        evaluate(settings(tiny_checkpoint, str(corpus), eval__batch_size=6))
    with pytest.raises(ConfigError, match="mesh"):
        evaluate(settings(tiny_checkpoint, str(corpus), mesh__data=3))


SP_MODEL = os.path.join(helpers.REPO, "tests", "golden", "tokenizers", "sp_bpe.model")


def test_a_foreign_tokenizer_is_refused_before_the_weights(tmp_path, monkeypatch):
    """A 400-id SentencePiece model on a 1,024-id model: its ids fit the embedding table, but it is
    not the model's tokenizer. Refused before the weights; allowed, it is recorded."""
    import dataclasses

    from ppl_jax.evaluation import summary
    from ppl_jax.outputs import console
    from ppl_jax.tokenizer import SentencePieceTokenizer

    assert SentencePieceTokenizer.from_file(SP_MODEL).vocab_size == 400
    ckpt = str(tmp_path / "ckpt")
    helpers.save_random_checkpoint(ckpt, dataclasses.replace(helpers.TINY, vocab_size=1024))
    corpus = tmp_path / "text.txt"
    corpus.write_text("the quick brown fox jumps over the lazy dog " * 20, encoding="utf-8")
    restore = Checkpoint.restore

    def no_weights(*args, **kwargs):
        raise AssertionError("the weights were read before a check that needs none")

    monkeypatch.setattr(Checkpoint, "restore", no_weights)
    with pytest.raises(ConfigError) as info:
        evaluate(settings(ckpt, str(corpus), data__tokenizer=SP_MODEL))
    assert "has 400 ids but the model's vocabulary has 1024" in str(info.value)
    assert "data.allow_tokenizer_mismatch=true" in str(info.value)

    monkeypatch.setattr(Checkpoint, "restore", restore)
    c = get_config()
    c.checkpoint.dir, c.data.path, c.data.tokenizer = ckpt, str(corpus), SP_MODEL
    c.data.allow_tokenizer_mismatch, c.eval.seq_len, c.output.progress = True, 32, False
    s = from_config(c)
    results = summary.results_dict(evaluate(s), c)
    assert results["tokenizer_source"] == f"data.tokenizer={SP_MODEL}"
    assert "scored anyway" in results["notes"]["tokenizer"]
    table = console.summary_table(results)
    assert "not the checkpoint's own" in table and "scored anyway" in table
