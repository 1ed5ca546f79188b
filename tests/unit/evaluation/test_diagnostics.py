"""Issue 9's diagnostics end to end: per-token output, loss by position, the context-length sweep
and the divergence from a reference model, each checked against an independent NumPy float64
computation from the full logits of a tiny model (`helpers.reference_logits`)."""

from __future__ import annotations

import json

import jax
import numpy as np
import pyarrow.parquet as pq  # noqa: E402  (the `test` extra installs it)
import pytest

from ppl_jax.checkpoints import architecture
from ppl_jax.checkpoints.formats import orbax as checkpoint
from ppl_jax.config.defaults import get_config
from ppl_jax.config.settings import from_config
from ppl_jax.errors import ConfigError
from ppl_jax.evaluation.run import evaluate
from ppl_jax.evaluation.spec import RunSpec
from ppl_jax.outputs.folder import OutputDir

import helpers


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> str:
    text = helpers.stdlib_text(1500)
    half = len(text) // 2
    return helpers.corpus_files(tmp_path_factory.mktemp("corpus"), [text[:half], text[half:]])


@pytest.fixture(scope="module")
def other_checkpoint(tmp_path_factory) -> str:
    """The tiny Llama of `tiny_checkpoint` with other random weights (seed 1)."""
    path = str(tmp_path_factory.mktemp("other") / "tiny")
    helpers.save_random_checkpoint(path, steps=(5,), seed=1)
    return path


def settings(checkpoint_dir: str, corpus: str, out, **overrides) -> RunSpec:
    c = get_config()
    c.checkpoint.dir = checkpoint_dir
    c.data.path = corpus
    c.eval.seq_len = 48
    c.eval.stride = 20
    c.eval.batch_size = 8
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


def run(s: RunSpec):
    out = OutputDir.open(s.output_dir)
    try:
        return evaluate(s, out=out)
    finally:
        out.close()


def host_params(path: str) -> dict:
    from ppl_jax.checkpoints import open_checkpoint
    from ppl_jax.runtime.mesh import DEFAULT_RULES, make_mesh, param_targets

    ckpt = open_checkpoint(path)
    model = architecture.resolve(ckpt).model()
    target, _ = param_targets(
        model.abstract_params, model.logical_axes, make_mesh(-1, 1), DEFAULT_RULES
    )
    return jax.device_get(ckpt.restore(None, target))


def log_softmax(logits: np.ndarray) -> np.ndarray:
    m = logits.max(-1, keepdims=True)
    return logits - (m + np.log(np.exp(logits - m).sum(-1, keepdims=True)))


def numpy_targets(ev, params: dict) -> dict[int, np.ndarray]:
    """Global token index -> log-probabilities `[vocab]` (NumPy float64, full logits) of the
    distribution that predicts it, from each window of the run's plan."""
    w = ev.plan.windows
    found = {}
    for k in range(w.num_windows):
        start, n = int(w.starts[k]), int(w.lengths[k])
        row = w.tokens[start : start + n]
        logp = log_softmax(helpers.reference_logits(params, helpers.TINY, row[:-1]))
        for p in range(int(w.first_scored[k]), n):
            found[start + p] = logp[p - 1]
    return found


def test_tokens_equal_numpy_from_full_logits(tiny_checkpoint, corpus, tmp_path):
    ev = run(settings(tiny_checkpoint, corpus, tmp_path, output__tokens=True, output__top_k=5))
    table = pq.read_table(ev.diagnostics["tokens_file"]).to_pydict()
    n = ev.sums.num_tokens
    assert len(table["nll"]) == n
    # The per-token NLLs add up to the run's NLL (float64 sums of the same float32 values).
    assert np.isclose(np.sum(np.asarray(table["nll"], np.float64)), ev.sums.nll_sum, rtol=1e-12)
    expected = numpy_targets(ev, host_params(tiny_checkpoint))
    starts = ev.plan.doc_starts
    g = starts[np.asarray(table["document"])] + np.asarray(table["offset"])
    assert sorted(g.tolist()) == sorted(expected)  # every scored token once
    stream = ev.plan.windows.tokens
    assert np.array_equal(np.asarray(table["token_id"]), stream[g])
    for i, gi in enumerate(g.tolist()):
        logp = expected[gi]
        assert abs(table["nll"][i] + logp[stream[gi]]) < 1e-5
        top = np.argsort(-logp, kind="stable")[:5]
        assert table["top_ids"][i] == top.tolist()
        np.testing.assert_allclose(table["top_probs"][i], np.exp(logp[top]), atol=1e-6)
        assert table["correct"][i] == (top[0] == stream[gi])
    assert np.allclose(table["surprisal"], np.asarray(table["nll"]) / np.log(2), rtol=1e-6)


