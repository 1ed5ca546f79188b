"""Issue 37 item 5: a quantization study in one pass (`study.copies`). The original and its copies
are scored in the same step; each copy's per-token KL, NLL, same top-1 and delta p equal those
of a separate run with the original as the reference model, and an independent NumPy float64
computation from both models' full logits; a copy against itself has no divergence; a copy of
another vocabulary is refused before any weight is read."""

from __future__ import annotations

import dataclasses
import json
import os
import types

import jax
import numpy as np
import optax
import pyarrow.parquet as pq
import pytest

from ppl_jax.checkpoints.formats import orbax as checkpoint
from ppl_jax.config.defaults import get_config
from ppl_jax.config.settings import from_config
from ppl_jax.errors import ConfigError
from ppl_jax.evaluation.run import evaluate
from ppl_jax.metrics import study
from ppl_jax.outputs import console
from ppl_jax.outputs.folder import OutputDir

import helpers


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> str:
    text = helpers.stdlib_text(1200)
    half = len(text) // 2
    return helpers.corpus_files(tmp_path_factory.mktemp("corpus"), [text[:half], text[half:]])


def perturbed(path: str, scale: float, seed: int) -> dict:
    """The tiny Llama of `tiny_checkpoint` (seed 0) with Gaussian noise of `scale` times each
    weight's RMS added, saved at step 5: a stand-in for a quantized copy. Returns its params."""
    rng = np.random.default_rng(seed)

    def noisy(x):
        x = np.asarray(x, np.float32)
        noise = rng.standard_normal(x.shape).astype(np.float32)
        return x + np.float32(scale * np.sqrt(np.mean(x * x))) * noise

    params = jax.tree.map(noisy, helpers.random_params(helpers.TINY, 0))
    checkpoint.save_train_state(
        path,
        5,
        {"step": 5, "params": params, "opt_state": optax.adamw(1e-3).init(params)},
        {"model": helpers.TINY.to_dict(), "tokenizer": {"type": "byte"}},
    )
    return params


COPIES = {"q8": (0.02, 1), "q4": (0.2, 2)}  # name: (noise scale, seed)


