"""The worked example of docs/other-trainers.md, run as written: an NNX model of the user's own
trained a few steps and saved with Orbax the usual way, evaluated at every step from the command
line (a sweep) and from the loop, with the same numbers; and the command line's one sentence for
a damaged foreign checkpoint."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

import helpers

pytestmark = pytest.mark.slow  # trains the worked example's model, then sweeps

DOCS = os.path.join(helpers.REPO, "docs", "other-trainers.md")


def _block(title: str) -> str:
    text = open(DOCS).read()
    m = re.search(rf'```python title="{re.escape(title)}"\n(.*?)```', text, re.S)
    assert m, title
    return m.group(1)


def _run(args, cwd, **kw):
    env = {**os.environ, "PYTHONPATH": str(cwd) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=600, **kw)


@pytest.fixture(scope="module")
def example(tmp_path_factory):
    work = tmp_path_factory.mktemp("example")
    (work / "mylm.py").write_text(_block("mylm.py"))
    (work / "loop.py").write_text(_block("loop.py"))
    (work / "train.txt").write_text(helpers.stdlib_text(4000))
    (work / "val.txt").write_text(helpers.stdlib_text(3000, ("pprint.py",)))
    run = _run([sys.executable, "mylm.py", str(work / "run"), "train.txt"], work)
    assert run.returncode == 0, run.stderr[-3000:]
    return work


def test_worked_example_cli_sweep_equals_the_loop(example):
    work = example
    cli = _run([sys.executable, "-m", "ppl_jax.cli.main", f"--config.checkpoint.dir={work}/run",
                "--config.checkpoint.architecture=mylm:model", "--config.checkpoint.step=all",
                "--config.data.path=val.txt", "--config.data.tokenizer=byte",
                "--config.eval.seq_len=64", f"--config.output.dir={work}/out"], work)  # fmt: skip
    assert cli.returncode == 0, cli.stderr[-3000:]
    records = [json.loads(x) for x in open(work / "out" / "results.jsonl")]
    by_step = {r["step"]: r["metrics"]["bits_per_byte"] for r in records if r["kind"] == "dataset"}
    assert sorted(by_step) == [1, 2, 3]
    loop = _run([sys.executable, "loop.py", str(work / "run"), "val.txt"], work)
    assert loop.returncode == 0, loop.stderr[-3000:]
    printed = dict(line.split() for line in loop.stdout.strip().splitlines())
    assert {int(k): float(v) for k, v in printed.items()} == pytest.approx(by_step, rel=1e-12)
    assert len(set(by_step.values())) == 3  # the steps differ: each was restored


def test_inspect_and_damage_are_one_sentence(example):
    work = example
    run = _run([sys.executable, "-m", "ppl_jax.cli.main", "inspect", f"{work}/run",
                "--architecture=mylm:model"], work)  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    assert "item: model   params: (the whole item)" in run.stdout
    assert "embed/embedding" in run.stdout and "mapped weights (" in run.stdout
    # A mapping that does not fit: one sentence naming the first stored weights left over.
    (work / "map.yaml").write_text("rules:\n  - {from: 'embed/.*', to: null}\n")
    run = _run([sys.executable, "-m", "ppl_jax.cli.main", f"--config.checkpoint.dir={work}/run",
                "--config.checkpoint.architecture=mylm:model", "--config.checkpoint.mapping=map.yaml",
                "--config.data.path=val.txt", "--config.data.tokenizer=byte",
                "--config.eval.seq_len=64", f"--config.output.dir={work}/out2"], work)  # fmt: skip
    assert run.returncode == 2, run.stderr[-3000:]
    assert "Traceback" not in run.stderr
    assert re.search(r"no mapping rule takes the stored weights 'attn/", run.stderr), run.stderr


def test_damaged_metadata_and_gcs_exit_2_with_one_sentence(tmp_path):
    from ppl_jax.testing import save_random_checkpoint

    own = tmp_path / "ckpt"
    save_random_checkpoint(str(own), steps=(3,))
    (own / "3" / "metadata" / "metadata").write_text("{not json")
    for argv in ([f"--config.checkpoint.dir={own}"], ["inspect", "gs://bucket/run"]):
        run = subprocess.run(
            [sys.executable, "-m", "ppl_jax.cli.main", *argv, f"--config.output.dir={tmp_path}/o"]
            if argv[0] != "inspect" else [sys.executable, "-m", "ppl_jax.cli.main", *argv],
            capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert run.returncode == 2, run.stderr[-2000:]
        lines = [x for x in run.stderr.splitlines() if x.startswith("ppl-jax: error:")]
        assert len(lines) == 1 and "Traceback" not in run.stderr, run.stderr[-2000:]


def test_hub_revisions_sweep_from_the_cli(tmp_path):
    # A hand-made hub cache (refs, snapshots linking into blobs): `hf://org/tiny` with revisions
    # step1000 and step2000 swept as steps; one revision alone records its commit in the path.
    sys.path.insert(0, os.path.join(helpers.REPO, "tests", "unit", "checkpoints"))
    from test_hub import HF_LLAMA, add_revision

    cache = tmp_path / "hub"
    files = {n: os.path.join(HF_LLAMA, n) for n in os.listdir(HF_LLAMA)}
    commits = {b: add_revision(cache, "org/tiny", b, files) for b in ("step1000", "step2000")}
    (tmp_path / "val.txt").write_text(helpers.stdlib_text(1500))
    env_extra = {"HF_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": "1"}
    common = ["--config.data.path=val.txt", "--config.data.tokenizer=byte",
              "--config.data.allow_tokenizer_mismatch=true",
              "--config.eval.seq_len=32", "--config.checkpoint.dir=hf://org/tiny"]  # fmt: skip
    env = {**os.environ, **env_extra}
    sweep = subprocess.run(
        [sys.executable, "-m", "ppl_jax.cli.main", *common, "--config.checkpoint.step=step1000,step2000",
         f"--config.output.dir={tmp_path}/sweep"], cwd=tmp_path, env=env, capture_output=True,
        text=True, timeout=600)  # fmt: skip
    assert sweep.returncode == 0, sweep.stderr[-3000:]
    records = [json.loads(x) for x in open(tmp_path / "sweep" / "results.jsonl")]
    sums = {r["step"]: r["sums"]["nll_sum"] for r in records if r["kind"] == "dataset"}
    assert sorted(sums) == [1000, 2000] and sums[1000] == sums[2000]  # the same weights
    one = subprocess.run(
        [sys.executable, "-m", "ppl_jax.cli.main", *common[:-1],
         "--config.checkpoint.dir=hf://org/tiny@step2000", f"--config.output.dir={tmp_path}/one"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)  # fmt: skip
    assert one.returncode == 0, one.stderr[-3000:]
    assert commits["step2000"] in open(tmp_path / "one" / "results.json").read()