def test_divergence_equals_numpy_from_both_models_logits(
    tiny_checkpoint, other_checkpoint, corpus, tmp_path
):
    ev = run(
        settings(
            tiny_checkpoint,
            corpus,
            tmp_path,
            output__tokens=True,
            reference__checkpoint__dir=other_checkpoint,
            mesh__data=4,
            mesh__model=2,  # both models' weights sharded on the model axis (vocab, heads, mlp)
        )
    )
    assert ev.mesh_shape == {"data": 4, "model": 2}
    table = pq.read_table(ev.diagnostics["tokens_file"]).to_pydict()
    model = numpy_targets(ev, host_params(tiny_checkpoint))
    reference = numpy_targets(ev, host_params(other_checkpoint))
    g = ev.plan.doc_starts[np.asarray(table["document"])] + np.asarray(table["offset"])
    stream = ev.plan.windows.tokens
    kl = []
    for i, gi in enumerate(g.tolist()):
        p, q = reference[gi], model[gi]
        kl.append(np.sum(np.exp(p) * (p - q)))
        assert abs(table["kl"][i] - kl[-1]) < 1e-5
        assert abs(table["reference_nll"][i] + p[stream[gi]]) < 1e-5
        assert table["same_top1"][i] == (np.argmax(p) == np.argmax(q))
    d = ev.diagnostics["divergence"]
    assert d["num_tokens"] == len(kl) == ev.sums.num_tokens
    assert np.isclose(d["kl_mean"], np.mean(kl), rtol=1e-5)
    assert np.isclose(d["kl_median"], np.median(kl), rtol=1e-5)
    assert np.isclose(d["kl_max"], np.max(kl), rtol=1e-5)
    assert np.isclose(d["same_top1"], np.mean(table["same_top1"]))
    ref_nll = -np.mean([reference[gi][stream[gi]] for gi in g.tolist()])
    assert np.isclose(d["reference_perplexity"], np.exp(ref_nll), rtol=1e-5)
    assert np.isclose(d["perplexity"], ev.metrics["perplexity"], rtol=1e-9)


def test_a_model_against_itself_has_no_divergence(tiny_checkpoint, corpus, tmp_path):
    ev = run(
        settings(tiny_checkpoint, corpus, tmp_path, reference__checkpoint__dir=tiny_checkpoint)
    )
    d = ev.diagnostics["divergence"]
    assert d["num_tokens"] == ev.sums.num_tokens
    assert abs(d["kl_max"]) <= 1e-6 and abs(d["kl_mean"]) <= 1e-6
    assert d["same_top1"] == 1.0
    assert np.isclose(d["perplexity_ratio"], 1.0, rtol=1e-6)
    assert "tokens_file" not in ev.diagnostics  # no token file was asked for


def test_position_curve_adds_up_and_context_sweep_scores_the_same_targets(
    tiny_checkpoint, corpus, tmp_path
):
    plain = run(settings(tiny_checkpoint, corpus, tmp_path / "plain"))
    ev = run(
        settings(
            tiny_checkpoint,
            corpus,
            tmp_path / "diag",
            output__position_curve=True,
            eval__context_lengths="4,16,40",
            eval__context_targets=8,
        )
    )
    # The position sums do not change the run's numbers.
    assert ev.sums.nll_sum == plain.sums.nll_sum
    totals = ev.totals
    assert totals.tokens_by_position.sum() == ev.sums.num_tokens
    assert np.isclose(totals.nll_by_position.sum(), ev.sums.nll_sum, rtol=1e-6)
    # Independently: each window's targets sit at row positions first_scored..length-1.
    w = ev.plan.windows
    counts = np.zeros(w.seq_len + 1, np.int64)
    for k in range(w.num_windows):
        counts[int(w.first_scored[k]) : int(w.lengths[k])] += 1
    assert np.array_equal(totals.tokens_by_position, counts)
    curve = ev.diagnostics["position_curve"]
    assert sum(b["num_tokens"] for b in curve["buckets"]) == ev.sums.num_tokens
    # The sweep: the same targets (the stream from token 40 on) at every context length.
    sweep = ev.diagnostics["context_curve"]
    rows = sweep["context_lengths"]
    assert [r["context_length"] for r in rows] == [4, 16, 40]
    assert {r["num_tokens"] for r in rows} == {w.tokens.size - 40}
    # Against NumPy: the sweep's NLL at context 4 from the full logits.
    params = host_params(tiny_checkpoint)
    nll = 0.0
    for a in range(40, w.tokens.size, 8):
        row = w.tokens[a - 4 : a + 8]
        logp = log_softmax(helpers.reference_logits(params, helpers.TINY, row[:-1]))
        nll -= sum(logp[p - 1, row[p]] for p in range(4, row.size))
    assert np.isclose(rows[0]["nll_sum"], nll, rtol=1e-5)


