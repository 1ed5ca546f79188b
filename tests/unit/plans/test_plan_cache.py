"""The cache of planned datasets (`data.cache_dir`, `ppl_jax.plans.plan_cache`): the same plan, token for
token, for every protocol; a second run reads and tokenizes nothing and memory-maps the tokens; a
changed file or tokenizer is planned again; the numbers of a run are the same with and without."""

from __future__ import annotations

import dataclasses
import os

import numpy as np
import pytest

from ppl_jax import tokenizer
from ppl_jax.config.defaults import get_config
from ppl_jax.config.settings import from_config
from ppl_jax.data import documents as data
from ppl_jax.evaluation.run import evaluate
from ppl_jax.evaluation.spec import RunSpec
from ppl_jax.outputs.folder import OutputDir
from ppl_jax.plans import plan_cache, planner, protocols

import helpers


def settings(path: str, cache: str, protocol: str, **data_overrides) -> RunSpec:
    c = get_config()
    c.data.path = path
    c.data.cache_dir = cache
    c.eval.protocol = protocol
    c.eval.seq_len = 48
    for k, v in data_overrides.items():
        setattr(c.data, k, v)
    return from_config(c)


def same_plan(a, b) -> None:
    for f in dataclasses.fields(a):
        x, y = getattr(a, f.name), getattr(b, f.name)
        if f.name == "windows":
            for g in dataclasses.fields(x):
                np.testing.assert_array_equal(getattr(x, g.name), getattr(y, g.name))
        elif isinstance(x, np.ndarray) or isinstance(y, np.ndarray):
            np.testing.assert_array_equal(x, y)
        else:
            assert x == y, f.name


@pytest.mark.parametrize("protocol", ["sliding", "hf_strided", "lm_eval_rolling", "gptq_chunks"])
def test_a_cached_plan_is_the_plan_and_reads_nothing(
    tmp_path, bpe_tokenizer, protocol, monkeypatch
):
    path = helpers.corpus_files(tmp_path, [helpers.stdlib_text(1500), helpers.stdlib_text(700)])
    tok = tokenizer.load_tokenizer(bpe_tokenizer, None)
    s = settings(path, str(tmp_path / "cache"), protocol)
    plain = planner.plan(
        s.data, s.protocol, *planner.cut(*planner.read(s.data), s.data, tok), tok, 512
    )
    built, docs, _ = planner.planned(s.data, s.protocol, tok, 512)
    streamed = protocols.get(protocol).stream_plan is not None  # through the token cache
    assert (docs is None) == streamed
    plain = dataclasses.replace(plain, tokens_digest=built.tokens_digest)
    same_plan(built, plain)
    # The second time: no file is read, nothing is tokenized, the tokens are memory-mapped.
    monkeypatch.setattr(data, "read_documents", lambda *a, **k: pytest.fail("read again"))
    monkeypatch.setattr(data, "iter_documents", lambda *a, **k: pytest.fail("read again"))
    for method in ("encode_with_bytes", "encode_flat_with_bytes"):
        monkeypatch.setattr(type(tok), method, lambda *a: pytest.fail("tokenized again"))
    cached, docs, _ = planner.planned(s.data, s.protocol, tok, 512)
    assert docs is None and isinstance(cached.windows.tokens, np.memmap)
    same_plan(cached, plain)
    assert len(os.listdir(tmp_path / "cache")) == (2 if streamed else 1)  # + the token cache


def test_a_changed_file_or_tokenizer_or_setting_is_planned_again(tmp_path, bpe_tokenizer):
    path = helpers.corpus_files(tmp_path, [helpers.stdlib_text(900)])
    cache = str(tmp_path / "cache")
    tok = tokenizer.load_tokenizer(bpe_tokenizer, None)
    s = settings(path, cache, "sliding")
    first = plan_cache.key(s.data, s.protocol, tok, 512)
    planner.planned(s.data, s.protocol, tok, 512)
    assert plan_cache.key(s.data, s.protocol, tok, 512) == first
    assert plan_cache.key(s.data, s.protocol, tokenizer.load_tokenizer("byte", None), 512) != first
    assert plan_cache.key(settings(path, cache, "hf_strided").data, s.protocol, tok, 512) == first
    other = settings(path, cache, "sliding", max_documents=1)
    assert plan_cache.key(other.data, other.protocol, tok, 512) != first
    with open(path, "a", encoding="utf-8") as f:
        f.write("\nmore text")
    changed, _, _ = planner.planned(s.data, s.protocol, tok, 512)
    assert plan_cache.key(s.data, s.protocol, tok, 512) != first
    names = os.listdir(cache)  # plans and token caches, the stale entries too
    assert changed.text_tokens > 0 and len(names) == 4, names


def test_every_plan_field_is_cached():
    plan_cache.fields_checked()


def test_a_run_gives_the_same_numbers_with_and_without_the_cache(tmp_path, tiny_checkpoint):
    path = helpers.corpus_files(tmp_path, [helpers.stdlib_text(1200)])
    results = []
    for i, cache in enumerate(("", str(tmp_path / "cache"), str(tmp_path / "cache"))):
        c = get_config()
        c.checkpoint.dir = tiny_checkpoint
        c.data.path = path
        c.data.cache_dir = cache
        c.eval.seq_len = 32
        c.output.dir = str(tmp_path / f"out{i}")
        c.output.progress = False
        c.metrics.bootstrap_samples = 0
        s = from_config(c)
        out = OutputDir.open(s.output_dir)
        try:
            ev = evaluate(s, out=out)
        finally:
            out.close()
        results.append((ev.sums, ev.gzip_bits_per_byte))
    assert results[0] == results[1] == results[2]
