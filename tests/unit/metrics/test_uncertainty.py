"""Bootstrap intervals (`ppl_jax.metrics.uncertainty`): coverage in simulation, the ratio estimator, the
circular block bootstrap under dependence, and per-window bytes that add up to the run's."""

import numpy as np
import pytest

from ppl_jax.data.documents import Document
from ppl_jax.metrics import uncertainty
from ppl_jax.plans.protocols import PlanInputs, get, window_spans
from ppl_jax.tokenizer import load_tokenizer

import helpers


def synthetic_documents(rng, n):
    """Documents whose per-token NLL falls with length (short ones are harder), so that a mean
    of per-document means (2 + 20 E[1/t] = 2.378) differs from the ratio of sums the metric is
    (E[nll] / E[t] = (2 E[t] + 20) / E[t] = 2 + 20 / 102, t uniform on 5..199)."""
    tokens = rng.integers(5, 200, size=n)
    nll = 2.0 * tokens + 20.0 + rng.normal(0.0, 1.0, size=n) * np.sqrt(tokens)
    return uncertainty.Units(
        kind="document", nll=nll, tokens=tokens, bytes=3 * tokens, block_length=1
    )


TRUE_NLL_PER_TOKEN = 2.0 + 20.0 / 102.0
MEAN_OF_MEANS = 2.0 + 20.0 * np.mean(1.0 / np.arange(5, 200))


def test_the_interval_covers_the_true_ratio_95_percent_of_the_time():
    hits = wrong = 0
    runs = 200
    for seed in range(runs):
        units = synthetic_documents(np.random.default_rng(1000 + seed), 200)
        iv = uncertainty.intervals(units, 1000, seed)
        lo, hi = iv["nll_per_token"]
        hits += lo <= TRUE_NLL_PER_TOKEN <= hi
        wrong += lo <= MEAN_OF_MEANS <= hi
        # perplexity and bits per byte are the same interval, transformed.
        assert iv["perplexity"] == pytest.approx(np.exp(iv["nll_per_token"]), rel=1e-12)
        assert iv["bits_per_byte"] == pytest.approx(
            np.asarray(iv["nll_per_token"]) / 3 / np.log(2), rel=1e-12
        )
    assert abs(hits / runs - 0.95) <= 0.03, hits
    assert wrong / runs < 0.05  # the mean of per-document means is another quantity


def test_intervals_are_seeded_and_zero_samples_turns_them_off():
    units = synthetic_documents(np.random.default_rng(0), 50)
    a = uncertainty.intervals(units, 500, 7)
    assert a == uncertainty.intervals(units, 500, 7)
    assert a["perplexity"] != uncertainty.intervals(units, 500, 8)["perplexity"]
    assert a["method"] == "bootstrap over documents" and a["samples"] == 500 and a["seed"] == 7
    assert uncertainty.intervals(units, 0, 7) is None


def test_a_paired_comparison_of_a_run_with_itself_is_exactly_zero():
    units = synthetic_documents(np.random.default_rng(1), 80)
    d = uncertainty.paired_difference(units, units, 1000, 0)
    for key in ("bits_per_byte", "nll_per_token"):
        assert d[key]["difference"] == 0.0 and d[key]["interval"] == [0.0, 0.0]


def test_pairing_cancels_what_two_runs_share():
    """B = A plus a small shift per token: the paired interval is narrow around the shift and
    far narrower than the width of either run's own interval."""
    rng = np.random.default_rng(2)
    a = synthetic_documents(rng, 100)
    b = uncertainty.Units("document", a.nll + 0.01 * a.tokens, a.tokens, a.bytes, 1)
    d = uncertainty.paired_difference(a, b, 1000, 0)
    lo, hi = d["nll_per_token"]["interval"]
    assert d["nll_per_token"]["difference"] == pytest.approx(0.01, rel=1e-9)
    assert lo == pytest.approx(0.01, rel=1e-9) and hi == pytest.approx(0.01, rel=1e-9)
    own = uncertainty.intervals(a, 1000, 0)["nll_per_token"]
    assert own[1] - own[0] > 0.01


def ar1_windows(rng, n, phi):
    """Windows of 64 tokens whose NLL per token follows an AR(1) process (topic drifts)."""
    x = np.empty(n)
    x[0] = rng.normal()
    for i in range(1, n):
        x[i] = phi * x[i - 1] + np.sqrt(1 - phi**2) * rng.normal()
    tokens = np.full(n, 64)
    return uncertainty.Units(
        "window", 64 * (3.0 + 0.3 * x), tokens, 4 * tokens, uncertainty.block_length(n)
    )


def test_blocks_widen_the_interval_of_dependent_windows():
    units = ar1_windows(np.random.default_rng(3), 1000, 0.9)
    assert units.block_length == 10
    blocks = uncertainty.intervals(units, 1000, 0)
    iid = uncertainty.intervals(
        uncertainty.Units("window", units.nll, units.tokens, units.bytes, 1), 1000, 0
    )
    assert blocks["method"].startswith("circular block bootstrap over windows")
    width = lambda iv: iv["nll_per_token"][1] - iv["nll_per_token"][0]  # noqa: E731
    # AR(1) with phi = 0.9: the variance of the mean is ~(1 + phi) / (1 - phi) = 19 times the
    # iid one; blocks of 10 recover much of it (the sd ratio ~ 4.4 in the limit).
    assert width(blocks) > 2.5 * width(iid)


