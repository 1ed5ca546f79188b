"""The harness's command line with the ppl_jax model (`python -m ppl_jax.harness`, lm_eval's own
CLI with the model registered), in a subprocess on the local tasks: HFLM's committed metrics; a
ppl_jax error is one line and status 2."""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys

import harness_tasks as tasks
import pytest

import helpers

pytest.importorskip("lm_eval")
pytestmark = pytest.mark.slow  # an lm_eval run of its own tasks
GOLDEN = tasks.load_golden()["families"]["llama"]


def _run(args: list[str], tmp_path) -> subprocess.CompletedProcess:
    env = dict(os.environ, HF_DATASETS_OFFLINE="1", JAX_PLATFORMS="cpu", PYTHONPATH=helpers.REPO)
    env["XLA_FLAGS"] = helpers.xla_flags()  # one CPU device, as a user's machine
    return subprocess.run(
        [sys.executable, "-m", "ppl_jax.harness", *args],
        env=env,
        cwd=str(tmp_path),
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_the_harness_command_line_runs_the_ppl_jax_model(tmp_path):
    include = tasks.write_tasks(str(tmp_path / "tasks"))
    model_args = (
        f"checkpoint={os.path.join(tasks.MODELS, 'llama')},seq_len={tasks.MAX_LENGTH},"
        f"batch_size={tasks.BATCH_SIZE}"
    )
    done = _run(
        ["--model", "ppl_jax", "--model_args", model_args, "--tasks", "lambada_local,arc_local",
         "--include_path", include, "--output_path", str(tmp_path / "out")],
        tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    (path,) = glob.glob(str(tmp_path / "out" / "**" / "results_*.json"), recursive=True)
    # The output subfolder is named after the checkpoint (lm-eval's convention for pretrained=),
    # and the requests showed a progress bar.
    from lm_eval.utils import sanitize_model_name

    checkpoint = os.path.join(tasks.MODELS, "llama")
    assert os.path.basename(os.path.dirname(path)) == sanitize_model_name(checkpoint)
    assert "Running loglikelihood requests: 100%" in done.stderr
    with open(path, encoding="utf-8") as f:
        results = json.load(f)["results"]
    for task in ("lambada_local", "arc_local"):
        for metric, value in GOLDEN["tasks"][task]["metrics"].items():
            mine = results[task][f"{metric},none"]
            assert abs(mine - value) <= 1e-5 * abs(value), (task, metric, mine, value)


@pytest.mark.parametrize(
    "extra, named", [("", "missing"), (",step=abc", "step=abc is not an integer")]
)
def test_a_ppl_jax_error_is_one_line_and_status_2(tmp_path, extra, named):
    include = tasks.write_tasks(str(tmp_path / "tasks"))
    checkpoint = tmp_path / "missing" if not extra else os.path.join(tasks.MODELS, "llama")
    done = _run(
        ["--model", "ppl_jax", "--model_args", f"checkpoint={checkpoint}{extra}",
         "--tasks", "arc_local", "--include_path", include],
        tmp_path,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr[-3000:]
    errors = [line for line in done.stderr.splitlines() if line.startswith("ppl-jax: error:")]
    assert len(errors) == 1 and named in errors[0], done.stderr[-3000:]
    assert "Traceback" not in done.stderr
