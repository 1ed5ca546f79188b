"""Every scoring pass of a run compiles its step with the run's own settings (REVIEW item 1): the
context sweep, the short-context pass and LongPPL's evaluator's passes take the run's
`StepOptions` with only the statistics they do not return turned off, so a context-mesh run's
longest windows go round the ring in chunks, as its record says."""

from __future__ import annotations

import pytest

from ppl_jax.config.defaults import get_config
from ppl_jax.config.settings import from_config
from ppl_jax.evaluation.run import evaluate
from ppl_jax.scoring import scorer as scorer_lib
from ppl_jax.scoring.step import StepOptions

import helpers

RUN = {"context_attention": "ring", "token_chunk": 64, "matmul_precision": "bf16_3x"}


def settings(checkpoint: str, corpus: str, out, **overrides):
    c = get_config()
    c.checkpoint.dir = checkpoint
    c.data.path = corpus
    c.eval.seq_len = 127
    c.eval.batch_size = 4
    c.mesh.data, c.mesh.context = 4, 2
    c.model.context_attention = RUN["context_attention"]
    c.model.token_chunk = RUN["token_chunk"]
    c.model.matmul_precision = RUN["matmul_precision"]
    c.output.dir = str(out)
    c.output.progress = False
    c.output.gzip_baseline = False
    c.metrics.bootstrap_samples = 0
    for key, value in overrides.items():
        *sections, name = key.split("__")
        node = c
        for section in sections:
            node = getattr(node, section)
        setattr(node, name, value)
    return from_config(c)


@pytest.fixture
def made(monkeypatch) -> list[StepOptions]:
    """The options of every `Scorer` made while the test runs, in order."""
    found = []
    init = scorer_lib.Scorer.__init__

    def collect(self, model, mesh, shardings, options=scorer_lib.DEFAULT_OPTIONS, *a, **k):
        found.append(options)
        init(self, model, mesh, shardings, options, *a, **k)

    monkeypatch.setattr(scorer_lib.Scorer, "__init__", collect)
    return found


WHOLE = dict(eval__protocol="whole_documents", eval__short_context=16, eval__short_targets=8,
             output__position_curve=True)  # fmt: skip


@pytest.mark.parametrize(
    "overrides, scorers",
    [
        # the run's, the sweep's
        (dict(eval__context_lengths="16", eval__context_targets=16), 2),
        # the run's, the short pass's
        (WHOLE, 2),
        # the run's, the short pass's, LongPPL's evaluator's two passes
        pytest.param(dict(WHOLE, longppl__evaluator__dir="tiny"), 4, marks=pytest.mark.slow),
    ],
    ids=["context sweep", "short context", "LongPPL evaluator"],
)
def test_every_pass_scores_with_the_runs_settings(
    overrides, scorers, tiny_checkpoint, tmp_path, made
):
    text = helpers.stdlib_text(300).encode("ascii", "replace").decode()
    corpus = helpers.corpus_files(tmp_path, [text[:120], text[120:210], text[210:]])
    if "longppl__evaluator__dir" in overrides:
        overrides["longppl__evaluator__dir"] = tiny_checkpoint
    evaluate(settings(tiny_checkpoint, corpus, tmp_path / "out", **overrides))
    assert len(made) == scorers, made
    for options in made:
        assert {k: getattr(options, k) for k in RUN} == RUN, options
