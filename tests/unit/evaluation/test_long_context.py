"""The long-context measures of whole_documents end to end (`ppl_jax.evaluation.passes.long_context`):
every NLL with the full and the short context, the position buckets, the context gains and
LongPPL, against an independent NumPy float64 forward pass of the tiny model
(`helpers.reference_token_nll`), document by document."""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pyarrow.parquet as pq
import pytest
from test_diagnostics import host_params

from ppl_jax.config.defaults import get_config
from ppl_jax.config.settings import from_config
from ppl_jax.errors import CheckpointError, ConfigError
from ppl_jax.evaluation.run import evaluate
from ppl_jax.outputs.folder import OutputDir

import helpers

LENGTHS = (10, 41, 128, 90, 3, 77)  # bytes = tokens (byte tokenizer, no BOS); 128 fills a window
C, S = 16, 8


@pytest.fixture(scope="module")
def texts() -> list[str]:
    text = helpers.stdlib_text(sum(LENGTHS) + 100).encode("ascii", "replace").decode()
    out, at = [], 0
    for n in LENGTHS:
        out.append(text[at : at + n])
        at += n
    return out


def settings(checkpoint: str, path: str, out, **overrides):
    c = get_config()
    c.checkpoint.dir = checkpoint
    c.data.path = path
    c.eval.protocol = "whole_documents"
    c.eval.seq_len = 127
    c.eval.batch_size = 8
    c.eval.short_context = C
    c.eval.short_targets = S
    c.output.dir = str(out)
    c.output.tokens = True
    c.output.position_curve = True
    c.output.progress = False
    c.output.gzip_baseline = False
    c.metrics.bootstrap_samples = 200
    for key, value in overrides.items():
        *sections, name = key.split("__")
        node = c
        for section in sections:
            node = getattr(node, section)
        setattr(node, name, value)
    return from_config(c)


def run(s):
    out = OutputDir.open(s.output_dir)
    try:
        return evaluate(s, out=out)
    finally:
        out.close()