@pytest.fixture(scope="module")
def copies(tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("copies")
    found = {}
    for name, (scale, seed) in COPIES.items():
        found[name] = str(root / name)
        PARAMS[name] = perturbed(found[name], scale, seed)
    return found


PARAMS: dict[str, dict] = {}  # the copies' params, by name (`copies`)


def config(checkpoint_dir: str, corpus: str, out, **overrides):
    c = get_config()
    c.checkpoint.dir = checkpoint_dir
    c.data.path = corpus
    c.eval.seq_len = 48
    c.eval.stride = 24
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
    return c


def run(c):
    spec = from_config(c)
    out = OutputDir.open(spec.output_dir)
    try:
        return evaluate(spec, out=out)
    finally:
        out.close()


@pytest.fixture(scope="module")
def one_pass(tiny_checkpoint, copies, corpus, tmp_path_factory):
    """The study: the two copies and the original itself as a third copy, both directions, the
    per-token layers in chunks of 16 tokens (as the separate runs compared with it)."""
    listed = ",".join(f"{k}={v}" for k, v in copies.items()) + f",same={tiny_checkpoint}"
    out = tmp_path_factory.mktemp("study")
    c = config(tiny_checkpoint, corpus, out, output__tokens=True, metrics__bootstrap_samples=200)
    c.model.token_chunk = 16
    c.study.copies = listed
    c.study.both_directions = True
    ev = run(c)
    return ev, out


def keyed(table: dict, columns: list[str]) -> dict[str, np.ndarray]:
    """The columns in (document, offset) order."""
    order = np.lexsort((np.asarray(table["offset"]), np.asarray(table["document"])))
    return {k: np.asarray(table[k])[order] for k in columns}


def test_each_copy_equals_a_separate_run_with_the_original_as_reference(
    one_pass, tiny_checkpoint, copies, corpus, tmp_path
):
    ev, out = one_pass
    table = pq.read_table(out / "tokens.parquet").to_pydict()
    ours = keyed(table, list(table))
    for name, path in [("q4", copies["q4"])]:  # (q8 is checked against NumPy below)
        c = config(path, corpus, tmp_path / name, output__tokens=True, model__token_chunk=16)
        c.reference.checkpoint.dir = tiny_checkpoint  # KL(original || copy), the copy scored
        alone = run(c)
        other = keyed(pq.read_table(alone.diagnostics["tokens_file"]).to_pydict(), list(table)[:6] + ["nll", "kl", "same_top1", "reference_nll"])  # fmt: skip
        assert np.array_equal(other["token_id"], ours["token_id"])
        np.testing.assert_allclose(ours[f"kl/{name}"], other["kl"], rtol=1e-6, atol=1e-9)
        np.testing.assert_allclose(ours[f"nll/{name}"], other["nll"], rtol=1e-6)
        np.testing.assert_allclose(ours["nll"], other["reference_nll"], rtol=1e-6)
        assert np.array_equal(ours[f"same_top1/{name}"], other["same_top1"])
        d = alone.diagnostics["divergence"]
        s = ev.diagnostics["study"]["copies"][name]
        assert np.isclose(s["kl_mean"], d["kl_mean"], rtol=1e-6)
        assert np.isclose(s["same_top1"], d["same_top1"], rtol=1e-12)
        assert np.isclose(s["perplexity"], d["perplexity"], rtol=1e-6)
    # KL(copy || original): the original scored with the copy as its reference.
    c = config(
        tiny_checkpoint, corpus, tmp_path / "reverse", output__tokens=True, model__token_chunk=16
    )
    c.reference.checkpoint.dir = copies["q4"]
    alone = run(c)
    other = keyed(pq.read_table(alone.diagnostics["tokens_file"]).to_pydict(), ["kl"])
    np.testing.assert_allclose(ours["kl_reverse/q4"], other["kl"], rtol=1e-6, atol=1e-9)


@pytest.mark.slow  # the context axis's own equality is the scorer's; this is the study's on it
def test_the_study_under_a_context_axis_equals_the_one_without(
    one_pass, tiny_checkpoint, copies, corpus, tmp_path
):
    """The copies' per-token arrays leave the step in row order under `mesh.context` too."""
    _, out = one_pass
    c = config(tiny_checkpoint, corpus, tmp_path, output__tokens=True, model__token_chunk=16)
    c.mesh.data, c.mesh.context = 4, 2
    c.study.copies = f"q4={copies['q4']}"
    ev = run(c)
    assert ev.mesh_shape == {"data": 4, "context": 2, "model": 1}
    columns = ["document", "offset", "token_id", "nll/q4", "kl/q4", "same_top1/q4"]
    split = keyed(pq.read_table(ev.diagnostics["tokens_file"]).to_pydict(), columns)
    whole = keyed(pq.read_table(out / "tokens.parquet").to_pydict(), columns)
    assert np.array_equal(split["token_id"], whole["token_id"])
    np.testing.assert_allclose(split["kl/q4"], whole["kl/q4"], rtol=1e-4, atol=1e-7)
    np.testing.assert_allclose(split["nll/q4"], whole["nll/q4"], rtol=1e-5)
    assert np.mean(split["same_top1/q4"] == whole["same_top1/q4"]) > 0.99


def log_softmax(x: np.ndarray) -> np.ndarray:
    m = x.max(-1, keepdims=True)
    return x - (m + np.log(np.exp(x - m).sum(-1, keepdims=True)))


def numpy_log_probs(ev, params) -> dict[int, np.ndarray]:
    """Global token index -> float64 log-probabilities from the full logits of each window."""
    w = ev.plan.windows
    found = {}
    for k in range(w.num_windows):
        start, n = int(w.starts[k]), int(w.lengths[k])
        row = w.tokens[start : start + n]
        logp = log_softmax(helpers.reference_logits(params, helpers.TINY, row[:-1]))
        for p in range(int(w.first_scored[k]), n):
            found[start + p] = logp[p - 1]
    return found


def test_the_one_pass_equals_numpy_float64_from_full_logits(one_pass, copies):
    ev, out = one_pass
    table = pq.read_table(out / "tokens.parquet").to_pydict()
    g = ev.plan.doc_starts[np.asarray(table["document"])] + np.asarray(table["offset"])
    stream = ev.plan.windows.tokens
    original = numpy_log_probs(ev, helpers.random_params(helpers.TINY, 0))
    summary = ev.diagnostics["study"]
    for name in copies:
        copy = numpy_log_probs(ev, PARAMS[name])
        kl, dp, same, rev = [], [], [], []
        for i, gi in enumerate(g.tolist()):
            p, q, t = original[gi], copy[gi], stream[gi]
            kl.append(np.sum(np.exp(p) * (p - q)))
            rev.append(np.sum(np.exp(q) * (q - p)))
            dp.append(np.exp(q[t]) - np.exp(p[t]))
            same.append(np.argmax(p) == np.argmax(q))
            assert abs(table[f"nll/{name}"][i] + q[t]) < 1e-5
        np.testing.assert_allclose(table[f"kl/{name}"], kl, rtol=1e-4, atol=1e-6)
        np.testing.assert_allclose(table[f"kl_reverse/{name}"], rev, rtol=1e-4, atol=1e-6)
        np.testing.assert_allclose(table[f"delta_p/{name}"], dp, atol=1e-6)
        assert np.array_equal(table[f"same_top1/{name}"], same)
        s = summary["copies"][name]
        assert np.isclose(s["kl_mean"], np.mean(kl), rtol=1e-5)
        assert np.isclose(s["kl_p99.9"], np.quantile(kl, 0.999), rtol=1e-4)
        assert np.isclose(s["kl_median"], np.median(kl), rtol=1e-4)
        assert np.isclose(s["kl_max"], np.max(kl), rtol=1e-5)
        assert np.isclose(s["delta_p_rms"], np.sqrt(np.mean(np.square(dp))), rtol=1e-4)
        assert np.isclose(s["delta_p_mean"], np.mean(dp), rtol=1e-4, atol=1e-8)
        assert np.isclose(s["same_top1"], np.mean(same))
        nll_o = -np.sum([original[gi][stream[gi]] for gi in g.tolist()])
        nll_c = -np.sum([copy[gi][stream[gi]] for gi in g.tolist()])
        assert np.isclose(s["perplexity_ratio"], np.exp((nll_c - nll_o) / len(g)), rtol=1e-5)
        lo, hi = s["perplexity_ratio_interval"]
        assert lo <= s["perplexity_ratio"] <= hi
        assert -1 <= s["ln_perplexity_correlation"] <= 1
    assert summary["copies"]["q4"]["kl_mean"] > 10 * summary["copies"]["q8"]["kl_mean"] > 0
    assert np.isclose(summary["original"]["perplexity"], ev.metrics["perplexity"], rtol=1e-9)


def test_a_copy_against_itself_has_no_divergence(one_pass):
    ev, out = one_pass
    s = ev.diagnostics["study"]["copies"]["same"]
    assert s["kl_max"] == 0.0 and s["kl_mean"] == 0.0 and s["kl_reverse_max"] == 0.0
    assert s["same_top1"] == 1.0
    # Its NLL is the same float32 computation in another scan: equal to rounding.
    assert s["delta_p_rms"] < 1e-9 and abs(s["delta_bits_per_byte"]) < 1e-9
    assert abs(s["perplexity_ratio"] - 1) < 1e-9
    table = pq.read_table(out / "tokens.parquet", columns=["kl/same", "nll", "nll/same"])
    assert not np.any(table.column("kl/same").to_numpy())
    np.testing.assert_allclose(table.column("nll/same"), table.column("nll"), rtol=1e-6)


def test_results_study_json_and_the_table(one_pass):
    ev, out = one_pass
    results = json.loads((out / "results.json").read_text())
    written = json.loads((out / "study.json").read_text())
    assert written == results["study"]
    assert written["names"] == ["q8", "q4", "same"] == list(ev.diagnostics["study"]["copies"])
    assert written["copies"]["q8"]["restore_seconds"] > 0
    assert (out / "study_kl.png").stat().st_size > 1000  # the KL quantiles per copy
    assert results["timing"]["copies_restore_seconds"] > 0
    text = console.summary_table(results)
    header = next(line for line in text.splitlines() if line.startswith("| model"))
    assert [c.strip() for c in header.strip("|").split("|")] == list(study.COLUMNS)
    rows = [line for line in text.splitlines() if line.startswith("| ") and "---" not in line]
    assert [r.split("|")[1].strip() for r in rows[1:]] == ["original", "q8", "q4", "same"]
    assert all(len(r.split("|")) == len(study.COLUMNS) + 2 for r in rows)


def test_a_copy_of_another_vocabulary_is_refused_before_any_weight(
    tiny_checkpoint, corpus, tmp_path, monkeypatch, capsys
):
    from ppl_jax.cli import job

    other = str(tmp_path / "wide")
    helpers.save_random_checkpoint(other, dataclasses.replace(helpers.TINY, vocab_size=300))
    monkeypatch.setattr(
        checkpoint, "restore_params", lambda *a: pytest.fail("weights read before the check")
    )
    out = tmp_path / "out"
    c = config(tiny_checkpoint, corpus, out, output__tokens=True)
    c.study.copies = f"fine={tiny_checkpoint},wide={other}"
    with pytest.raises(SystemExit) as exit_:
        job.main(["ppl-jax"], types.SimpleNamespace(value=c))
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        f"ppl-jax: error: the copy 'wide' in {other!r} scores 300 token ids and the original "
        f"256; a study compares models of one tokenizer and vocabulary, so score that copy on "
        f"its own."
    )
    assert not [f for f in os.listdir(out) if not f.startswith(".")]


