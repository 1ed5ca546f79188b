"""Each named protocol, end to end through `evaluate` on a Hugging Face directory, against its
reference implementation run on the same directory in PyTorch (or lm-evaluation-harness itself).

The directories and the reference numbers are committed in tests/golden/references, written by
tests/golden/make_golden.py (tests/reference/test_references_live.py runs the references live).
Two tiny random families share a byte-level BPE of 512 ids: GPT-2, whose tokenizer adds no BOS
(the harness's prefix token is EOS `<|endoftext|>`, id 0), and Llama, whose tokenizer prepends a
BOS `<s>` (id 512) through its post-processor, so the harness's `tok_encode` adds it.

- `hf_strided`: the Hugging Face guide "Perplexity of fixed-length models", with the exact NLL sum
  of the labels that are not -100 in place of `outputs.loss`.
- `gptq_chunks`: the GPTQ/AWQ `testenc` loop, NLL summed over each chunk's `seqlen - 1` targets.
- `lm_eval_rolling`: `HFLM.loglikelihood_rolling` per document, and the wikitext task's own
  `process_results` and aggregations for word and byte perplexity and bits per byte.
- `sliding`: documents tokenized one by one, joined by the separator's tokens (BOS first where
  the tokenizer adds one), every token after the first scored once (`ppl_jax.plans.windows.sliding`).

Then the result of each protocol does not depend on batch size, mesh, packing or length buckets.
"""

from __future__ import annotations

import json
import os
import re

import numpy as np
import pytest

from ppl_jax.config.defaults import get_config
from ppl_jax.config.settings import from_config
from ppl_jax.evaluation import summary
from ppl_jax.evaluation.run import evaluate
from ppl_jax.outputs.folder import OutputDir

import helpers

L = 16  # eval.seq_len of most runs
RTOL = 1e-5  # NLL sums against a reference
INVARIANT_RTOL = 1e-6  # NLL sums of the same run under another batch size, mesh or layout

GOLDEN_DIR = os.path.join(helpers.GOLDEN, "references")
with open(os.path.join(GOLDEN_DIR, "references.json"), encoding="utf-8") as _f:
    GOLDEN = json.load(_f)


def family_dir(family: str) -> str:
    return os.path.join(GOLDEN_DIR, family)