def numpy_nlls(params, texts) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Per document, float64 NLL of tokens 1..n-1 with the full context, and with the short
    context (the LongPPL reference's windows: targets [s + C, s + C + S) from [s, s + C + S))
    where the position is >= C (NaN below)."""
    full, short = [], []
    for t in texts:
        ids = np.frombuffer(t.encode(), np.uint8).astype(np.int32)
        f = helpers.reference_token_nll(params, helpers.TINY, ids) if ids.size > 1 else []
        s = np.full(max(ids.size - 1, 0), np.nan)
        for a in range(C, ids.size, S):
            window = ids[a - C : a + S]
            s[a - 1 : a - 1 + window.size - C] = helpers.reference_token_nll(
                params, helpers.TINY, window
            )[C - 1 :]
        full.append(np.asarray(f, np.float64))
        short.append(s)
    return full, short


@pytest.fixture(scope="module")
def scored(tiny_checkpoint, texts, tmp_path_factory):
    folder = tmp_path_factory.mktemp("long")
    path = helpers.corpus_files(folder, texts)
    params = host_params(tiny_checkpoint)
    full, short = numpy_nlls(params, texts)
    diff = np.concatenate([s - f for s, f in zip(short, full, strict=True)])
    diff = np.sort(diff[~np.isnan(diff)])
    # alpha in the widest gap of the top decile of differences: a few key tokens, far from it
    top = diff[int(0.9 * diff.size) :]
    j = int(np.argmax(np.diff(top)))
    alpha = float((top[j] + top[j + 1]) / 2)
    s = settings(tiny_checkpoint, path, folder / "out", longppl__alpha=alpha, longppl__beta=-100.0)
    return run(s), full, short, alpha


def test_every_nll_equals_numpy_with_both_contexts(scored):
    ev, full, short, _ = scored
    path = ev.diagnostics["tokens_file"]
    assert pq.read_metadata(path).num_rows == ev.sums.num_tokens == sum(n - 1 for n in LENGTHS)
    for d, (f, s) in enumerate(zip(full, short, strict=True)):
        rows = helpers.token_rows(path, d)
        assert rows.offset.tolist() == list(range(1, LENGTHS[d]))  # the first: context only
        assert rows.position.tolist() == list(range(1, LENGTHS[d]))
        np.testing.assert_allclose(rows.nll, f, rtol=1e-5, atol=1e-5)
        want_short = np.where(np.isnan(s), f, s)  # below C: the full NLL, gain 0
        np.testing.assert_allclose(rows.nll_short, want_short, rtol=1e-5, atol=1e-5)
        assert (rows.context_gain[np.isnan(s)] == 0).all()
        np.testing.assert_allclose(rows.context_gain, want_short - f, atol=2e-5)


def test_position_buckets_add_up_to_the_run(scored):
    ev, full, *_ = scored
    curve = ev.diagnostics["position_curve"]
    assert curve["num_positions"] == 128 and curve["bucketing"] == "log"
    buckets = curve["buckets"]
    assert sum(b["num_tokens"] for b in buckets) == ev.sums.num_tokens
    # the buckets add up to the run's NLL within float64 rounding, and equal NumPy's
    assert math.fsum(b["nll_sum"] for b in buckets) == pytest.approx(ev.sums.nll_sum, rel=1e-13)
    positions = np.concatenate([np.arange(1, n) for n in LENGTHS])
    nll = np.concatenate(full)
    for b in buckets:
        mine = (positions >= b["first"]) & (positions <= b["last"])
        assert b["nll_sum"] == pytest.approx(nll[mine].sum(), rel=1e-5)
        assert b["documents"] == sum(n - 1 >= b["first"] for n in LENGTHS)
    # bands where two documents or more reach, none past the second longest
    assert all((b["perplexity_interval"] is None) == (b["documents"] < 2) for b in buckets)
    assert buckets[-1]["perplexity_interval"] is None and buckets[-1]["last"] == 127
    with open(
        f"{ev.plan and ev.diagnostics['tokens_file'].rsplit('/', 1)[0]}/position_curve.json"
    ) as f:
        assert json.load(f)["buckets"] == json.loads(json.dumps(buckets))


def test_context_gain_and_longppl_equal_numpy(scored):
    ev, full, short, alpha = scored
    found = ev.diagnostics["long_context"]
    f, s = np.concatenate(full), np.concatenate(short)
    again = ~np.isnan(s)
    gain = found["context_gain"]
    assert gain["num_tokens"] == int(again.sum()) == sum(max(0, n - C) for n in LENGTHS)
    assert gain["gain_sum"] == pytest.approx((s[again] - f[again]).sum(), abs=1e-4)
    assert gain["gain_sum"] == pytest.approx(
        gain["short_nll_sum"] - gain["long_nll_sum"], rel=1e-12
    )
    keys = again & (s - f > alpha)
    lp = found["longppl"]
    assert lp["num_key_tokens"] == int(keys.sum()) >= 3
    assert lp["longppl"] == pytest.approx(math.exp(f[keys].mean()), rel=1e-5)
    assert lp["evaluator"] == "the scored model" and lp["alpha"] == alpha
    # The gains by bucket: none below C; they add up to the total.
    buckets = ev.diagnostics["position_curve"]["buckets"]
    assert sum(b["context_gain"]["num_tokens"] for b in buckets) == gain["num_tokens"]
    assert all(b["context_gain"]["num_tokens"] == 0 for b in buckets if b["last"] < C)
    assert all(b["context_gain"]["num_tokens"] > 0 for b in buckets if b["first"] >= C)


def test_what_the_measures_need_is_checked_first(tiny_checkpoint, tmp_path):
    path = helpers.corpus_files(tmp_path, ["some text here"])
    with pytest.raises(ConfigError, match="needs a protocol that scores documents whole"):
        settings(tiny_checkpoint, path, tmp_path / "o", eval__protocol="sliding")
    with pytest.raises(ConfigError, match="between 1 and eval.seq_len - 1"):
        settings(tiny_checkpoint, path, tmp_path / "o", eval__short_context=127)
    with pytest.raises(ConfigError, match="set eval.short_context too"):
        settings(
            tiny_checkpoint, path, tmp_path / "o", eval__short_context=0,
            longppl__evaluator__dir=tiny_checkpoint,
        )  # fmt: skip
    s = settings(tiny_checkpoint, path, tmp_path / "o", eval__short_targets=120)
    with pytest.raises(ConfigError, match="beyond the model's 128 positions"):
        run(s)


def test_the_evaluators_settings_are_named_as_its_own(tiny_checkpoint, tmp_path):
    """A sentence about LongPPL's evaluator (or the reference model) names its keys
    (`longppl.evaluator.step`), not the scored model's (`checkpoint.step`)."""
    path = helpers.corpus_files(tmp_path, ["some text here"])
    s = settings(tiny_checkpoint, path, tmp_path / "o", longppl__evaluator__dir=tiny_checkpoint,
                 longppl__evaluator__step="999")  # fmt: skip
    with pytest.raises(CheckpointError) as e:
        run(s)
    assert str(e.value).startswith("longppl.evaluator.step=999 is not in "), str(e.value)
    assert "Set longppl.evaluator.step to one of them" in str(e.value)
    assert "checkpoint.step" not in str(e.value).replace("evaluator.step", "")
    s = settings(tiny_checkpoint, path, tmp_path / "o", reference__checkpoint__dir=tiny_checkpoint,
                 reference__checkpoint__step="999", eval__short_context=0)  # fmt: skip
    with pytest.raises(CheckpointError, match=r"^reference\.checkpoint\.step=999 is not in "):
        run(s)


def test_the_evaluators_positions_are_counted_in_its_own_tokens(
    tiny_checkpoint, bpe_tokenizer, tmp_path, monkeypatch
):
    """The scored model reads up to 127 bytes at once; an evaluator of 64 positions whose BPE
    reads a document of 127 bytes in fewer tokens finds its key tokens (it was refused for
    eval.seq_len=127 before), in rows as wide as its own longest window (they were 128 wide); a
    document longer than 64 of its tokens is refused, naming them."""
    from ppl_jax import testing
    from ppl_jax.evaluation.passes import short_context
    from ppl_jax.tokenizer import load_tokenizer

    tok = load_tokenizer(bpe_tokenizer)
    evaluator = str(tmp_path / "evaluator")
    cfg = dataclasses.replace(helpers.TINY, vocab_size=tok.vocab_size, max_positions=64)
    testing.save_random_checkpoint(evaluator, cfg, tokenizer=tok.describe())
    text = helpers.stdlib_text(3000).encode("ascii", "replace").decode()
    fits, longer = text[600:727], text[:127]  # prose (about 2 bytes a token), then a header
    assert len(tok.encode([fits])[0]) <= 64 < len(tok.encode([longer])[0])
    s = settings(tiny_checkpoint, helpers.corpus_files(tmp_path, [fits]), tmp_path / "o",
                 longppl__evaluator__dir=evaluator, metrics__bootstrap_samples=0)  # fmt: skip
    widths, score_pass = [], short_context.score_pass

    def seen(model, params, mesh, shardings, windows, *args, **kwargs):
        widths.append((model.vocab_size, windows.seq_len))
        return score_pass(model, params, mesh, shardings, windows, *args, **kwargs)

    monkeypatch.setattr(short_context, "score_pass", seen)
    assert run(s).diagnostics["long_context"]["longppl"]["evaluator"] == evaluator
    full = len(tok.encode([fits])[0]) - 1  # its longest window's inputs (no BOS)
    assert (tok.vocab_size, full) in widths
    assert all(n <= full for v, n in widths if v == tok.vocab_size), widths
    (tmp_path / "b").mkdir()
    s = settings(tiny_checkpoint, helpers.corpus_files(tmp_path / "b", [longer]), tmp_path / "p",
                 longppl__evaluator__dir=evaluator, metrics__bootstrap_samples=0)  # fmt: skip
    with pytest.raises(ConfigError, match=r"has 64 positions, fewer than its longest window \("):
        run(s)