def test_a_copy_with_another_tokenizer_of_the_same_size_is_refused(
    tiny_checkpoint, corpus, tmp_path, monkeypatch
):
    from ppl_jax import tokenizer

    bpe = helpers.train_bpe([helpers.stdlib_text(3000)], vocab_size=256, specials=())
    desc = {"type": "hf", "name": "tokenizer.json", "tokenizer_json": bpe.to_str()}
    assert tokenizer.from_description(desc).vocab_size == 256  # the original's size (byte ids)
    other = str(tmp_path / "bpe")
    helpers.save_random_checkpoint(other, tokenizer=desc)
    monkeypatch.setattr(
        checkpoint, "restore_params", lambda *a: pytest.fail("weights read before the check")
    )
    c = config(tiny_checkpoint, corpus, tmp_path / "out")
    c.study.copies = f"bpe={other}"
    with pytest.raises(ConfigError) as found:
        run(c)
    assert str(found.value) == (
        f"the copy 'bpe' in {other!r} has another tokenizer (hf tokenizer.json) than the "
        f"original's (byte), though both have 256 ids; a study compares models on the same "
        f"token ids, so score that copy on its own."
    )


def test_study_settings_are_checked(tiny_checkpoint, corpus, tmp_path):
    c = config(tiny_checkpoint, corpus, tmp_path)
    c.study.copies = f"a={tiny_checkpoint},a={tiny_checkpoint}"
    with pytest.raises(ConfigError, match="names 'a' twice"):
        from_config(c)
    c.study.copies = f"original={tiny_checkpoint}"
    with pytest.raises(ConfigError, match="NAME=DIR"):
        from_config(c)
    c.study.copies = f"a={tiny_checkpoint}"
    c.reference.checkpoint.dir = tiny_checkpoint
    with pytest.raises(ConfigError, match="unset one of them"):
        from_config(c)