def encoder(path: str):
    """The text -> ids function of the tokenizer.json in `path`, no special tokens added (the
    `tokenizers` library itself, not ppl_jax's wrapper)."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(os.path.join(path, "tokenizer.json"))
    return lambda text: tok.encode(text, add_special_tokens=False).ids


# -------------------------------------------------------------------------------------- data


def write_jsonl(path, texts: list[str]) -> str:
    with open(path, "w", encoding="utf-8") as f:
        for t in texts:
            f.write(json.dumps({"text": t}) + "\n")
    return str(path)


def write_stream_corpus(root, texts: list[str]) -> dict:
    """The stream documents as `jsonl` (all) and as `lines` (those without a line end)."""
    lines = [t for t in texts if "\n" not in t]
    (root / "docs.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return {
        "jsonl": write_jsonl(root / "docs.jsonl", texts),
        "lines": str(root / "docs.txt"),
        "jsonl_texts": texts,
        "lines_texts": lines,
    }


@pytest.fixture(scope="module")
def stream_corpus(tmp_path_factory) -> dict:
    out = write_stream_corpus(tmp_path_factory.mktemp("stream"), GOLDEN["stream_texts"])
    assert out["lines_texts"] == GOLDEN["lines_texts"]
    return out


@pytest.fixture(scope="module")
def rolling_docs(tmp_path_factory) -> tuple[str, list[str]]:
    texts = GOLDEN["rolling_texts"]
    return write_jsonl(tmp_path_factory.mktemp("rolling") / "docs.jsonl", texts), texts


# -------------------------------------------------------------------------------- ppl_jax runs

_RUNS: dict = {}


def run(
    path: str,
    protocol: str,
    data_path: str,
    data_format: str = "jsonl",
    seq_len: int = L,
    stride: int | None = None,
    **overrides,
):
    """`evaluate` of the HF directory `path` through the config, as the command line does
    (memoized by the settings). Overrides are `section__key=value`.

    Returns (Evaluation, the results.json dict).
    """
    c = get_config()
    c.checkpoint.dir = path
    c.checkpoint.format = "hf"
    c.data.path = data_path
    c.data.format = data_format
    c.eval.protocol = protocol
    c.eval.seq_len = seq_len
    c.eval.stride = stride
    c.output.progress = False
    c.output.gzip_baseline = False
    for name, value in overrides.items():
        section, field = name.split("__")
        setattr(getattr(c, section), field, value)
    settings = from_config(c)
    if settings not in _RUNS:
        ev = evaluate(settings)
        _RUNS[settings] = (ev, summary.results_dict(ev, c))
    return _RUNS[settings]


def rel(a: float, b: float) -> float:
    return abs(a - b) / abs(b)


def assert_matches(ev, results, ref: dict) -> None:
    """The same tokens read, the same windows, counts equal, NLL sums within `RTOL`.

    `ref`: a reference run, `ids` (the token ids it read), and per window that scores something
    `window_nll` (NLL sum, nats) and `window_tokens` (scored targets), in window order.
    """
    ref_nll = np.asarray(ref["window_nll"], np.float64)
    assert ev.plan.windows.tokens.tolist() == ref["ids"]  # the same stream, BOS included
    assert ev.totals.window_tokens.tolist() == ref["window_tokens"]
    np.testing.assert_allclose(ev.totals.window_nll, ref_nll, rtol=RTOL)
    assert results["num_tokens"] == ev.sums.num_tokens == sum(ref["window_tokens"])
    assert rel(ev.sums.nll_sum, ref_nll.sum()) < RTOL
    worst = np.max(np.abs(ev.totals.window_nll - ref_nll) / np.abs(ref_nll))
    print(
        f"{ev.plan.protocol}: {ev.sums.num_tokens} tokens in {len(ref_nll)} windows, "
        f"NLL sum rel {rel(ev.sums.nll_sum, ref_nll.sum()):.1e}, worst window rel {worst:.1e}"
    )


def case_ids(cases: list[dict], *keys: str) -> list[str]:
    return ["-".join(str(c[k]).replace("\n", "nl").strip() for k in keys) for c in cases]


# ------------------------------------------------------------------------------ hf_strided


def check_hf_strided(path, corpus, ref: dict, bos: list[int], max_length: int, stride: int):
    ev, results = run(path, "hf_strided", corpus["jsonl"], seq_len=max_length, stride=stride)
    assert_matches(ev, results, ref)
    unscored = len(ref["ids"]) - len(bos) - sum(ref["window_tokens"])
    assert results["protocol"]["unscored_tokens"] == unscored


@pytest.mark.parametrize(
    "case",
    GOLDEN["hf_strided"],
    ids=case_ids(GOLDEN["hf_strided"], "family", "max_length", "stride"),
)
def test_hf_strided_matches_the_hf_guide(stream_corpus, case):
    f = case["family"]
    check_hf_strided(
        family_dir(f), stream_corpus, case, GOLDEN["bos"][f], case["max_length"], case["stride"]
    )


# ----------------------------------------------------------------------------- gptq_chunks


def check_gptq_chunks(path, corpus, ref: dict, bos: list[int], seqlen: int):
    numel, nsamples = len(ref["ids"]), len(ref["ids"]) // seqlen
    assert numel % seqlen  # the tail the recipe drops is not empty
    ev, results = run(path, "gptq_chunks", corpus["jsonl"], seq_len=seqlen)
    assert_matches(ev, results, ref)
    assert ev.sums.num_windows == nsamples
    assert ref["window_tokens"] == [seqlen - 1] * nsamples
    # ppl_jax counts the text's tokens: the BOS that the Llama tokenizer puts in `testenc` is
    # not text (it is position 0 of chunk 0, never a target either way).
    unscored = numel - len(bos) - nsamples * (seqlen - 1)
    assert results["protocol"]["unscored_tokens"] == ev.plan.unscored_tokens == unscored


@pytest.mark.parametrize(
    "case", GOLDEN["gptq_chunks"], ids=case_ids(GOLDEN["gptq_chunks"], "family", "seqlen")
)
def test_gptq_chunks_match_the_gptq_recipe(stream_corpus, case):
    f = case["family"]
    check_gptq_chunks(family_dir(f), stream_corpus, case, GOLDEN["bos"][f], case["seqlen"])


# -------------------------------------------------------------------------- lm_eval_rolling


def check_lm_eval_rolling(path, docs_path, texts, ref: dict, bos: list[int], eot: int, tmp_path):
    """ppl_jax's lm_eval_rolling against the harness's results `ref` (see
    `tests/reference/recipes.py: harness`)."""
    ref_ll = np.asarray(ref["loglikelihoods"], np.float64)
    prefix = ref["prefix_token_id"]
    assert prefix == (bos[0] if bos else eot)  # BOS, else EOS
    encode = encoder(path)
    assert ref["num_tokens"] == [len(bos) + len(encode(t)) for t in texts]
    ev, results = run(path, "lm_eval_rolling", docs_path, output__per_document=True)
    assert results["protocol"]["prefix_token_id"] == prefix
    # documents.jsonl, as the command line writes it
    written = OutputDir(str(tmp_path), lock_fd=None).write_jsonl("documents.jsonl", ev.documents)
    docs = [json.loads(line) for line in open(written, encoding="utf-8")]
    ll = np.asarray([d["loglikelihood"] for d in docs])
    assert [d["num_tokens"] for d in docs] == ref["num_tokens"]
    assert results["num_tokens"] == ev.sums.num_tokens == sum(ref["num_tokens"])
    assert np.abs(ll - ref_ll).max() < 1e-3
    assert rel(ev.sums.nll_sum, -ref_ll.sum()) < RTOL
    assert rel(-ll.sum(), -ref_ll.sum()) < RTOL
    # The wikitext task's counts and aggregations, fed the harness's log-likelihoods.
    words, nbytes = ref["num_words"], ref["num_bytes"]
    assert words == [len(re.split(r"\s+", t)) for t in texts]
    assert nbytes == [len(t.encode("utf-8")) for t in texts]
    assert [d["num_words"] for d in docs] == words and ev.sums.num_words == sum(words)
    assert [d["num_bytes"] for d in docs] == nbytes and ev.sums.num_bytes == sum(nbytes)
    m = ev.metrics
    for name in ("word_perplexity", "byte_perplexity", "bits_per_byte"):
        assert m[name] == pytest.approx(ref[name], rel=RTOL), name
    # The aggregations themselves, from the stored per-document numbers.
    assert ref["word_perplexity"] == pytest.approx(np.exp(-ref_ll.sum() / sum(words)), rel=1e-12)
    assert ref["bits_per_byte"] == pytest.approx(-ref_ll.sum() / sum(nbytes) / np.log(2), rel=1e-12)
    assert results["word_perplexity"] == m["word_perplexity"]
    print(
        f"lm_eval_rolling {os.path.basename(path)}: tokens {sum(ref['num_tokens'])}, max |dll| "
        f"{np.abs(ll - ref_ll).max():.2e}, rel {rel(ev.sums.nll_sum, -ref_ll.sum()):.2e}"
    )


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_lm_eval_rolling_matches_the_harness(rolling_docs, tmp_path, family):
    path, texts = rolling_docs
    ref = GOLDEN["lm_eval_rolling"][family]
    check_lm_eval_rolling(
        family_dir(family), path, texts, ref, GOLDEN["bos"][family], GOLDEN["eot"], tmp_path
    )


# ---------------------------------------------------------------------------------- sliding


def check_sliding(path, corpus, ref: dict, bos: list[int], fmt, seq_len, stride, separator):
    ev, results = run(
        path,
        "sliding",
        corpus[fmt],
        fmt,
        seq_len=seq_len,
        stride=stride,
        data__separator=separator,
    )
    assert_matches(ev, results, ref)
    assert sum(ref["window_tokens"]) == len(ref["ids"]) - 1
    assert results["protocol"]["unscored_tokens"] == (0 if bos else 1)


@pytest.mark.parametrize(
    "case",
    GOLDEN["sliding"],
    ids=case_ids(GOLDEN["sliding"], "family", "format", "seq_len", "stride"),
)
def test_sliding_matches_its_reference(stream_corpus, case):
    f = case["family"]
    check_sliding(
        family_dir(f),
        stream_corpus,
        case,
        GOLDEN["bos"][f],
        case["format"],
        case["seq_len"],
        case["stride"],
        case["separator"],
    )


# ------------------------------------------------------------------------------- invariance

# (family, protocol, seq_len, stride) of a run above, the base of each invariance check.
BASES = {
    "sliding": ("gpt2", 16, 16),
    "hf_strided": ("llama", 16, 8),
    "gptq_chunks": ("gpt2", 16, None),
    "lm_eval_rolling": ("gpt2", 16, None),  # absolute positions: a packing slip shows
}
MESHES = {
    "bs1-1x8": {"eval__batch_size": 1, "mesh__data": 1, "mesh__model": 8},
    "bs2-2x4": {"eval__batch_size": 2, "mesh__data": 2, "mesh__model": 4},
}
LAYOUTS = {
    "nopack": {"eval__packing": False},
    "pack-3buckets": {"eval__packing": True, "eval__length_buckets": 3},
    "nopack-3buckets-bs2-2x4": {
        "eval__packing": False,
        "eval__length_buckets": 3,
        **MESHES["bs2-2x4"],
    },
}
INVARIANCE_CASES = [(p, name) for p in BASES for name in MESHES] + [
    ("lm_eval_rolling", name) for name in LAYOUTS
]
# The default tiers run one mesh of each protocol and the layout that changes the most; the
# other cases run in the slow tier.
DEFAULT_INVARIANCE = {
    ("sliding", "bs2-2x4"),
    ("hf_strided", "bs1-1x8"),
    ("gptq_chunks", "bs2-2x4"),
    ("lm_eval_rolling", "nopack-3buckets-bs2-2x4"),
}


@pytest.mark.parametrize(
    "protocol,variant",
    [
        pytest.param(
            p, v, id=f"{p}-{v}", marks=() if (p, v) in DEFAULT_INVARIANCE else pytest.mark.slow
        )
        for p, v in INVARIANCE_CASES
    ],
)
def test_result_does_not_depend_on_batch_mesh_or_layout(
    stream_corpus, rolling_docs, protocol, variant
):
    family, seq_len, stride = BASES[protocol]
    data = rolling_docs[0] if protocol == "lm_eval_rolling" else stream_corpus["jsonl"]
    args = (family_dir(family), protocol, data, "jsonl", seq_len, stride)
    common = {"output__per_document": True} if protocol == "lm_eval_rolling" else {}
    # eval.batch_size 8, mesh 8x1, packing on, 1 bucket: the defaults (the runs above)
    base, _ = run(*args, **common)
    assert (base.mesh_shape["data"], base.mesh_shape["model"], base.layout.batch_size) == (8, 1, 8)
    overrides = {**MESHES, **LAYOUTS}[variant]
    ev, _ = run(*args, **common, **overrides)
    assert ev.mesh_shape["data"] == overrides.get("mesh__data", 8)
    assert ev.layout.batch_size == overrides.get("eval__batch_size", 8)
    assert ev.sums.num_tokens == base.sums.num_tokens
    assert ev.sums.num_windows == base.sums.num_windows
    assert (ev.sums.num_bytes, ev.sums.num_words) == (base.sums.num_bytes, base.sums.num_words)
    assert rel(ev.sums.nll_sum, base.sums.nll_sum) < INVARIANT_RTOL
    if protocol == "lm_eval_rolling":
        if variant.startswith("nopack-3buckets"):
            assert len(set(ev.layout.widths)) > 1  # the buckets are really used
        if variant == "pack-3buckets":
            assert ev.layout.max_segments > 1  # and rows really hold several windows
        assert base.layout.max_segments > 1  # the default packs
        ll = np.asarray([d["loglikelihood"] for d in ev.documents])
        ll0 = np.asarray([d["loglikelihood"] for d in base.documents])
        np.testing.assert_allclose(ll, ll0, rtol=INVARIANT_RTOL, atol=1e-4)
