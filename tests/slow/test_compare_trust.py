"""`ppl-jax compare` trusts no file blindly: runs on other text with the same bytes per unit (a
corpus against its upper-cased copy) are refused by the scored tokens' digest, and a damaged
units.npz is one sentence with exit 2."""

import dataclasses
import hashlib
import subprocess
import sys

import numpy as np
import pytest

from ppl_jax.analysis import compare
from ppl_jax.config.defaults import get_config
from ppl_jax.config.settings import from_config
from ppl_jax.evaluation import summary
from ppl_jax.evaluation.run import evaluate
from ppl_jax.metrics import uncertainty
from ppl_jax.outputs.folder import OutputDir

import helpers

TEXT = "\n".join(f"line {i}: " + "the quick brown fox jumps " * (i % 4 + 1) for i in range(24))


def run(checkpoint, corpus, out, tokenizer, protocol):
    """A run written as the command line writes it: results.json and units.npz in `out`."""
    c = get_config()
    c.checkpoint.dir = checkpoint
    c.data.path = corpus
    c.data.format = "lines"
    c.data.tokenizer = tokenizer
    c.data.allow_tokenizer_mismatch = tokenizer == "byte"  # 256 ids in the model's 512
    c.eval.protocol = protocol
    c.eval.seq_len = 32
    c.eval.stride = 16 if protocol == "sliding" else None
    c.output.dir = out
    c.output.progress = False
    c.output.gzip_baseline = False
    c.metrics.bootstrap_samples = 100
    settings = from_config(c)
    with OutputDir.open(out) as o:
        ev = evaluate(settings, out=o)
        o.write_json("results.json", summary.results_dict(ev, c))
        o.write_bytes("units.npz", uncertainty.units_npz(ev))
        ev.recorder.discard()
    return ev


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("ckpt") / "tiny")
    helpers.save_random_checkpoint(path, dataclasses.replace(helpers.TINY, vocab_size=512), (1,))
    return path


@pytest.fixture(scope="module")
def corpora(tmp_path_factory):
    folder = tmp_path_factory.mktemp("text")
    (folder / "text.txt").write_text(TEXT, encoding="utf-8")
    (folder / "upper.txt").write_text(TEXT.upper(), encoding="utf-8")
    (folder / "copy.txt").write_text(TEXT, encoding="utf-8")
    return folder


@pytest.mark.parametrize(
    "tokenizer, protocol, unit",
    [("bpe", "lm_eval_rolling", "document"), ("byte", "sliding", "window")],
)
def test_other_text_with_the_same_bytes_per_unit_is_refused(
    checkpoint, corpora, bpe_tokenizer, tmp_path, capsys, tokenizer, protocol, unit
):
    tok = bpe_tokenizer if tokenizer == "bpe" else "byte"
    outs, evs = {}, {}
    for name in ("text", "upper") + (("copy",) if unit == "window" else ()):
        outs[name] = str(tmp_path / name)
        evs[name] = run(checkpoint, str(corpora / f"{name}.txt"), outs[name], tok, protocol)
    a, b = (uncertainty.read_npz(f"{outs[n]}/units.npz")[0] for n in ("text", "upper"))
    assert a.kind == unit and np.array_equal(a.bytes, b.bytes)  # byte counts cannot tell
    if unit == "window":
        assert np.array_equal(a.tokens, b.tokens)  # nor can token counts, one byte a token
    assert compare.main([outs["text"], outs["upper"]]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "the scored token ids differ" in err, err
    for name, ev in evs.items():  # the digest of the scored token stream, as int32
        expected = hashlib.sha256(np.asarray(ev.plan.windows.tokens, np.int32).tobytes())
        _, identity = uncertainty.read_npz(f"{outs[name]}/units.npz")
        assert identity["tokens_digest"] == expected.hexdigest()
    # The same text (a copy in another file) compares, and says its text was checked.
    (record,) = compare.compare(outs["text"], outs.get("copy", outs["text"]), 20, 0)
    assert record["text_checked"] and record["bits_per_byte"]["difference"] == 0.0


def write_run(folder, units, identity):
    folder.mkdir()
    (folder / "results.json").write_text("{}")
    (folder / "units.npz").write_bytes(uncertainty.to_npz(units, identity))
    return str(folder)


def test_runs_of_other_tokenizers_are_checked_by_bytes_and_say_so(tmp_path, capsys):
    units = uncertainty.Units("document", np.arange(1.0, 5.0), np.full(4, 3), np.full(4, 9), 1)
    same = {"protocol": {"name": "lm_eval_rolling", "add_bos": False}, "tokenizer": {"t": 1}}
    a = write_run(tmp_path / "a", units, {**same, "tokens_digest": "aa"})
    b = write_run(tmp_path / "b", units, {**same, "tokenizer": {"t": 2}, "tokens_digest": "bb"})
    c = write_run(tmp_path / "c", units, {**same, "tokens_digest": "cc"})
    old = write_run(tmp_path / "old", units, same)  # written before units.npz held a digest
    assert compare.main([a, b, "--samples", "10"]) == 0  # another tokenizer: bytes only
    assert "checked by byte counts only" in capsys.readouterr().out
    assert compare.main([a, old, "--samples", "10"]) == 0
    assert "checked by byte counts only" in capsys.readouterr().out
    assert compare.main([a, c, "--samples", "10"]) == 2  # the same tokenizer, other ids
    assert "digest aa -> cc" in capsys.readouterr().err
    bos = {**same, "protocol": {"name": "lm_eval_rolling", "add_bos": True}}
    assert (
        compare.main([a, write_run(tmp_path / "bos", units, {**bos, "tokens_digest": "dd"})]) == 0
    )
    assert "checked by byte counts only" in capsys.readouterr().out


@pytest.mark.parametrize("keep", [0, 30, 200, 0.5, 0.9])
def test_a_truncated_units_file_is_one_sentence(tmp_path, capsys, keep):
    units = uncertainty.Units(
        "window", np.arange(6.0), np.ones(6, np.int64), np.ones(6, np.int64), 2
    )
    data = uncertainty.to_npz(units, {"protocol": {"name": "sliding"}, "tokens_digest": "ab"})
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "results.json").write_text("{}")
        (tmp_path / name / "units.npz").write_bytes(data)
    cut = keep if isinstance(keep, int) else int(len(data) * keep)
    (tmp_path / "b" / "units.npz").write_bytes(data[:cut])
    assert compare.main([str(tmp_path / "a"), str(tmp_path / "b")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "units.npz is not a readable units file" in err, err
    assert "truncated or damaged" in err
    cmd = [sys.executable, "-m", "ppl_jax", "compare", str(tmp_path / "a"), str(tmp_path / "b")]
    done = subprocess.run(cmd, capture_output=True, text=True)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
