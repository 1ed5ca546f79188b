"""The results store: records, Paloma's micro and macro averages, atomic appends."""

from __future__ import annotations

import json
import math
import os

import numpy as np
import pytest

from ppl_jax.errors import ConfigError, DataError
from ppl_jax.metrics.sums import Sums
from ppl_jax.outputs import folder as outputs
from ppl_jax.outputs import store

TAGS = {
    "web": {"domain": "web", "split": "val"},
    "code": {"domain": "code", "split": "val"},
    "books": {"domain": "books", "split": "test"},
    "news": {"domain": "web", "split": "test"},
    "untagged": {},
}


def synthetic(seed: int) -> dict[str, dict[str, np.ndarray | float]]:
    """Per-dataset sums of different sizes and difficulty (so micro and macro differ)."""
    rng = np.random.default_rng(seed)
    out = {}
    for name in TAGS:
        tokens = int(rng.integers(50, 50_000))
        out[name] = {
            "nll_sum": float(tokens * rng.uniform(1.5, 6.0)),
            "num_tokens": tokens,
            "num_bytes": int(tokens * rng.uniform(2.5, 5.0)),
            "num_words": int(tokens * rng.uniform(0.5, 0.9)),
            "num_documents": int(rng.integers(1, 100)),
            "num_windows": int(rng.integers(1, 100)),
            "entropy_sum": float(tokens * rng.uniform(1.0, 5.0)),
            "num_correct": int(tokens * rng.uniform(0.1, 0.6)),
        }
    return out


def records_of(sums: dict, step: int | None = 1000, checkpoint: str = "/ckpt/1000") -> list:
    return [
        store.dataset_record(
            step=step,
            dataset=name,
            sums=Sums(**s),
            fingerprint=f"fp-{name}",
            tags=TAGS[name],
            checkpoint=checkpoint,
            wall_seconds=1.5,
        )
        for name, s in sums.items()
    ]


