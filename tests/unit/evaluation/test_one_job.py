"""The one job path: a single run is the one-step, one-dataset case of a training run, so a sweep
has every output a single run has, and both write the same records; the library's `Evaluator`
gives the per-token output and the KL of the command line."""

from __future__ import annotations

import json
import os

import numpy as np
import pyarrow.parquet as pq
import pytest

import ppl_jax
from ppl_jax.checkpoints import architecture
from ppl_jax.config.defaults import get_config
from ppl_jax.config.settings import from_config
from ppl_jax.evaluation import run as run_lib
from ppl_jax.metrics import uncertainty
from ppl_jax.outputs import files, sinks, store
from ppl_jax.outputs.folder import OutputDir
from ppl_jax.scoring.scorer import StepOptions

import helpers

# Today's keys of a single run's results.json (before the one job path), pinned.
SINGLE_RUN_KEYS = {
    "nll_sum", "num_tokens", "num_bytes", "num_words", "perplexity", "nll_per_token",
    "bits_per_token", "bits_per_byte", "byte_perplexity", "word_perplexity",
    "entropy_per_token", "predictive_perplexity", "top1_accuracy", "num_documents",
    "num_windows", "protocol", "text_tokens", "gzip_bits_per_byte", "gzip_sample_bytes",
    "intervals", "divergence", "context_curve", "tokens_per_second", "scoring_seconds",
    "host_seconds", "prepare_seconds", "compile_seconds", "wall_seconds", "checkpoint", "model",
    "attention", "attention_layers", "attention_note", "dtype", "quantization", "tokenizer", "tokenizer_source",
    "fingerprint",
    "resumed_batches",
    "data", "mesh", "num_processes", "run", "config", "notes",
}  # fmt: skip
# Today's keys of a sweep's results.json, pinned.
SWEEP_KEYS = {
    "step", "checkpoint", "datasets", "averages", "results_jsonl", "wall_seconds", "run", "config",
}  # fmt: skip
TIMINGS = {
    "tokens_per_second", "scoring_seconds", "host_seconds", "prepare_seconds",
    "compile_seconds", "wall_seconds", "time", "run", "timing",
}  # fmt: skip


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> str:
    return helpers.corpus_files(
        tmp_path_factory.mktemp("one_job"), [helpers.stdlib_text(3000), helpers.stdlib_text(1500)]
    )


def config(checkpoint: str, corpus: str, out, **overrides):
    c = get_config()
    c.checkpoint.dir, c.data.path, c.output.dir = checkpoint, corpus, str(out)
    c.eval.seq_len, c.eval.batch_size, c.output.progress = 32, 8, False
    c.metrics.bootstrap_samples = 200
    for key, value in overrides.items():
        section, name = key.split("__")
        setattr(getattr(c, section), name, value)
    return c


def run(c) -> tuple[run_lib.RunResult, str]:
    """The run as the command line runs it (`run` writes every file, results.json last)."""
    spec = from_config(c)
    with OutputDir.open(spec.output_dir) as out:
        found = run_lib.run(
            spec, out, printer=lambda line: None, config=json.loads(c.to_json_best_effort())
        )
    assert found.results_path == os.path.join(spec.output_dir, files.RESULTS_JSON)
    return found, spec.output_dir


def without_timings(record: dict) -> dict:
    details = {k: v for k, v in record["details"].items() if k not in TIMINGS}
    return {**{k: v for k, v in record.items() if k not in TIMINGS}, "details": details}


