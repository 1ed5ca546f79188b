"""`launch/tpu_pod.sh` and `launch/slurm.sh`: the exact commands they run, and JAX's SLURM detection.

Neither gcloud nor srun exists here. Fake ones on PATH record the arguments they receive, so a
real run (not a dry run) is checked too, and so is the dry run's printed line: bash executes it
against the same fakes, and it must give the very same arguments, flag by flag (spaces, quotes,
globs, `$`, backslashes, newlines). The remote command that gcloud would hand to each TPU worker
is executed by bash as well, with a fake `env`. Last, two real processes with a SLURM environment
join through `ppl_jax.runtime.distributed.initialize_from_env` (PPL_JAX_DISTRIBUTED=1).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

import helpers

LOCAL = os.path.join(helpers.REPO, "launch", "local.sh")
TPU_POD = os.path.join(helpers.REPO, "launch", "tpu_pod.sh")
SLURM = os.path.join(helpers.REPO, "launch", "slurm.sh")

# Flags a shell would mangle if they were not quoted.
HOSTILE = [
    "--config.data.path=/mnt/data/val/*.jsonl",
    "--config.data.name=my corpus",
    '--config.data.separator=it\'s "quoted"',
    "--config.output.dir=$HOME/r`x`",
    "--config.data.jsonl_field=back\\slash!",
    "--config.data.separator=two\nlines",
    "",
]
FAKE = '#!/bin/bash\nprintf "%s\\0" "$@" > "$FAKE_DIR/$(basename "$0").argv"\n'
ALLOCATION = {"SLURM_JOB_ID": "4242", "SLURM_JOB_NUM_NODES": "2"}


@pytest.fixture
def fakes(tmp_path):
    """A folder of fake `gcloud`, `srun` and `env` commands that record their arguments, and a
    working directory whose name has a space and that holds files a glob would match."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("gcloud", "srun", "env"):
        (bin_dir / name).write_text(FAKE)
        (bin_dir / name).chmod(0o755)
    work = tmp_path / "work dir"
    work.mkdir()
    for name in ("a.jsonl", "b.jsonl", "c.py"):
        (work / name).write_text("")
    return tmp_path


def _env(fakes, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "PPL_JAX_"))}
    for k in ("DRY_RUN", "PER_GPU", "GPUS_PER_NODE", "PROJECT", "PYTHON", "WORKDIR"):
        env.pop(k, None)
    env.update(PATH=f"{fakes / 'bin'}:{os.environ['PATH']}", FAKE_DIR=str(fakes), **extra)
    return env


def _run(fakes, script: str, args: list[str], **extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", script, *args],
        env=_env(fakes, **extra),
        cwd=fakes / "work dir",
        capture_output=True,
        text=True,
        timeout=30,
    )


def _recorded(fakes, name: str) -> list[str] | None:
    path = fakes / f"{name}.argv"
    if not path.exists():
        return None
    argv = path.read_text().split("\0")[:-1]
    path.unlink()
    return argv


def _dry_run(fakes, script: str, args: list[str], **extra: str) -> str:
    """The one line that the dry run prints; checks that it ran nothing."""
    done = _run(fakes, script, ["--dry-run", *args], **extra)
    assert done.returncode == 0, done.stderr
    assert done.stdout.endswith("\n") and done.stdout.count("\n") == 1, done.stdout
    assert all(_recorded(fakes, name) is None for name in ("gcloud", "srun", "env"))
    via_env = _run(fakes, script, args, DRY_RUN="1", **extra)
    assert (via_env.returncode, via_env.stdout) == (0, done.stdout)
    return done.stdout[:-1]