@pytest.mark.parametrize("n, length", [(1, 1), (8, 2), (9, 3), (1000, 10), (1001, 11)])
def test_block_length_is_the_cube_root_rounded_up(n, length):
    assert uncertainty.block_length(n) == length


def test_one_unit_cannot_be_resampled():
    units = uncertainty.Units("document", np.ones(1), np.ones(1, np.int64), np.ones(1, np.int64), 1)
    with pytest.raises(Exception, match="at least two documents"):
        uncertainty.intervals(units, 100, 0)


def test_window_spans_sum_each_range():
    values = np.arange(1, 21, dtype=np.int32)
    lo, hi = np.array([0, 3, 7, 15]), np.array([3, 7, 9, 20])
    expected = [values[a:b].sum() for a, b in zip(lo, hi, strict=True)]
    assert window_spans(values, lo, hi).tolist() == expected
    assert window_spans(values, lo[:3], hi[:3]).tolist() == expected[:3]  # not to the end
    with pytest.raises(ValueError):
        window_spans(values, np.array([0, 2]), np.array([3, 5]))  # overlapping


@pytest.fixture(scope="module")
def bpe(tmp_path_factory):
    return load_tokenizer(helpers.bpe_file(str(tmp_path_factory.mktemp("bpe") / "t.json")), None)


@pytest.mark.parametrize(
    "protocol, stride", [("sliding", 5), ("sliding", 16), ("hf_strided", 6), ("gptq_chunks", None)]
)
def test_window_bytes_are_the_scored_tokens_bytes_and_add_up(bpe, protocol, stride):
    docs = [
        Document("return self.value # naïve café " * (i + 2) + "größer 北京 " * i, f"d{i}")
        for i in range(5)
    ]
    p = get(protocol).plan(docs, PlanInputs(bpe, bpe.vocab_size, 16, stride, False))
    # Independently: each token's bytes, from the stream the windows slice, read at the
    # positions the batch rows' target masks mark (the scorer's own view of what is scored).
    text = "\n\n".join(d.text for d in docs)  # data.separator's default, and the others' join
    if protocol == "sliding":
        per_doc = bpe.encode_with_bytes([d.text for d in docs])
        sep = bpe.encode_with_bytes(["\n\n"])[0][1]
        parts = [per_doc[0][1]]
        for _, b in per_doc[1:]:
            parts += [sep, b]
        byte_lens = np.concatenate(parts)
    else:
        byte_lens = bpe.encode_with_bytes([text])[0][1]
    w = p.windows
    rows = w.rows(np.arange(w.num_windows))
    expected = []
    for k in range(w.num_windows):
        positions = np.flatnonzero(rows["target_mask"][k])
        expected.append(int(byte_lens[w.starts[k] + positions].sum()))
    assert p.window_bytes.tolist() == expected
    assert int(p.window_bytes.sum()) == p.num_bytes
    assert len(set(byte_lens.tolist())) > 2  # tokens of several byte lengths were checked


def trial_windows() -> uncertainty.Units:
    """A case like the trial's: one long document in three windows of 16,384 tokens, the middle
    one easier (perplexity about 54,539 over all three)."""
    tokens = np.full(3, 16384)
    nll = tokens * np.array([10.95, 10.84, 10.93])
    return uncertainty.Units("window", nll, tokens, 4 * tokens, uncertainty.block_length(3))


def test_three_windows_give_an_interval_that_holds_the_estimate_and_a_warning():
    """The moving-block bootstrap drew the middle window in every block of two and so put the
    interval below the estimate ([52,951.51, 53,394.50] around 53,547.69); blocks joined end to
    start draw every window as often, so the interval holds the estimate, and it is marked
    rough, with what to do."""
    units = trial_windows()
    estimate = float(np.exp(units.nll.sum() / units.tokens.sum()))
    iv = uncertainty.intervals(units, 1000, 0)
    lo, hi = iv["perplexity"]
    assert lo < estimate < hi
    assert iv["warning"] == (
        "rough interval: 3 windows (1.5 blocks of 2) are too few for the bootstrap to hold its "
        "95% (it needs at least 10 blocks); score more text (more documents), or more, shorter "
        "windows (eval.seq_len)."
    )
    # The old draw (first windows among the W - b + 1 that fit) misses the estimate: the bias
    # the circular draw removes, shown with NumPy alone.
    rng = np.random.default_rng(0)
    rows = [np.r_[a : a + 2, b : b + 2] for a, b in rng.integers(0, 2, (1000, 2))]
    moving = np.exp([units.nll[r].sum() / units.tokens[r].sum() for r in rows])
    assert np.quantile(moving, 0.975) < estimate
    # Every window is drawn equally often in the circular draw.
    counts = np.zeros(3)
    for a in np.random.default_rng(1).integers(0, 3, 3000):
        counts[[a, (a + 1) % 3]] += 1
    assert counts.min() / counts.max() > 0.95


def test_enough_units_give_no_warning_and_an_interval_that_misses_says_so():
    assert (
        uncertainty.intervals(synthetic_documents(np.random.default_rng(0), 50), 500, 0)["warning"]
        is None
    )
    few = synthetic_documents(np.random.default_rng(0), 6)
    assert uncertainty.intervals(few, 500, 0)["warning"].startswith(
        "rough interval: 6 documents are too few for the bootstrap to hold its 95% (it needs at "
        "least 10 documents); score more documents"
    )
    units = trial_windows()
    missed = uncertainty.warning_of(units, {"bits per byte": (3.0, [3.1, 3.2])})
    assert missed.endswith(
        "; the bits per byte interval [3.1, 3.2] does not contain its estimate 3."
    )
