"""The harness model on two real processes (`jax.distributed`, Gloo CPU collectives): the
harness's command line (`python -m ppl_jax.harness`) run by both gives process 0 the results of
one process (HFLM's committed metrics and answers), the other exits cleanly with it; a training
loop's `ppl_jax.harness.model.evaluate` on both gives the same answers; a lost process ends the
run within 30 s with one line."""

from __future__ import annotations

import glob
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time

import pytest

pytest.importorskip("lm_eval")

import harness_tasks as tasks  # noqa: E402

import helpers  # noqa: E402

LIMIT_S = 30
GOLDEN = tasks.load_golden()["families"]["gpt2"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start(argv: list[str], tmp_path, n: int = 2) -> list[subprocess.Popen]:
    port = _free_port()
    procs = []
    for i in range(n):
        env = dict(os.environ)
        env.update(
            PPL_JAX_COORDINATOR=f"127.0.0.1:{port}",
            PPL_JAX_NUM_PROCESSES=str(n),
            PPL_JAX_PROCESS_ID=str(i),
            XLA_FLAGS=helpers.xla_flags(2),
            JAX_PLATFORMS="cpu",
            PYTHONPATH=os.pathsep.join([helpers.REPO, os.path.dirname(tasks.__file__)]),
            HF_DATASETS_OFFLINE="1",
            HF_DATASETS_CACHE=str(tmp_path / f"datasets{i}"),
        )
        procs.append(
            subprocess.Popen(
                [sys.executable, *argv],
                env=env,
                cwd=str(tmp_path),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    return procs


def _finish(procs: list[subprocess.Popen], timeout: float) -> list[tuple[int, str, str]]:
    try:
        outs = [p.communicate(timeout=timeout) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.communicate()
    return [(p.returncode, o, e) for p, (o, e) in zip(procs, outs, strict=True)]


def test_two_processes_run_the_harness_command_line_as_one(tmp_path):
    include = tasks.write_tasks(str(tmp_path / "tasks"))
    model_args = (
        f"checkpoint={os.path.join(tasks.MODELS, 'gpt2')},seq_len={tasks.MAX_LENGTH},"
        f"batch_size={tasks.BATCH_SIZE}"
    )
    argv = [
        "-m", "ppl_jax.harness", "--model", "ppl_jax", "--model_args", model_args,
        "--tasks", ",".join(tasks.TASK_NAMES), "--include_path", include,
        "--output_path", str(tmp_path / "out"), "--log_samples",
    ]  # fmt: skip
    (rc0, out0, err0), (rc1, out1, err1) = _finish(_start(argv, tmp_path), 600)
    assert rc0 == 0, err0[-3000:]
    assert rc1 == 0, err1[-3000:]
    assert "|arc_local" in out0 and "|arc_local" not in out1  # only process 0 reports
    (path,) = glob.glob(str(tmp_path / "out" / "**" / "results_*.json"), recursive=True)
    with open(path, encoding="utf-8") as f:
        results = json.load(f)["results"]
    for task in tasks.TASK_NAMES:
        for metric, value in GOLDEN["tasks"][task]["metrics"].items():
            mine = results[task][f"{metric},none"]
            assert abs(mine - value) <= 1e-5 * abs(value), (task, metric, mine, value)
    # Per request, from the logged samples.
    for task in ("lambada_local", "hellaswag_local"):
        (samples,) = glob.glob(
            str(tmp_path / "out" / "**" / f"samples_{task}_*.jsonl"), recursive=True
        )
        with open(samples, encoding="utf-8") as f:
            rows = sorted((json.loads(line) for line in f), key=lambda r: r["doc_id"])
        mine = [r[0] for row in rows for r in row["resps"]]
        ref = [r["answer"] for r in GOLDEN["tasks"][task]["requests"]]
        assert len(mine) == len(ref)
        for (lp, greedy), (ref_lp, ref_greedy) in zip(mine, ref, strict=True):
            assert abs(float(lp) - ref_lp) <= 1e-5 * abs(ref_lp)
            assert (greedy in (True, "True")) == ref_greedy


LIBRARY = textwrap.dedent(
    """
    import json, os, sys
    from ppl_jax.runtime import distributed
    assert distributed.initialize_from_env()
    import jax
    from lm_eval.api.instance import Instance
    from lm_eval.tasks import TaskManager
    import harness_tasks as tasks
    from ppl_jax.harness.model import PplJaxLM, evaluate

    lm = PplJaxLM(checkpoint=os.path.join(tasks.MODELS, "gpt2"), seq_len=tasks.MAX_LENGTH,
                  batch_size=int(sys.argv[1]), packing=sys.argv[2] == "pack")
    if sys.argv[3] == "forever":  # a lost process: process 0 scores until the other is gone
        print("ready", flush=True)
        if jax.process_index() == 0:
            reqs = [Instance("loglikelihood", {}, tuple(p), 0) for p in tasks.EDGE_REQUESTS]
            while True:
                lm.loglikelihood(reqs, disable_tqdm=True)
        else:
            lm.serve()
        sys.exit(0)
    manager = TaskManager(include_path=sys.argv[3], include_defaults=False)
    for round in range(2):  # a training loop evaluates twice
        out = evaluate(lm, tasks=["arc_local", "wikitext_local"], task_manager=manager,
                       log_samples=True, bootstrap_iters=0)
        if out is not None:
            answers = {t: [r for s in sorted(out["samples"][t], key=lambda s: s["doc_id"])
                           for r in s["resps"]] for t in ("arc_local", "wikitext_local")}
            print("RESULT " + json.dumps(answers), flush=True)
    print("done", flush=True)
    """
)


@pytest.mark.parametrize("batch_size, packing", [(4, "pack"), (6, "nopack")])
def test_a_training_loops_evaluate_on_two_processes_gives_the_answers_of_one(
    tmp_path, batch_size, packing
):
    include = tasks.write_tasks(str(tmp_path / "tasks"))
    script = tmp_path / "loop.py"
    script.write_text(LIBRARY)
    results = _finish(_start([str(script), str(batch_size), packing, include], tmp_path), 600)
    for rc, _, err in results:
        assert rc == 0, err[-3000:]
    out0, out1 = results[0][1], results[1][1]
    rounds = [json.loads(line[7:]) for line in out0.splitlines() if line.startswith("RESULT ")]
    assert len(rounds) == 2 and "RESULT" not in out1 and "done" in out1
    for answers in rounds:
        for task in ("arc_local", "wikitext_local"):
            ref = [r["answer"] for r in GOLDEN["tasks"][task]["requests"]]
            mine = [a[0] for a in answers[task]]
            assert len(mine) == len(ref)
            for m, r in zip(mine, ref, strict=True):
                if task == "wikitext_local":
                    assert abs(float(m) - r) <= 1e-5 * abs(r)
                else:
                    assert abs(float(m[0]) - r[0]) <= 1e-5 * abs(r[0])
                    assert bool(m[1]) == r[1]


def test_a_lost_process_ends_the_harness_run_within_30_s(tmp_path):
    script = tmp_path / "loop.py"
    script.write_text(LIBRARY)
    procs = _start([str(script), "4", "pack", "forever"], tmp_path)
    try:
        for p in procs:
            for line in p.stdout:
                if line.strip() == "ready":
                    break
            else:
                pytest.fail(f"a process ended before it was ready: {p.communicate()[1][-3000:]}")
        time.sleep(2)  # a few calls go through
        procs[1].send_signal(signal.SIGKILL)
        killed = time.monotonic()
        try:
            procs[0].wait(timeout=LIMIT_S)
        except subprocess.TimeoutExpired:
            pytest.fail(f"process 0 still runs {LIMIT_S} s after the loss")
        took = time.monotonic() - killed
        _, err = procs[0].communicate(timeout=10)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.communicate()
    print(f"process 0 ended {took:.1f} s after the loss, status {procs[0].returncode}")
    assert procs[0].returncode != 0
    assert "ppl-jax: error: process 1 of 2 stopped answering" in err, err[-3000:]
    assert took < LIMIT_S


def test_a_ppl_jax_error_on_process_0_ends_both_processes_at_once(tmp_path):
    """A continuation longer than the window (seq_len=2) on the harness's command line: process 0
    prints one line and exits 2, and first tells the other to stop serving (it exits 0)."""
    include = tasks.write_tasks(str(tmp_path / "tasks"))
    model_args = f"checkpoint={os.path.join(tasks.MODELS, 'gpt2')},seq_len=2,batch_size=4"
    argv = ["-m", "ppl_jax.harness", "--model", "ppl_jax", "--model_args", model_args,
            "--tasks", "arc_local", "--include_path", include]  # fmt: skip
    (rc0, _, err0), (rc1, _, err1) = _finish(_start(argv, tmp_path), 600)
    assert rc0 == 2, err0[-3000:]
    assert rc1 == 0, err1[-3000:]
    errors = [line for line in err0.splitlines() if line.startswith("ppl-jax: error:")]
    assert len(errors) == 1 and "longer than the model's window of 2" in errors[0], err0[-3000:]