def _execute(fakes, line: str, name: str, cwd=None) -> list[str]:
    """The arguments that `name` receives when bash runs `line`."""
    done = subprocess.run(
        ["bash", "-c", line],
        env=_env(fakes),
        cwd=cwd or fakes / "work dir",
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 0, done.stderr
    argv = _recorded(fakes, name)
    assert argv is not None, f"{line!r} did not run {name}"
    return argv


def _real_run(fakes, script: str, args: list[str], name: str, **extra: str) -> list[str]:
    done = _run(fakes, script, args, **extra)
    assert done.returncode == 0, done.stderr
    argv = _recorded(fakes, name)
    assert argv is not None
    return argv


# ------------------------------------------------------------------------------- TPU pod


def test_tpu_pod_runs_ppl_jax_on_every_worker(fakes):
    flags = ["--config=configs/wikitext2.py:/mnt/data/wiki.test.tokens", "--config.mesh.model=4"]
    extra = dict(PROJECT="my-project", WORKDIR="/mnt/nfs/ppl_jax")
    line = _dry_run(fakes, TPU_POD, ["my-pod", "us-central2-b", *flags], **extra)
    assert line == (
        "gcloud compute tpus tpu-vm ssh my-pod --zone=us-central2-b --project=my-project "
        "--worker=all '--command=cd /mnt/nfs/ppl_jax && env PPL_JAX_DISTRIBUTED=1 python3 "
        "-m ppl_jax --config=configs/wikitext2.py:/mnt/data/wiki.test.tokens "
        "--config.mesh.model=4'"
    )
    expected = [
        "compute",
        "tpus",
        "tpu-vm",
        "ssh",
        "my-pod",
        "--zone=us-central2-b",
        "--project=my-project",
        "--worker=all",
        "--command=cd /mnt/nfs/ppl_jax && env PPL_JAX_DISTRIBUTED=1 python3 -m ppl_jax "
        + " ".join(flags),
    ]
    assert _execute(fakes, line, "gcloud") == expected
    assert _real_run(fakes, TPU_POD, ["my-pod", "us-central2-b", *flags], "gcloud", **extra) == (
        expected
    )


def test_tpu_pod_quotes_every_flag_for_the_workers_shell(fakes):
    args = ["my-pod", "us-central2-b", *HOSTILE]
    workdir = str(fakes / "work dir")
    line = _dry_run(fakes, TPU_POD, args, WORKDIR=workdir, PYTHON="/opt/venv/bin/python")
    # Single quotes, each ' inside written '\''; the newline as bash's $'\n'.
    assert line == (
        "gcloud compute tpus tpu-vm ssh my-pod --zone=us-central2-b --worker=all "
        f"'--command=cd '\\''{workdir}'\\'' && env PPL_JAX_DISTRIBUTED=1 /opt/venv/bin/python "
        "-m ppl_jax '\\''--config.data.path=/mnt/data/val/*.jsonl'\\'' "
        "'\\''--config.data.name=my corpus'\\'' "
        "'\\''--config.data.separator=it'\\''\\'\\'''\\''s \"quoted\"'\\'' "
        "'\\''--config.output.dir=$HOME/r`x`'\\'' "
        "'\\''--config.data.jsonl_field=back\\slash!'\\'' "
        "$'\\''--config.data.separator=two\\nlines'\\'' '\\'''\\'''"
    )
    gcloud = _execute(fakes, line, "gcloud")
    assert gcloud == _real_run(
        fakes, TPU_POD, args, "gcloud", WORKDIR=workdir, PYTHON="/opt/venv/bin/python"
    )
    assert gcloud[:7] == [
        "compute",
        "tpus",
        "tpu-vm",
        "ssh",
        "my-pod",
        "--zone=us-central2-b",
        "--worker=all",
    ]
    command = gcloud[7]
    assert command.startswith("--command=")
    # What each worker runs: bash, from the worker's home folder (here: elsewhere).
    worker = _execute(fakes, command[len("--command=") :], "env", cwd=fakes / "bin")
    assert worker == ["PPL_JAX_DISTRIBUTED=1", "/opt/venv/bin/python", "-m", "ppl_jax", *HOSTILE]


def test_tpu_pod_installs_on_every_worker(fakes):
    args = ["my-pod", "us-central2-b", "--install", "jax[tpu]", "/mnt/nfs/ppl_jax"]
    line = _dry_run(fakes, TPU_POD, args)
    assert line == (
        "gcloud compute tpus tpu-vm ssh my-pod --zone=us-central2-b --worker=all "
        "\"--command=python3 -m pip install 'jax[tpu]' /mnt/nfs/ppl_jax\""
    )
    command = _execute(fakes, line, "gcloud")[-1]
    assert command == _real_run(fakes, TPU_POD, args, "gcloud")[-1]
    assert _execute(fakes, command[len("--command=") :].replace("python3", "env", 1), "env") == [
        "-m",
        "pip",
        "install",
        "jax[tpu]",
        "/mnt/nfs/ppl_jax",
    ]


@pytest.mark.parametrize(
    "args",
    [[], ["my-pod"], ["--dry-run"], ["--dry-run", "my-pod"], ["my-pod", "--config.x=1"]]
    + [["my-pod", "us-central2-b", "--install"], ["", "us-central2-b"]],
)
def test_tpu_pod_without_name_or_zone_prints_usage(fakes, args):
    done = _run(fakes, TPU_POD, args)
    assert done.returncode == 2
    assert done.stderr.startswith("usage: ") and "NAME ZONE" in done.stderr
    assert done.stdout == "" and _recorded(fakes, "gcloud") is None


# ------------------------------------------------------------------------------- SLURM


def test_slurm_runs_one_process_per_node(fakes):
    flags = ["--config=configs/wikitext2.py:/lustre/data/wiki.test.tokens"]
    line = _dry_run(fakes, SLURM, flags, **ALLOCATION)
    assert line == (
        "srun --nodes=2 --ntasks=2 --ntasks-per-node=1 --kill-on-bad-exit=1 env "
        "PPL_JAX_DISTRIBUTED=1 PPL_JAX_ALL_LOCAL_DEVICES=1 python3 -m ppl_jax " + flags[0]
    )
    expected = line.split()[1:]
    assert _execute(fakes, line, "srun") == expected
    assert _real_run(fakes, SLURM, flags, "srun", **ALLOCATION) == expected


@pytest.mark.parametrize(
    "gpus",
    [{"GPUS_PER_NODE": "4"}, {"SLURM_GPUS_ON_NODE": "4"}, {"SLURM_GPUS_PER_NODE": "h100:4"}],
)
def test_slurm_runs_one_process_per_gpu(fakes, gpus):
    extra = dict(ALLOCATION, PER_GPU="1", WORKDIR="/lustre/me/ppl_jax", **gpus)
    line = _dry_run(fakes, SLURM, [], **extra)
    assert line == (
        "srun --nodes=2 --ntasks=8 --ntasks-per-node=4 --gpus-per-task=1 --kill-on-bad-exit=1 "
        "--chdir=/lustre/me/ppl_jax env PPL_JAX_DISTRIBUTED=1 PPL_JAX_ALL_LOCAL_DEVICES=1 "
        "python3 -m ppl_jax"
    )
    assert _execute(fakes, line, "srun") == line.split()[1:]
    assert _real_run(fakes, SLURM, [], "srun", **extra) == line.split()[1:]


def test_slurm_quotes_every_flag(fakes):
    line = _dry_run(fakes, SLURM, HOSTILE, **ALLOCATION)
    assert line == (
        "srun --nodes=2 --ntasks=2 --ntasks-per-node=1 --kill-on-bad-exit=1 env "
        "PPL_JAX_DISTRIBUTED=1 PPL_JAX_ALL_LOCAL_DEVICES=1 python3 -m ppl_jax "
        "'--config.data.path=/mnt/data/val/*.jsonl' '--config.data.name=my corpus' "
        "'--config.data.separator=it'\\''s \"quoted\"' "
        "'--config.output.dir=$HOME/r`x`' '--config.data.jsonl_field=back\\slash!' "
        "$'--config.data.separator=two\\nlines' ''"
    )
    argv = _execute(fakes, line, "srun")
    assert argv == _real_run(fakes, SLURM, HOSTILE, "srun", **ALLOCATION)
    assert argv[-len(HOSTILE) - 3 :] == ["python3", "-m", "ppl_jax", *HOSTILE]


@pytest.mark.parametrize(
    "extra, why",
    [
        ({}, "not inside a SLURM allocation"),
        ({"SLURM_JOB_ID": "4242"}, "not inside a SLURM allocation"),
        (dict(ALLOCATION, PER_GPU="1"), "PER_GPU=1 needs the number of GPUs per node"),
    ],
)
def test_slurm_outside_an_allocation_prints_usage(fakes, extra, why):
    for args in ([], ["--dry-run", "--config.eval.seq_len=512"]):
        done = _run(fakes, SLURM, args, **extra)
        assert done.returncode == 2
        assert done.stderr.startswith("usage: ") and why in done.stderr
        assert done.stdout == "" and _recorded(fakes, "srun") is None


# ------------------------------------------------------------------------------- local


@pytest.mark.parametrize("name", ["GRACE_S", "FAIL_GRACE_S"])
@pytest.mark.parametrize("value", ["abc", "-5", "1.5", "30s", " 3", "1e3", "9999999999"])
def test_local_rejects_a_grace_that_is_not_whole_seconds(fakes, name, value):
    """One line and exit 2 before any process starts: `abc` used to end the script with status
    1 and no word, `-5` to kill the processes at once when a signal came, without their journal."""
    (fakes / "bin" / "python").write_text(FAKE)
    (fakes / "bin" / "python").chmod(0o755)
    done = _run(fakes, LOCAL, ["2", "--config.eval.seq_len=512"], PYTHON="python", **{name: value})
    assert done.returncode == 2
    assert done.stderr == (
        f"ppl-jax: error: {name} is '{value}', not a whole number of seconds from 0 to "
        "999999999; set it to one such as 30 (no sign or unit), or leave it unset.\n"
    )
    assert done.stdout == "" and _recorded(fakes, "python") is None


@pytest.mark.parametrize("value", ["", "0", "08", "30"])
def test_local_takes_a_grace_in_whole_seconds(fakes, value):
    """An empty value is the default; a leading zero is decimal (bash's arithmetic would read 08
    as octal, an error in the middle of a stop)."""
    (fakes / "bin" / "python").write_text(FAKE)
    (fakes / "bin" / "python").chmod(0o755)
    done = _run(fakes, LOCAL, ["1", "--config.eval.seq_len=512"], PYTHON="python", GRACE_S=value)
    assert (done.returncode, done.stderr) == (0, "")
    assert _recorded(fakes, "python") == ["-m", "ppl_jax", "--config.eval.seq_len=512"]


# ------------------------------------------------------------------- JAX's SLURM detection

WORKER = """
from ppl_jax.runtime import distributed
assert distributed.initialize_from_env()
import jax
print(jax.process_index(), jax.process_count(), jax.config.read("jax_cuda_visible_devices"))
"""


def test_slurm_environment_joins_the_processes(tmp_path):
    """PPL_JAX_DISTRIBUTED=1: `jax.distributed.initialize()` finds the coordinator, the process
    count and ids in SLURM's variables. JAX then restricts a process to GPU `SLURM_LOCALID`
    (process 1 below) unless PPL_JAX_ALL_LOCAL_DEVICES=1 (process 0, as launch/slurm.sh sets)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    procs = []
    for i in range(2):
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "PPL_JAX_"))}
        env.update(
            SLURM_JOB_ID="4242",
            SLURM_STEP_NODELIST="127.0.0.1",
            SLURM_NTASKS="2",
            SLURM_PROCID=str(i),
            SLURM_LOCALID=str(i),
            JAX_COORDINATOR_PORT=str(port),
            PPL_JAX_DISTRIBUTED="1",
            JAX_PLATFORMS="cpu",
            XLA_FLAGS=helpers.xla_flags(1),
            PYTHONPATH=helpers.REPO,
        )
        if i == 0:
            env["PPL_JAX_ALL_LOCAL_DEVICES"] = "1"
        procs.append(
            subprocess.Popen(
                [sys.executable, str(script)], env=env, stdout=subprocess.PIPE, text=True
            )
        )
    try:
        outs = [p.communicate(timeout=120)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert [p.returncode for p in procs] == [0, 0]
    assert [o.split() for o in outs] == [["0", "2", "all"], ["1", "2", "1"]]