def test_the_token_view_shows_a_chosen_copys_kl(one_pass, tmp_path):
    from ppl_jax.analysis import view
    from ppl_jax.errors import DataError

    _, out = one_pass
    _, page = view.view(str(out), out=str(tmp_path / "v.html"), copy="q4")
    assert page["runs"][0]["reference"]
    table = pq.read_table(out / "tokens.parquet").to_pydict()
    at = {
        (d, o): i for i, (d, o) in enumerate(zip(table["document"], table["offset"], strict=True))
    }
    shown = page["documents"][0]
    kl = [table["kl/q4"][at[(shown["document"], o)]] for o in shown["offset"]]
    np.testing.assert_allclose(shown["sides"][0]["kl"], kl, atol=1e-4)
    assert max(kl) > 0
    with pytest.raises(DataError, match="holds no copy 'q2' \\(its copies: q8, q4, same\\)"):
        view.view(str(out), out=str(tmp_path / "w.html"), copy="q2")


def test_the_copies_share_the_steps_logits_budget():
    """Each copy holds its own blocks of logits and the original's (XLA keeps them apart), so
    the tokens taken at once shrink with the copies: the blocks of all of them fit the budget."""
    import jax.numpy as jnp

    from ppl_jax.models import registry
    from ppl_jax.runtime import mesh as mesh_lib
    from ppl_jax.scoring.scorer import Scorer, StepOptions
    from ppl_jax.scoring.step import VOCAB_BLOCK

    cfg = dataclasses.replace(helpers.TINY, vocab_size=32768, max_positions=512)
    model = registry.build(cfg.to_dict(), jnp.float32)
    mesh = mesh_lib.make_mesh(-1, 1)  # 8 devices: one row of the batch of 8 on each
    sh = mesh_lib.param_shardings(
        model.abstract_params, model.logical_axes, mesh, mesh_lib.DEFAULT_RULES
    )
    chunks = {}
    for n in (0, 1, 4):
        options = StepOptions(copies=n) if n else StepOptions(per_token=True)
        scorer = Scorer(model, mesh, sh, options, copies=[(model, sh)] * n)
        chunks[n] = scorer.nll_chunk(8, 257) or 256
        assert (1 + n) * chunks[n] * VOCAB_BLOCK * 4 <= scorer.logits_budget
    assert chunks[0] == chunks[1] == 256 and chunks[4] == 128