def test_a_sweep_has_every_output_of_a_single_run_and_the_same_records(
    tiny_checkpoint, corpus, tmp_path
):
    cache = tmp_path / "xla_cache"
    swept, sweep_dir = run(
        config(
            tiny_checkpoint, corpus, tmp_path / "sweep", checkpoint__step="all",
            runtime__compilation_cache_dir=str(cache),
        )
    )  # fmt: skip
    single, single_dir = run(
        config(tiny_checkpoint, corpus, tmp_path / "one", checkpoint__step="5")
    )
    # The sweep honours the compilation cache (it ignored it before the one job path).
    assert cache.is_dir() and os.listdir(cache)
    records = {r["step"]: r for r in store.ResultsStore.in_dir(sweep_dir).records()}
    assert set(records) == {3, 5}
    for record in records.values():
        d = record["details"]
        assert d["intervals"] is not None and len(d["intervals"]["perplexity"]) == 2
        lo, hi = d["intervals"]["perplexity"]
        assert lo < record["metrics"]["perplexity"] < hi
        assert 0 < d["gzip_bits_per_byte"] < 8
    # The same step and dataset: identical records, identical per-unit sums.
    (one,) = store.ResultsStore.in_dir(single_dir).records()
    assert without_timings(one) == without_timings(records[5])
    # (a sweep keeps every step's units: units-step5.npz is step 5's)
    a, ident_a = uncertainty.read_npz(os.path.join(sweep_dir, files.units_name(None, 5, True)))
    b, ident_b = uncertainty.read_npz(os.path.join(single_dir, files.UNITS))
    assert np.array_equal(a.nll, b.nll) and np.array_equal(a.tokens, b.tokens)
    assert ident_a == ident_b
    # results.json, written by the run itself (not by the command line), keeps the keys each
    # path wrote before, for both; it is what the run returns.
    for folder, found in ((sweep_dir, swept), (single_dir, single)):
        with open(os.path.join(folder, files.RESULTS_JSON), encoding="utf-8") as f:
            written = json.load(f)
        assert SINGLE_RUN_KEYS | SWEEP_KEYS <= set(written), sorted(
            SINGLE_RUN_KEYS | SWEEP_KEYS - set(written)
        )
        assert written == json.loads(json.dumps(found.results))
        # The kernel each kind of layer ran: GPT-2's one kind, the flash kernel on the CPU.
        assert written["attention"] == "xla" and written["attention_layers"] == {"attention": "xla"}
    assert single.results["perplexity"] == records[5]["metrics"]["perplexity"]


def test_the_evaluator_gives_the_per_token_output_and_kl_of_the_cli(
    tiny_checkpoint, corpus, tmp_path
):
    """A training loop's Evaluator, with the step options of the CLI's diagnostics, equals the
    CLI: per-token NLL as in tokens.parquet, and KL(reference || model) as in results.json."""
    reference = str(tmp_path / "reference")
    helpers.save_random_checkpoint(reference, seed=7)
    c = config(tiny_checkpoint, corpus, tmp_path / "cli", checkpoint__step="5", output__tokens=True)
    c.reference.checkpoint.dir = reference
    found, folder = run(c)
    cli_kl = found.results["divergence"]["kl_mean"]
    table = pq.read_table(os.path.join(folder, files.TOKENS))

    ckpt, ref = ppl_jax.open_checkpoint(tiny_checkpoint), ppl_jax.open_checkpoint(reference)
    model, ref_model = architecture.resolve(ckpt).model(), architecture.resolve(ref).model()
    mesh = ppl_jax.make_mesh(-1, 1)
    evaluator = ppl_jax.Evaluator(
        model, mesh,
        [ppl_jax.DatasetSpec(path=corpus)],
        ckpt.tokenizer(5),
        protocol=ppl_jax.ProtocolSpec(seq_len=32),
        batch=ppl_jax.BatchSpec(batch_size=8),
        options=StepOptions(per_token=True, reference=True),
        reference=ref_model,
    )  # fmt: skip
    params = ckpt.restore(5, evaluator.param_targets)
    ref_params = ref.restore(None, evaluator.reference_targets)
    written = []

    class Records:  # a sink: the records a training loop's store or TensorBoard receives
        def write(self, records):
            written.extend(records)

        def end_step(self, step, records):
            pass

        def close(self):
            pass

    scalars = evaluator(params, step=5, reference_params=ref_params, sinks=[Records()])
    name = evaluator.datasets[0].name
    assert np.isclose(scalars[f"{name}/kl/kl_mean"], cli_kl, rtol=1e-12, atol=0)
    (record,) = written  # the record holds the KL too, as results.json does
    assert np.isclose(record["details"]["divergence"]["kl_mean"], cli_kl, rtol=1e-12, atol=0)
    assert np.isclose(scalars[f"{name}/perplexity"], found.results["perplexity"], rtol=1e-12)
    nll = []

    class Tokens:  # an observer of the loop: the per-token arrays of each batch
        def should_stop(self, i):
            return False

        def on_batch(self, i, rows, host):
            nll.append(host.extras["nll"][host.extras["scored"]])

        def close(self):
            pass

    evaluator.score((params, ref_params), evaluator.datasets[0], [Tokens()])
    ours = np.sort(np.concatenate(nll).astype(np.float64))
    assert ours.size == table.num_rows
    np.testing.assert_allclose(
        ours, np.sort(table.column("nll").to_numpy().astype(np.float64)), rtol=0, atol=0
    )