def reference_metrics(s: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """NumPy float64, from arrays of sums (one entry per dataset, or one total)."""
    ln2 = np.log(2.0)
    return {
        "perplexity": np.exp(s["nll_sum"] / s["num_tokens"]),
        "nll_per_token": s["nll_sum"] / s["num_tokens"],
        "bits_per_token": s["nll_sum"] / s["num_tokens"] / ln2,
        "bits_per_byte": s["nll_sum"] / (s["num_bytes"] * ln2),
        "byte_perplexity": np.exp(s["nll_sum"] / s["num_bytes"]),
        "word_perplexity": np.exp(s["nll_sum"] / s["num_words"]),
        "entropy_per_token": s["entropy_sum"] / s["num_tokens"],
        "predictive_perplexity": np.exp(s["entropy_sum"] / s["num_tokens"]),
        "top1_accuracy": s["num_correct"] / s["num_tokens"],
    }


@pytest.mark.parametrize("seed", [0, 1])
def test_averages_match_an_independent_numpy_computation(seed):
    sums = synthetic(seed)
    names = list(sums)
    arrays = {k: np.array([sums[n][k] for n in names], np.float64) for k in sums[names[0]]}
    per_dataset = reference_metrics(arrays)
    micro = reference_metrics({k: v.sum(keepdims=True) for k, v in arrays.items()})
    averages = store.average_records(records_of(sums))
    by_name = {a["dataset"]: a for a in averages}
    expected_groups = {
        "macro": names,
        "macro/domain=books": ["books"],
        "macro/domain=code": ["code"],
        "macro/domain=web": ["web", "news"],
        "macro/split=test": ["books", "news"],
        "macro/split=val": ["web", "code"],
    }
    assert [a["dataset"] for a in averages] == ["micro", *expected_groups]
    assert sorted(store.MACRO_METRICS) == sorted(per_dataset)
    for metric, values in per_dataset.items():
        np.testing.assert_allclose(
            by_name["micro"]["metrics"][metric], micro[metric][0], rtol=1e-12
        )
        for group, members in expected_groups.items():
            mean = values[[names.index(m) for m in members]].mean()
            np.testing.assert_allclose(by_name[group]["metrics"][metric], mean, rtol=1e-12)
    # Micro and macro really differ on this data (else the test could not tell them apart).
    assert (
        abs(
            by_name["micro"]["metrics"]["perplexity"] / by_name["macro"]["metrics"]["perplexity"]
            - 1
        )
        > 1e-3
    )
    assert by_name["micro"]["sums"]["num_tokens"] == int(arrays["num_tokens"].sum())
    assert by_name["micro"]["sums"]["nll_sum"] == pytest.approx(arrays["nll_sum"].sum(), rel=1e-14)
    assert by_name["macro/domain=web"]["tags"] == {"domain": "web"}
    assert by_name["macro/domain=web"]["datasets"] == ["web", "news"]
    assert by_name["micro"]["datasets"] == names and "sums" not in by_name["macro"]
    for a in averages:
        assert a["kind"] == "average" and a["step"] == 1000 and a["checkpoint"] == "/ckpt/1000"
        assert a["wall_seconds"] == 1.5 * len(names) and "fingerprint" not in a
    # Only the tag keys asked for.
    only = store.average_records(records_of(sums), tags=["split"])
    assert [a["dataset"] for a in only] == ["micro", "macro", "macro/split=test", "macro/split=val"]


def test_a_dataset_record_holds_the_metrics_of_results_json():
    s = synthetic(3)["web"]
    record = store.dataset_record(step=None, dataset="web", sums=Sums(**s), fingerprint="ab")
    expected = reference_metrics({k: np.array([v], np.float64) for k, v in s.items()})
    for metric, value in expected.items():
        assert record["metrics"][metric] == pytest.approx(float(value[0]), rel=1e-12)
    assert record["sums"] == s and record["step"] is None and record["tags"] == {}
    assert record["kind"] == "dataset" and record["fingerprint"] == "ab" and record["notes"] == {}
    assert record["time"].endswith("+00:00")


def test_undefined_and_overflowing_values_are_null_with_a_note():
    sums = synthetic(4)
    sums["code"]["num_bytes"] = 0  # no bytes: no bits per byte
    sums["books"]["num_words"] = 1  # exp(nll_sum / 1) overflows float64
    records = records_of(sums)
    code, books = records[1], records[2]
    assert code["metrics"]["bits_per_byte"] is None and code["metrics"]["byte_perplexity"] is None
    assert code["notes"]["bits_per_byte"] == "undefined (no bytes)"
    assert books["metrics"]["word_perplexity"] is None
    assert books["notes"]["word_perplexity"].startswith("inf (overflow")
    by_name = {a["dataset"]: a for a in store.average_records(records)}
    # Undefined for one dataset: undefined for micro (code's NLL has no bytes to go with) and for
    # the mean over datasets. An overflow of one dataset leaves the pooled ratio defined.
    assert by_name["micro"]["metrics"]["bits_per_byte"] is None
    assert by_name["micro"]["notes"]["bits_per_byte"] == (
        "undefined (bits_per_byte is undefined for code)"
    )
    nll = sum(s["nll_sum"] for s in sums.values())
    num_words = sum(s["num_words"] for s in sums.values())
    word_ppl = by_name["micro"]["metrics"]["word_perplexity"]
    assert word_ppl == pytest.approx(math.exp(nll / num_words), rel=1e-12)
    assert by_name["macro"]["metrics"]["bits_per_byte"] is None
    assert (
        by_name["macro"]["notes"]["bits_per_byte"] == "undefined (bits_per_byte is null for code)"
    )
    assert by_name["macro/domain=web"]["metrics"]["bits_per_byte"] is not None
    assert by_name["macro/split=test"]["metrics"]["word_perplexity"] is None
    assert "books" in by_name["macro/split=test"]["notes"]["word_perplexity"]
    for record in records + list(by_name.values()):
        json.dumps(record, allow_nan=False)  # strict JSON


def test_average_records_refuses_mixed_steps_and_repeats():
    records = records_of(synthetic(5))
    assert store.average_records([]) == []
    other = records_of(synthetic(5), step=2000, checkpoint="/ckpt/2000")
    with pytest.raises(ValueError, match="one step"):
        store.average_records(records[:2] + other[2:])
    with pytest.raises(ValueError, match="twice"):
        store.average_records(records + records[:1])


def test_round_trip_done_and_replace(tmp_path):
    results = store.ResultsStore.in_dir(str(tmp_path))
    assert results.path == str(tmp_path / "results.jsonl")
    assert results.records() == []  # missing file
    (tmp_path / "results.jsonl").write_text("")
    assert results.records() == []  # empty file
    first = records_of(synthetic(6))
    results.append(first + store.average_records(first))
    stored = results.records()
    assert stored == json.loads(
        json.dumps(first + store.average_records(first, time=stored[5]["time"]))
    )
    assert results.done(1000, "web", "fp-web")
    assert not results.done(1000, "web", "fp-other")
    assert not results.done(2000, "web", "fp-web") and not results.done(None, "web", "fp-web")
    assert not results.done(1000, "micro", "fp-web")  # an average is never "done"
    # A null step is a step like any other.
    hf = records_of(synthetic(7), step=None, checkpoint="/hf")
    results.append(hf[:1])
    assert results.done(None, "web", "fp-web") and len(results.records()) == len(stored) + 1
    # A re-run with a new fingerprint supersedes: one record per (kind, step, dataset).
    again = store.dataset_record(
        step=1000, dataset="web", sums=Sums(nll_sum=1.0, num_tokens=1), fingerprint="new"
    )
    results.append([again])
    after = results.records()
    assert len(after) == len(stored) + 1
    assert results.done(1000, "web", "new") and not results.done(1000, "web", "fp-web")
    assert after[-1] == json.loads(json.dumps(again))
    assert [r for r in after if r["dataset"] == "web" and r["step"] == 1000] == [after[-1]]
    assert [r["dataset"] for r in results.dataset_records(1000)] == [
        "code",
        "books",
        "news",
        "untagged",
        "web",
    ]
    assert [r["dataset"] for r in results.dataset_records(1000, ["web", "news"])] == ["news", "web"]
    with pytest.raises(ValueError, match="same"):
        results.append([again, again])
    # Strict JSON, one object per line; the file's mode is as open() would make it.
    lines = (tmp_path / "results.jsonl").read_text().splitlines()
    assert len(lines) == len(after) and all(json.loads(line)["kind"] for line in lines)
    assert os.stat(results.path).st_mode & 0o777 == 0o666 & ~outputs._UMASK


def test_a_failing_write_leaves_the_old_file_intact(tmp_path, monkeypatch):
    results = store.ResultsStore.in_dir(str(tmp_path))
    results.append(records_of(synthetic(8)))
    before = (tmp_path / "results.jsonl").read_bytes()

    def fail(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", fail)
    with pytest.raises(ConfigError, match=r"results.jsonl could not be written \(No space"):
        results.append(records_of(synthetic(9), step=2000))
    assert (tmp_path / "results.jsonl").read_bytes() == before
    assert sorted(os.listdir(tmp_path)) == ["results.jsonl"]  # no temporary file left
    with pytest.raises(ValueError):  # NaN is refused before anything is written
        results.append([{"kind": "average", "step": 1, "dataset": "x", "metrics": {"p": math.nan}}])
    assert (tmp_path / "results.jsonl").read_bytes() == before


@pytest.mark.parametrize(
    "line, why",
    [
        ("{not json", "Expecting property name"),
        ('{"kind": "dataset", "step": 1, "dataset": "a", "metrics": {"p": NaN}}', "NaN is not"),
        ('["kind", "dataset"]', "not a record"),
        ('{"kind": "other", "step": 1, "dataset": "a"}', "not a record"),
        ('{"kind": "dataset", "step": "1", "dataset": "a"}', "not a record"),
        ('{"kind": "dataset", "dataset": "a"}', "not a record"),
    ],
)
def test_a_malformed_line_is_named(tmp_path, line, why):
    results = store.ResultsStore.in_dir(str(tmp_path))
    results.append(records_of(synthetic(10))[:1])
    with open(results.path, "a") as f:
        f.write("\n" + line + "\n")  # line 2 blank, line 3 bad
    with pytest.raises(DataError) as info:
        results.records()
    message = str(info.value)
    assert message.startswith(f"{results.path} line 3 is not a results record (") and why in message
    with pytest.raises(DataError):  # nothing is appended to a damaged store
        results.append(records_of(synthetic(10))[1:2])


def test_parse_tags():
    assert store.parse_tags("", "suite[0].tags") == {}
    assert store.parse_tags(" domain = web, split=val ,", "t") == {"domain": "web", "split": "val"}
    for text, words in (
        ("domain", "'domain' is not key=value"),
        ("=web", "is not key=value"),
        ("a=b=c", "is not key=value"),
        ("a/b=c", "is not key=value"),
        ("a=1,a=2", "gives the tag 'a' twice"),
    ):
        with pytest.raises(ConfigError, match="suite.1..tags") as info:
            store.parse_tags(text, "suite[1].tags")
        assert words in str(info.value)


def test_the_parsed_records_are_kept_until_the_file_changes(tmp_path, monkeypatch):
    results = store.ResultsStore.in_dir(str(tmp_path))
    records = records_of(synthetic(11))
    results.append(records)
    parses = []
    parse = store.ResultsStore._parse
    monkeypatch.setattr(store.ResultsStore, "_parse", lambda self: parses.append(1) or parse(self))
    assert all(results.done(1000, name, f"fp-{name}") for name in TAGS)
    assert parses == []  # what append wrote is known without reading it back
    # A copy: changing it changes nothing stored.
    results.records()[0]["metrics"]["perplexity"] = -1.0
    results.dataset_records(1000)[0]["dataset"] = "changed"
    assert results.records() == json.loads(json.dumps(records))
    # Another writer (a hand edit, a copy from elsewhere): read again.
    other = store.ResultsStore(results.path)
    other.append([dict(records[0], fingerprint="other")])
    assert results.done(1000, "web", "other") and not results.done(1000, "web", "fp-web")
    assert parses == [1, 1]  # once by the other writer, once here (then known again)
    assert results.done(1000, "web", "other") and parses == [1, 1]
    os.remove(results.path)
    assert results.records() == [] and not results.done(1000, "web", "other")
