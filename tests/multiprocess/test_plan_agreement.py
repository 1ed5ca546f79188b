"""Every process of a run must plan the same windows: a host that read other text stops the run
on every process with one sentence, before the weights are read."""

from __future__ import annotations

import subprocess
import sys

import helpers


def test_a_process_that_planned_other_windows_stops_every_process(tmp_path, demo_checkpoint):
    a = tmp_path / "a.txt"
    b = tmp_path / "b.txt"
    a.write_text(helpers.stdlib_text(3000), encoding="utf-8")
    b.write_text(helpers.stdlib_text(3000).upper(), encoding="utf-8")  # same size, other text
    cfg = tmp_path / "per_host.py"
    cfg.write_text(
        "import os\n"
        "from ppl_jax.config.defaults import get_config as _default\n"
        "def get_config():\n"
        "    c = _default()\n"
        f"    c.data.path = {str(a)!r} if os.environ['PPL_JAX_PROCESS_ID'] == '0' else {str(b)!r}\n"
        "    c.data.name = 'held-out'\n"
        "    return c\n"
    )
    port = helpers.free_port()
    procs = []
    for i in range(2):
        procs.append(
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "ppl_jax",
                    f"--config={cfg}",
                    f"--config.output.dir={tmp_path / 'out'}",
                    "--config.output.progress=false",
                ],
                env=helpers.process_env(i, 2, port),
                cwd=helpers.REPO,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    for p in procs:
        _, stderr = p.communicate(timeout=180)
        assert p.returncode == 2, stderr[-2000:]
        lines = [x for x in stderr.splitlines() if x.startswith("ppl-jax")]
        assert lines == [
            "ppl-jax: error: process 1 planned other windows than process 0 for data "
            "'held-out'; every process must read the same text with the same settings (check "
            "that data.path names the same files with the same contents on every host)."
        ], stderr[-2000:]
    assert not (tmp_path / "out" / "results.json").exists()
