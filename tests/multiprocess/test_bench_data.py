"""The data-preparation benchmark (`benchmarks.bench_data`) on tiny corpora: generated corpora of
the requested size, the memory projection, and one end-to-end run (1 and 2 processes, beside
`encode_batch`) whose token counts are checked against the tokenizer called directly."""

import json
import os

import pytest
from tokenizers import Tokenizer

from benchmarks import bench_data
from ppl_jax.data import documents as data

import helpers


@pytest.fixture
def stdlib_source(monkeypatch):
    monkeypatch.delenv("PPL_JAX_TEST_DATA", raising=False)


def test_corpus_has_the_requested_size_in_documents_of_a_few_kb(tmp_path, stdlib_source):
    meta = bench_data.make_corpus(0.3, str(tmp_path))
    docs = data.read_documents(meta["path"], "jsonl")
    sizes = [len(d.text.encode("utf-8")) for d in docs]
    assert meta["source"] == "stdlib"
    assert meta["documents"] == len(docs) and meta["text_bytes"] == sum(sizes)
    assert 300_000 <= meta["text_bytes"] < 300_000 + sizes[-1]  # stops at the size
    assert meta["file_bytes"] == os.path.getsize(meta["path"])
    # Documents of 1-8 KB, but for the tail of a source file (the median is well inside).
    assert 1000 <= sorted(sizes)[len(sizes) // 2] <= 8000 and max(sizes) < 8000 + 2000
    # Written once: a second call reuses the file.
    mtime = os.path.getmtime(meta["path"])
    assert bench_data.make_corpus(0.3, str(tmp_path)) == meta
    assert os.path.getmtime(meta["path"]) == mtime


def test_larger_corpora_repeat_the_source_documents(tmp_path, stdlib_source):
    texts = bench_data.documents(bench_data.source_texts()[1])
    total = sum(len(t.encode("utf-8")) for t in texts)
    meta = bench_data.make_corpus(total * 1.5 / bench_data.MB, str(tmp_path))
    docs = data.read_documents(meta["path"], "jsonl")
    assert [d.text for d in docs[: len(texts)]] == texts
    assert [d.text for d in docs[len(texts) :]] == texts[: len(docs) - len(texts)]


def test_projected_peak_and_time():
    assert bench_data.projected_peak_mb([], 100, 1) is None
    # 200 MB before reading; 700 MB peak at 10 MB (50 MB per MB), 5,700 at 100 MB (55 per MB):
    # the largest size measured sets the growth.
    measured = [(10.0, 200.0, 700.0), (100.0, 200.0, 5700.0)]
    assert bench_data.projected_peak_mb(measured, 1000, 1) == pytest.approx(200 + 55 * 1000)
    assert bench_data.projected_peak_mb(measured, 1000, 2) == pytest.approx(2 * (200 + 55 * 1000))
    assert bench_data.projected_peak_mb(measured[:1], 100, 1) == pytest.approx(200 + 50 * 100)
    assert bench_data.projected_seconds([], 100, 1) is None
    timed = [(10.0, 200.0, 700.0, 4.0), (100.0, 200.0, 5700.0, 50.0)]  # 0.4, then 0.5 s per MB
    assert bench_data.projected_seconds(timed, 1000, 1) == pytest.approx(500.0)
    assert bench_data.projected_seconds(timed, 1000, 2) == pytest.approx(1000.0)


def test_benchmark_end_to_end(tmp_path, stdlib_source):
    tok_file = helpers.bpe_file(str(tmp_path / "bpe.json"))
    # A limit of 10 MB: the first size runs (nothing measured yet), the second is projected
    # from it (its RSS before reading alone is over the limit) and not run.
    result = bench_data.benchmark(
        [0.02, 0.04],
        [1, 2],
        ["sliding"],
        str(tmp_path),
        seq_len=64,
        stride=32,
        max_projected_gb=10 / 1024,
        tokenizer_file=tok_file,
    )
    rows = {(r["size_mb"], r["processes"], r["protocol"], r["mode"]): r for r in result["rows"]}
    peer = rows[0.02, "-", "encode_batch", "cold"]
    one, two = rows[0.02, 1, "sliding", "cold"], rows[0.02, 2, "sliding", "cold"]

    # The token counts, from the tokenizer called directly on the documents of the file.
    tok = Tokenizer.from_file(tok_file)
    with open(bench_data.make_corpus(0.02, str(tmp_path))["path"], encoding="utf-8") as f:
        texts = [json.loads(line)["text"] for line in f]
    doc_tokens = sum(len(tok.encode(t, add_special_tokens=False).ids) for t in texts)
    separator = len(tok.encode("\n\n", add_special_tokens=False).ids)
    assert peer["children"][0]["text_tokens"] == doc_tokens
    assert one["text_tokens"] == two["text_tokens"] == doc_tokens + (len(texts) - 1) * separator
    assert len(two["children"]) == 2

    for row in (peer, one, two):
        assert row["status"] == "ok"
        assert row["text_mb"] == sum(len(t.encode("utf-8")) for t in texts) / 1e6
        assert row["mb_per_s"] == pytest.approx(row["text_mb"] / row["wall_s"])
        assert row["peak_rss_mb"] == max(c["peak_rss_mb"] for c in row["children"])
    for row in (one, two):
        c = row["children"][0]
        assert row["throughput_vs_encode_batch"] == pytest.approx(peer["wall_s"] / row["wall_s"])
        assert sum(c["phases_s"].values()) == pytest.approx(c["prepare_s"], rel=1e-3, abs=1e-3)
        assert c["rss_before_mb"] <= min(c["peak_mb_after"].values()) <= c["peak_rss_mb"]
    if not bench_data.cache_supported():
        assert rows[0.02, 1, "sliding", "cached"]["status"] == "no cache yet"
    else:  # the cached run reads the plan the cold run cached: the same tokens, none tokenized
        cached = rows[0.02, 1, "sliding", "cached"]
        assert cached["status"] == "ok" and cached["text_tokens"] == one["text_tokens"]
        assert cached["children"][0]["phases_s"]["tokenize"] == 0
    for key in ((0.04, "-", "encode_batch", "cold"), (0.04, 1, "sliding", "cold")):
        assert rows[key]["status"].startswith("not run (projected ")
    # 2 processes, each at least the peak measured at half the size.
    need = rows[0.04, 2, "sliding", "cold"]["projected_peak_mb"]
    assert need >= 2 * one["children"][0]["peak_rss_mb"] > 10
    # Its time: 2 processes, each preparing twice the text at the 1-process rate.
    took = rows[0.04, 2, "sliding", "cold"]["projected_s"]
    assert took == pytest.approx(2 * one["wall_s"] / one["text_mb"] * 0.04)
    table = bench_data.format_table(result)
    assert "| 0.04 | 2 | sliding | cold | not run (projected" in table
