"""The evaluation loop's hooks (`ppl_jax.evaluation.hooks`): a training loop's pair times its own
dataset, a caller's pair needs no base `__init__`, and only process 0 builds the records'
details and the diagnostics' curves and intervals (the others score every pass all the same)."""

from __future__ import annotations

import jax
import pytest
from test_diagnostics import settings

import ppl_jax
from ppl_jax.evaluation import summary
from ppl_jax.evaluation.hooks import Hooks, PairHooks
from ppl_jax.evaluation.run import evaluate
from ppl_jax.metrics import uncertainty
from ppl_jax.scoring import scorer as scorer_lib

import helpers


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> str:
    text = helpers.stdlib_text(4000)
    return helpers.corpus_files(tmp_path_factory.mktemp("hooks"), [text])


@pytest.fixture(scope="module")
def loop(tiny_checkpoint, corpus, tmp_path_factory):
    """A training loop's evaluator over a long dataset `a` and a short one `b`, and its params."""
    short = helpers.corpus_files(tmp_path_factory.mktemp("short"), [helpers.stdlib_text(300)])
    ckpt = ppl_jax.open_checkpoint(tiny_checkpoint)
    evaluator = ppl_jax.Evaluator(
        ppl_jax.resolve_architecture(ckpt).model(), ppl_jax.make_mesh(-1, 1),
        [ppl_jax.DatasetSpec(name="a", path=corpus), ppl_jax.DatasetSpec(name="b", path=short)],
        ckpt.tokenizer(5),
        protocol=ppl_jax.ProtocolSpec(seq_len=32),
        batch=ppl_jax.BatchSpec(batch_size=8),
        bootstrap_samples=200,
    )  # fmt: skip
    return evaluator, ckpt.restore(5, evaluator.param_targets)


class Records:
    """A sink: the records a training loop's store receives."""

    def __init__(self):
        self.records = []

    def write(self, records):
        self.records.extend(records)

    def end_step(self, step, records):
        pass

    def close(self):
        pass


def test_a_training_loops_wall_seconds_are_each_datasets_own(loop):
    evaluator, params = loop
    sink = Records()
    evaluator(params, step=5, sinks=[sink])
    a, b = (r["details"] for r in sink.records if r["kind"] == "dataset")
    for d in (a, b):
        assert d["wall_seconds"] >= d["scoring_seconds"] > 0
    # counted from the call's start, b's would hold a's scoring too
    assert b["wall_seconds"] < a["scoring_seconds"] + b["scoring_seconds"]


def test_a_pair_of_ones_own_needs_no_base_init(loop):
    """A caller's `PairHooks` (as the command line's `RunPair`, a dataclass) need not run the
    base's `__init__`: the base's observers and finish hold nothing."""
    evaluator, params = loop

    class Bare(PairHooks):
        def __init__(self):
            self.finished = 0

        def finish(self, ev, params):
            self.finished += 1
            return super().finish(ev, params)

    class Mine(Hooks):
        pairs = []

        def pair(self, evaluator, d, step, parts):
            self.pairs.append(Bare())
            return self.pairs[-1]

    hooks = Mine()
    assert evaluator(params, step=5, hooks=hooks) == evaluator(params, step=5)
    assert [p.finished for p in hooks.pairs] == [1, 1]


@pytest.fixture
def counted(monkeypatch) -> dict[str, int]:
    """Calls of the record's details and of the bootstrap intervals, by name."""
    calls = {"details": 0, "intervals": 0}

    def counting(name, module, attribute):
        f = getattr(module, attribute)

        def wrapper(*a, **k):
            calls[name] += 1
            return f(*a, **k)

        monkeypatch.setattr(module, attribute, wrapper)

    counting("details", summary, "dataset_dict")
    counting("intervals", uncertainty, "intervals")
    counting("intervals", uncertainty, "curve_intervals")
    return calls


@pytest.mark.parametrize("process", [0, 1])
def test_only_process_0_builds_the_records_details(loop, counted, monkeypatch, process):
    evaluator, params = loop
    want = evaluator(params, step=5)
    assert counted == {"details": 2, "intervals": 2}
    monkeypatch.setattr(jax, "process_index", lambda: process)
    # every process returns the same scalars; the others build no details or intervals
    assert evaluator(params, step=5) == want
    assert counted == (
        {"details": 2, "intervals": 2} if process else {"details": 4, "intervals": 4}
    )


@pytest.mark.parametrize("process", [0, 1])
def test_only_process_0_builds_the_diagnostics(
    tiny_checkpoint, corpus, tmp_path, counted, monkeypatch, process
):
    """The command line's curves and intervals are process 0's; every process scores the context
    sweep (its passes are collectives on a pod)."""
    scored = []
    score = scorer_lib.Scorer.score

    def scoring(self, *a, **k):
        scored.append(self.options.per_token)
        return score(self, *a, **k)

    monkeypatch.setattr(scorer_lib.Scorer, "score", scoring)
    monkeypatch.setattr(jax, "process_index", lambda: process)
    s = settings(
        tiny_checkpoint, corpus, tmp_path, output__position_curve=True,
        eval__context_lengths="4,16", eval__context_targets=8, metrics__bootstrap_samples=200,
    )  # fmt: skip
    ev = evaluate(s)
    assert len(scored) == 3  # the run's pass, the sweep's two lengths
    if process:
        assert ev.diagnostics == {} and counted == {"details": 0, "intervals": 0}
    else:
        assert {"position_curve", "context_curve"} <= set(ev.diagnostics)
        assert counted["details"] == 1 and counted["intervals"] >= 3
