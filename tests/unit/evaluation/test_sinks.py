"""Sinks are outputs, chosen by name (`output.sinks`), and change nothing else: TensorBoard on a
run of one step and one dataset keeps that run's mode (its journal, no skipping, no console
lines, diagnostics allowed); the run writes results.json itself, only once it finished; the
library's `Evaluator` writes only to the sinks it is given."""

from __future__ import annotations

import json
import os
import signal

import pytest
from test_resume import signal_after
from test_tensorboard import scalars_in

import ppl_jax
from ppl_jax.checkpoints import architecture
from ppl_jax.config.defaults import get_config
from ppl_jax.config.settings import from_config
from ppl_jax.errors import ConfigError, Interrupted
from ppl_jax.evaluation import run as run_lib
from ppl_jax.outputs import files, journal, sinks, store
from ppl_jax.outputs.folder import OutputDir

import helpers


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> str:
    return helpers.corpus_files(tmp_path_factory.mktemp("sinks"), [helpers.stdlib_text(2500)])


def config(checkpoint: str, corpus: str, out, **overrides):
    c = get_config()
    c.checkpoint.dir, c.checkpoint.step, c.data.path = checkpoint, "5", corpus
    c.output.dir, c.output.progress, c.output.gzip_baseline = str(out), False, False
    c.eval.seq_len, c.eval.batch_size, c.output.journal_every = 32, 8, 1
    c.metrics.bootstrap_samples = 0
    for key, value in overrides.items():
        section, name = key.split("__")
        setattr(getattr(c, section), name, value)
    return c


def run(c, progress_factory=None) -> tuple[run_lib.RunResult, list[str]]:
    lines: list[str] = []
    spec = from_config(c)
    with OutputDir.open(spec.output_dir) as out:
        return run_lib.run(spec, out, progress_factory, lines.append), lines


def test_tensorboard_is_a_sink_and_changes_no_mode(tiny_checkpoint, corpus, tmp_path):
    plain = from_config(config(tiny_checkpoint, corpus, tmp_path / "plain"))
    c = config(tiny_checkpoint, corpus, tmp_path / "tb", output__sinks="tensorboard")
    spec = from_config(c)
    assert spec.sinks == ("tensorboard",) and spec.is_training_run is plain.is_training_run
    shorthand = config(tiny_checkpoint, corpus, tmp_path / "tb", output__tensorboard=True)
    assert from_config(shorthand).sinks == spec.sinks
    with pytest.raises(ConfigError, match="output.sinks: 'wandb' is not a sink"):
        from_config(config(tiny_checkpoint, corpus, tmp_path, output__sinks="tensorboard,wandb"))
    # Diagnostics are allowed (a run of one step and one dataset), no line per record is
    # printed, and the scalars and results.json are written.
    c.output.tokens = True
    found, lines = run(c)
    assert lines == []
    out = tmp_path / "tb"
    assert (out / files.TOKENS).exists() and found.results_path == str(out / files.RESULTS_JSON)
    name = found.evaluations[0].dataset.name
    scalars = scalars_in(str(out / files.TENSORBOARD))
    assert scalars[f"eval/{name}/perplexity", 5][0] == pytest.approx(
        found.results["perplexity"], rel=1e-6
    )
    # The same run again scores again (a single run skips nothing, whatever its sinks).
    again, lines = run(c)
    assert len(again.evaluations) == 1 and lines == []
    assert again.results["nll_sum"] == found.results["nll_sum"]


def test_a_stopped_run_with_tensorboard_keeps_a_single_runs_journal(
    tiny_checkpoint, corpus, tmp_path
):
    c = config(tiny_checkpoint, corpus, tmp_path, output__sinks="tensorboard")
    with pytest.raises(Interrupted, match=r"with \d+ of \d+ batches scored"):
        run(c, signal_after(2, signal.SIGTERM))
    assert (tmp_path / journal.NAME).exists()  # journal.npz, not a training run's journal-*.npz
    assert not (tmp_path / files.RESULTS_JSON).exists()  # a run that did not finish has none
    found, _ = run(c)
    assert found.evaluations[0].resumed_batches >= 2
    assert json.loads((tmp_path / files.RESULTS_JSON).read_text())["step"] == 5
    assert not (tmp_path / journal.NAME).exists()


class Recording:
    """A sink that keeps what it is given."""

    def __init__(self):
        self.written, self.steps, self.closed = [], [], False

    def write(self, records):
        self.written += records

    def end_step(self, step, records):
        self.steps.append((step, [r["dataset"] for r in records]))

    def close(self):
        self.closed = True

    def abort(self):
        self.closed = True


def test_the_evaluator_writes_only_to_the_sinks_it_is_given(tiny_checkpoint, corpus, tmp_path):
    ckpt = ppl_jax.open_checkpoint(tiny_checkpoint)
    model = architecture.resolve(ckpt).model()
    evaluator = ppl_jax.Evaluator(
        model,
        ppl_jax.make_mesh(-1, 1),
        [ppl_jax.DatasetSpec(name="a", path=corpus), ppl_jax.DatasetSpec(name="b", path=corpus)],
        ckpt.tokenizer(5),
        protocol=ppl_jax.ProtocolSpec(seq_len=32),
        compile=False,
    )
    params = ckpt.restore(5, evaluator.param_targets)
    before = sorted(os.listdir(tmp_path))
    scalars = evaluator(params, step=5)  # no sinks: nothing written anywhere
    assert sorted(os.listdir(tmp_path)) == before
    results = store.ResultsStore.in_dir(str(tmp_path))
    recording = Recording()
    assert evaluator(params, step=5, sinks=[sinks.StoreSink(results), recording]) == scalars
    kinds = [(r["kind"], r["dataset"]) for r in results.records()]
    assert kinds[:2] == [("dataset", "a"), ("dataset", "b")] and ("average", "micro") in kinds
    assert recording.written == results.records()
    assert recording.steps == [(5, [d for _, d in kinds])] and not recording.closed
    assert scalars["a/perplexity"] == results.records()[0]["metrics"]["perplexity"]