@pytest.mark.slow
def test_a_training_loops_evaluator_gives_the_command_lines_study(one_pass, tiny_checkpoint):
    """The library's Evaluator with copies (by name) returns each copy's statistics as scalars
    and in its record, equal to the command line's study."""
    import ppl_jax
    from ppl_jax.checkpoints import architecture
    from ppl_jax.runtime import mesh as mesh_lib
    from ppl_jax.scoring.scorer import StepOptions

    ev, out = one_pass
    cli = json.loads((out / "study.json").read_text())
    ckpt = ppl_jax.open_checkpoint(tiny_checkpoint)
    model = architecture.resolve(ckpt).model()
    mesh = ppl_jax.make_mesh(-1, 1)
    _, shardings = mesh_lib.param_targets(
        model.abstract_params, model.logical_axes, mesh, mesh_lib.DEFAULT_RULES
    )
    names = cli["names"]
    evaluator = ppl_jax.Evaluator(
        model, mesh,
        [ppl_jax.DatasetSpec(name=ev.dataset.name, path=ev.dataset.path)],
        ckpt.tokenizer(5),
        protocol=ppl_jax.ProtocolSpec(seq_len=48, stride=24),
        batch=ppl_jax.BatchSpec(batch_size=8),
        options=StepOptions(copies=3, both_directions=True, token_chunk=16),
        copies={name: (model, shardings) for name in names},
        bootstrap_samples=200,
    )  # fmt: skip
    params = ckpt.restore(5, evaluator.param_targets)
    paths = [cli["copies"][n]["checkpoint"]["path"] for n in names]
    copies = tuple(ppl_jax.open_checkpoint(p).restore(5, evaluator.param_targets) for p in paths)
    scalars = evaluator(params, step=5, reference_params=copies)
    for name in names:
        for key in ("kl_mean", "kl_p99.9", "same_top1", "perplexity_ratio", "delta_p_rms"):
            got = scalars[f"{ev.dataset.name}/study/{name}/{key}"]
            assert np.isclose(got, cli["copies"][name][key], rtol=1e-9, atol=1e-15), (name, key)