@pytest.mark.slow
def test_demo_model_loss_falls_with_context_and_bfloat16_drifts_a_little(demo_checkpoint, tmp_path):
    """The command line with every diagnostic on, the demo checkpoint against itself in
    bfloat16: the files are written, the curve falls, and the KL is small but positive."""
    from test_cli import run_cli

    corpus = helpers.corpus_files(tmp_path, [helpers.stdlib_text(6000)])
    proc, r = run_cli(
        f"--config.data.path={corpus}",
        "--config.eval.seq_len=128",
        "--config.eval.stride=128",
        "--config.output.tokens=true",
        "--config.output.top_k=3",
        "--config.output.position_curve=true",
        "--config.eval.context_lengths=4,32,96",
        f"--config.reference.checkpoint.dir={demo_checkpoint}",
        "--config.reference.dtype=bfloat16",
        tmp_path=tmp_path,
    )
    out = tmp_path / "out"
    for name in ("tokens.parquet", "position_curve.png", "context_curve.png"):
        assert (out / name).stat().st_size > 1000, name
    assert not (out / "journal.npz").exists()
    curve = json.loads((out / "position_curve.json").read_text())["buckets"]
    early = [b for b in curve if b["last"] <= 4]
    late = [b for b in curve if b["first"] >= 64]
    assert early and late
    mean = lambda bs: sum(b["nll_sum"] for b in bs) / sum(b["num_tokens"] for b in bs)  # noqa: E731
    assert mean(late) < mean(early)
    ppl = [row["perplexity"] for row in r["context_curve"]["context_lengths"]]
    assert ppl[0] > ppl[1] > ppl[2]
    d = r["divergence"]
    assert 0 < d["kl_mean"] < 0.05 and d["same_top1"] > 0.9
    assert "divergence from" in proc.stdout and "context" in proc.stdout
    # The token view of the file the run wrote: its metadata names the protocol and documents.
    from ppl_jax.analysis import view

    _, page = view.view(str(out))
    assert page["runs"][0]["protocol"] == "sliding"
    assert page["documents"][0]["source"] == corpus
    shown = page["documents"][0]
    table = pq.read_table(out / "tokens.parquet").to_pydict()
    first = {o: i for i, o in enumerate(table["offset"])}
    i = first[shown["offset"][0]]
    assert shown["id"][0] == table["token_id"][i]
    assert abs(shown["sides"][0]["surprisal"][0] - table["surprisal"][i]) < 1e-3


def test_settings_refused_before_any_work(tiny_checkpoint, corpus, tmp_path):
    with pytest.raises(ConfigError, match="output.tokens=true"):
        settings(tiny_checkpoint, corpus, tmp_path, output__top_k=3)
    with pytest.raises(ConfigError, match="0..20"):
        settings(tiny_checkpoint, corpus, tmp_path, output__tokens=True, output__top_k=21)
    with pytest.raises(ConfigError, match="eval.context_lengths"):
        settings(tiny_checkpoint, corpus, tmp_path, eval__context_lengths="64,x")
    with pytest.raises(ConfigError, match="stream protocol"):
        settings(
            tiny_checkpoint,
            corpus,
            tmp_path,
            eval__protocol="lm_eval_rolling",
            eval__context_lengths="8",
        )
    with pytest.raises(ConfigError, match="positions"):
        run(settings(tiny_checkpoint, corpus, tmp_path, eval__context_lengths="129"))


def test_a_reference_with_another_vocabulary_is_refused_before_weights(
    tiny_checkpoint, corpus, tmp_path, monkeypatch
):
    import dataclasses

    other = str(tmp_path / "other")
    helpers.save_random_checkpoint(other, dataclasses.replace(helpers.TINY, vocab_size=300))
    monkeypatch.setattr(
        checkpoint, "restore_params", lambda *a: pytest.fail("weights read before the check")
    )
    with pytest.raises(ConfigError, match="300 token ids"):
        run(settings(tiny_checkpoint, corpus, tmp_path, reference__checkpoint__dir=other))