def test_a_training_loops_records_are_the_command_lines_and_it_resumes_them(
    tiny_checkpoint, corpus, tmp_path
):
    """The library's loop (`evaluator(params, step, sinks=[StoreSink(...)])`) writes the records
    the command line writes for the same run, fingerprint and details included; the command
    line run on the loop's folder finds every pair done and scores nothing."""
    ckpt = ppl_jax.open_checkpoint(tiny_checkpoint)
    tags = {"b": "domain=code"}
    evaluator = ppl_jax.Evaluator(
        architecture.resolve(ckpt).model(), ppl_jax.make_mesh(-1, 1),
        [ppl_jax.DatasetSpec(name=n, path=corpus, tags=tags.get(n, "")) for n in ("a", "b")],
        ckpt.tokenizer(5),
        protocol=ppl_jax.ProtocolSpec(seq_len=32), batch=ppl_jax.BatchSpec(batch_size=8),
        checkpoint=ckpt, bootstrap_samples=200,
    )  # fmt: skip
    loop_dir = tmp_path / "loop"
    loop_dir.mkdir()
    loop_store = store.ResultsStore.in_dir(str(loop_dir))
    params = ckpt.restore(5, evaluator.param_targets)
    scalars = evaluator(params, 5, sinks=[sinks.StoreSink(loop_store)])
    written = loop_store.records()
    assert [(r["kind"], r["dataset"]) for r in written][:2] == [("dataset", "a"), ("dataset", "b")]

    def cli(out):
        c = config(tiny_checkpoint, corpus, out, checkpoint__step="5", output__gzip_baseline=False)
        c.suite = [dict(name=n, path=corpus, tags=tags.get(n, "")) for n in ("a", "b")]
        return run(c)

    found, cli_dir = cli(tmp_path / "cli")
    theirs = store.ResultsStore.in_dir(cli_dir).records()
    assert len(theirs) == len(written) and {r["kind"] for r in theirs} == {"dataset", "average"}
    for ours, their in zip(written, theirs, strict=True):
        if ours["kind"] == "dataset":
            assert ours["fingerprint"] and ours["fingerprint"] == their["fingerprint"]
            assert without_timings(ours) == without_timings(their)
        else:
            assert {k: v for k, v in ours.items() if k not in TIMINGS} == {
                k: v for k, v in their.items() if k not in TIMINGS
            }
    assert scalars["a/perplexity"] == found.results["datasets"]["a"]["metrics"]["perplexity"]
    # The command line resumes the loop's folder: every pair is done, nothing is scored again.
    again, _ = cli(loop_dir)
    assert again.evaluations == [] and loop_store.records() == written
    assert again.results["datasets"]["a"]["fingerprint"] == written[0]["fingerprint"]
