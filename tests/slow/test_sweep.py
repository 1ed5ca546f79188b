"""A training run: a suite of datasets at every checkpoint step (`ppl_jax.evaluation.run`), the library's
`Evaluator`, watch mode, resuming an interrupted sweep, remote data, TensorBoard and the report.
Every number is checked against single runs of `evaluate` (the one-dataset, one-step path) or a
NumPy computation from the per-dataset sums."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from test_paths import bucket  # noqa: F401  (the fake gs:// fixture)
from test_tensorboard import scalars_in

from ppl_jax.checkpoints import architecture
from ppl_jax.config.defaults import get_config
from ppl_jax.config.settings import from_config
from ppl_jax.errors import ConfigError, Interrupted
from ppl_jax.evaluation import run
from ppl_jax.evaluation.run import evaluate, setup
from ppl_jax.outputs import files as output_files
from ppl_jax.outputs import store
from ppl_jax.outputs.folder import OutputDir
from ppl_jax.plans import planner

import helpers

STEPS = (1, 2, 3)
NAMES = ("prose", "code", "short")


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """A tiny Llama saved at steps 1, 2, 3 (other weights at each) and three corpora."""
    root = tmp_path_factory.mktemp("run")
    ckpt = str(root / "ckpt")
    for step in STEPS:
        helpers.save_random_checkpoint(ckpt, steps=(step,), seed=step)
    text = helpers.stdlib_text(3000)
    files = {
        "prose": helpers.corpus_files(root, [text[:900], text[900:1500]], "prose"),
        "code": helpers.corpus_files(root, [text[1500:2600]], "code"),
        "short": helpers.corpus_files(root, ["\n".join(text[2600:].split()[:80])], "short"),
    }
    return ckpt, files


def entries(files: dict[str, str]) -> list[dict]:
    return [
        {"name": "prose", "path": files["prose"], "tags": "domain=web"},
        {"name": "code", "path": files["code"], "tags": "domain=code", "seq_len": 24},
        {"name": "short", "path": files["short"], "format": "lines", "tags": "domain=web"},
    ]


def config(ckpt: str, out, suite_entries=None, **overrides):
    from ml_collections import config_dict

    c = get_config()
    c.checkpoint.dir = ckpt
    c.eval.seq_len = 32
    c.eval.batch_size = 8
    c.output.dir = str(out)
    c.output.progress = False
    c.output.gzip_baseline = False
    c.output.journal_every = 1
    c.metrics.bootstrap_samples = 0
    if suite_entries is not None:
        c.suite = tuple(config_dict.ConfigDict(e) for e in suite_entries)
    for key, value in overrides.items():
        section, name = key.split("__")
        setattr(getattr(c, section), name, value)
    return c


def run_sweep(c, progress_factory=None) -> list[str]:
    s = from_config(c)
    lines: list[str] = []
    out = OutputDir.open(s.output_dir)
    try:
        run.run(s, out, progress_factory, lines.append, json.loads(c.to_json_best_effort()))
    finally:
        out.close()
    return lines


def records_of(out) -> list[dict]:
    return store.ResultsStore.in_dir(str(out)).records()


def comparable(records: list[dict]) -> list[dict]:
    """The records without what may differ between two runs (clocks), in (step, kind, dataset)
    order."""
    clocks = {"time", "wall_seconds", "tokens_per_second", "scoring_seconds", "host_seconds"}
    clocks |= {"prepare_seconds", "compile_seconds", "resumed_batches", "timing"}

    def strip(r: dict) -> dict:
        r = {k: v for k, v in r.items() if k not in clocks}
        if "details" in r:
            r["details"] = {k: v for k, v in r["details"].items() if k not in clocks}
        return r

    return sorted(map(strip, records), key=lambda r: (r["step"], r["kind"], r["dataset"]))


@pytest.fixture(scope="module")
def swept(run_dir, tmp_path_factory):
    """The sweep over every step of the suite, with TensorBoard: its output folder."""
    ckpt, files = run_dir
    out = tmp_path_factory.mktemp("swept")
    c = config(ckpt, out, entries(files), checkpoint__step="all", output__tensorboard=True)
    run_sweep(c)
    return out


def test_sweep_equals_single_runs_and_averages_match_numpy(run_dir, swept, tmp_path):
    ckpt, files = run_dir
    records = records_of(swept)
    by = {(r["kind"], r["step"], r["dataset"]): r for r in records}
    # Per step: the 3 datasets, then micro, macro and the macros of domain=web and domain=code.
    assert len(records) == len(STEPS) * (len(NAMES) + 4)
    for step in STEPS:
        for e in entries(files):
            c = config(
                ckpt,
                tmp_path / f"single-{step}-{e['name']}",
                checkpoint__step=str(step),
            )
            c.data.path, c.data.name = e["path"], e["name"]
            c.data.format = e.get("format", "text")
            c.eval.seq_len = e.get("seq_len", 32)
            s = from_config(c)
            out = OutputDir.open(s.output_dir)
            try:
                ev = evaluate(s, out=out)
            finally:
                out.close()
            got = by["dataset", step, e["name"]]["sums"]
            assert got["num_tokens"] == ev.sums.num_tokens
            assert got["num_bytes"] == ev.sums.num_bytes
            assert np.isclose(got["nll_sum"], ev.sums.nll_sum, rtol=1e-12, atol=0)
        # The averages, from the per-dataset sums in NumPy float64.
        sums = [by["dataset", step, n]["sums"] for n in NAMES]
        nll = np.array([x["nll_sum"] for x in sums], np.float64)
        tokens = np.array([x["num_tokens"] for x in sums], np.float64)
        nbytes = np.array([x["num_bytes"] for x in sums], np.float64)
        micro = by["average", step, "micro"]["metrics"]
        assert np.isclose(micro["perplexity"], np.exp(nll.sum() / tokens.sum()), rtol=1e-12)
        assert np.isclose(micro["bits_per_byte"], nll.sum() / nbytes.sum() / np.log(2), rtol=1e-12)
        macro = by["average", step, "macro"]["metrics"]
        assert np.isclose(macro["perplexity"], np.mean(np.exp(nll / tokens)), rtol=1e-12)
        assert np.isclose(macro["bits_per_byte"], np.mean(nll / nbytes / np.log(2)), rtol=1e-12)
        web = by["average", step, "macro/domain=web"]["metrics"]
        keep = [0, 2]  # prose and short carry domain=web
        assert np.isclose(web["bits_per_byte"], np.mean((nll / nbytes / np.log(2))[keep]))
    # Other weights at each step: other numbers.
    assert len({by["dataset", s, "prose"]["sums"]["nll_sum"] for s in STEPS}) == len(STEPS)


def test_tensorboard_and_report_hold_the_stored_numbers(swept):
    from ppl_jax.analysis import report

    records = records_of(swept)
    scalars = scalars_in(str(swept / "tensorboard"))
    for r in records:
        prefix = r["dataset"] if r["kind"] == "dataset" else f"average/{r['dataset']}"
        value, _ = scalars[f"eval/{prefix}/bits_per_byte", r["step"]]
        assert np.isclose(value, r["metrics"]["bits_per_byte"], rtol=1e-6)  # float32 events
    table, csv_path, png = report.report(str(swept))
    assert os.path.getsize(png) > 1000 and open(png, "rb").read(4) == b"\x89PNG"
    import csv

    with open(csv_path, newline="") as f:
        rows = list(csv.DictReader(f))
    for r in records:
        row = next(
            x
            for x in rows
            if x["step"] == str(r["step"])
            and x["dataset"] == r["dataset"]
            and x["metric"] == "perplexity"
        )
        assert np.isclose(float(row["value"]), r["metrics"]["perplexity"], rtol=1e-12)
    assert "prose" in table and "micro" in table


def test_an_interrupted_sweep_skips_what_is_stored_and_resumes(run_dir, swept, tmp_path):
    ckpt, files = run_dir
    out = tmp_path / "out"
    c = config(ckpt, out, entries(files), checkpoint__step="all", output__tensorboard=True)
    pairs = []

    class Progress:  # the run's progress observer: SIGTERM after the fifth pair's first batch
        def __init__(self, num_windows, done):
            pairs.append(num_windows)

        def should_stop(self, i):
            return False

        def on_batch(self, i, rows, host):
            if len(pairs) == 5 and i == 0:
                os.kill(os.getpid(), signal.SIGTERM)

        def close(self):
            pass

    with pytest.raises(Interrupted, match="step 2, dataset 'code'"):
        run_sweep(c, Progress)
    stored = {(r["step"], r["dataset"]) for r in records_of(out) if r["kind"] == "dataset"}
    assert stored == {(1, n) for n in NAMES} | {(2, "prose")}
    assert (out / output_files.journal_name(2, "code")).exists()
    pairs.clear()
    run_sweep(c, lambda n, done: pairs.append(n))
    assert len(pairs) == 5  # the stored pairs are skipped: step 2's code, short; step 3's three
    assert comparable(records_of(out)) == comparable(records_of(swept))
    assert not list(out.glob("journal-*.npz"))


def test_evaluator_traces_once_per_shape_and_equals_the_cli(run_dir, swept):
    import ppl_jax
    from ppl_jax.checkpoints.formats import orbax as checkpoint

    ckpt, files = run_dir
    s = from_config(config(ckpt, "unused"))
    opened = ppl_jax.open_checkpoint(ckpt)
    model = architecture.resolve(opened).model()
    mesh = ppl_jax.make_mesh(-1, 1)
    suite = [
        (
            ppl_jax.DatasetSpec(**{k: v for k, v in e.items() if k != "seq_len"}),
            ppl_jax.ProtocolSpec(seq_len=e.get("seq_len", 32)),
        )
        for e in entries(files)
    ]
    evaluator = ppl_jax.Evaluator(
        model,
        mesh,
        suite,
        opened.tokenizer(),
        batch=ppl_jax.BatchSpec(batch_size=8),
        rules=s.mesh.rules,
    )
    target = evaluator.param_targets
    traced = evaluator.traces
    assert traced == len(
        {(d.layout.batch_size, w) for d in evaluator.datasets for w in d.layout.widths}
    )
    by = {(r["step"], r["dataset"]): r for r in records_of(swept)}
    for step in STEPS:
        params = checkpoint.restore_params(ckpt, step, target)
        found = evaluator(params, step=step)
        for name in NAMES:
            expected = by[step, name]["metrics"]["perplexity"]
            assert np.isclose(found[f"{name}/perplexity"], expected, rtol=1e-12)
        assert np.isclose(
            found["average/micro/bits_per_byte"],
            by[step, "micro"]["metrics"]["bits_per_byte"],
            rtol=1e-12,
        )
    assert evaluator.traces == traced  # no recompilation across calls


def test_a_suite_read_from_a_remote_path_gives_the_same_numbers(run_dir, swept, bucket, tmp_path):  # noqa: F811
    ckpt, files = run_dir
    remote = {}
    (bucket / "b").mkdir()
    for name, spec in files.items():
        parts = []
        for path in spec.split(","):
            shutil.copy(path, bucket / "b" / os.path.basename(path))
            parts.append(f"gs://b/{os.path.basename(path)}")
        remote[name] = ",".join(parts)
    out = tmp_path / "remote"
    run_sweep(config(ckpt, out, entries(remote), checkpoint__step="2"))
    local = {r["dataset"]: r for r in records_of(swept) if r["step"] == 2}
    found = records_of(out)
    assert {r["dataset"] for r in found} == set(local)
    for r in found:
        assert r.get("sums") == local[r["dataset"]].get("sums")
        assert r["metrics"] == local[r["dataset"]]["metrics"]


def suite_config_file(tmp_path, suite_entries) -> str:
    """A config file whose `get_config()` sets `suite` (a suite cannot be given by flags)."""
    cfg = tmp_path / "suite_config.py"
    cfg.write_text(
        "from ml_collections import config_dict\n"
        "from ppl_jax.config.defaults import get_config as _default\n"
        "def get_config():\n"
        "    c = _default()\n"
        f"    c.suite = tuple(config_dict.ConfigDict(e) for e in {suite_entries!r})\n"
        "    return c\n"
    )
    return str(cfg)


def cli(cfg: str, *flags: str, process: int = 0, processes: int = 1, port: int = 0):
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "ppl_jax",
            f"--config={cfg}",
            "--config.eval.seq_len=32",
            "--config.output.progress=false",
            "--config.output.gzip_baseline=false",
            "--config.metrics.bootstrap_samples=0",
            *flags,
        ],
        env=helpers.process_env(process, processes, port),
        cwd=helpers.REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_watch_mode_scores_a_step_saved_while_it_runs(run_dir, tmp_path):
    _, files = run_dir
    ckpt = str(tmp_path / "ckpt")
    helpers.save_random_checkpoint(ckpt, steps=(10,), seed=10)
    cfg = suite_config_file(tmp_path, entries(files)[:2])
    out = tmp_path / "out"
    proc = cli(
        cfg,
        f"--config.checkpoint.dir={ckpt}",
        "--config.checkpoint.watch=true",
        "--config.checkpoint.watch_timeout=8",
        "--config.checkpoint.watch_interval=0.2",
        f"--config.output.dir={out}",
    )
    try:
        deadline = time.monotonic() + 120
        while not (out / "results.jsonl").exists():
            assert proc.poll() is None, proc.communicate()[1][-2000:]
            assert time.monotonic() < deadline
            time.sleep(0.2)
        helpers.save_random_checkpoint(ckpt, steps=(20,), seed=20)  # "the trainer" saves
        stdout, stderr = proc.communicate(timeout=180)
    finally:
        proc.kill()
    assert proc.returncode == 0, stderr[-2000:]
    steps = {(r["step"], r["dataset"]) for r in records_of(out) if r["kind"] == "dataset"}
    assert steps == {(s, n) for s in (10, 20) for n in ("prose", "code")}
    assert "step 20" in stdout
    assert json.loads((out / "results.json").read_text())["step"] == 20


def test_budgets_take_the_first_or_a_seeded_sample(tmp_path):
    from ppl_jax import tokenizer

    texts = [f"document {i} " + "word " * (i % 5 + 1) for i in range(20)]
    path = helpers.corpus_files(tmp_path, texts)
    c = get_config()
    c.data.path = path
    tok = tokenizer.load_tokenizer("byte", None)
    c.data.max_documents = 5
    first = planner.read(from_config(c).data, tok)[0]
    assert [d.text for d in first] == texts[:5]
    c.data.sample_seed = 7
    sampled = planner.read(from_config(c).data, tok)[0]
    chosen = np.sort(np.random.default_rng(7).permutation(20)[:5])
    assert [d.text for d in sampled] == [texts[i] for i in chosen]
    c.data.max_documents, c.data.sample_seed = 0, -1
    c.data.max_tokens = 60
    kept = planner.read(from_config(c).data, tok)[0]
    lengths = np.cumsum([len(t.encode()) for t in texts])
    whole = int(np.searchsorted(lengths, 60, side="right"))
    assert len(kept) == whole + 1 and sum(len(d.text.encode()) for d in kept) == 60
    assert texts[whole].startswith(kept[-1].text)  # the document that crosses 60 tokens, cut


def test_training_run_settings_are_checked_before_work(run_dir, tmp_path):
    ckpt, files = run_dir
    with pytest.raises(ConfigError, match="checkpoint.step"):
        from_config(config(ckpt, tmp_path, checkpoint__step="5:1"))
    with pytest.raises(ConfigError, match="used twice"):
        from_config(config(ckpt, tmp_path, [entries(files)[0]] * 2))
    with pytest.raises(ConfigError, match="unknown key"):
        from_config(config(ckpt, tmp_path, [{**entries(files)[0], "colour": "red"}]))
    s = from_config(config(ckpt, tmp_path, entries(files), output__tokens=True))
    with pytest.raises(ConfigError, match="one checkpoint step on one dataset"):
        setup.check(s, "orbax")
    with pytest.raises(ConfigError, match="step 7"):
        run_sweep(config(ckpt, tmp_path / "o", entries(files), checkpoint__step="1,7"))
    spec = from_config(config(ckpt, tmp_path, checkpoint__step="0:1000:500")).steps
    assert spec.select([0, 250, 500, 750, 1000, 1500]) == [0, 500, 1000]
