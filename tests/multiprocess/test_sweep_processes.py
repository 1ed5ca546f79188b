"""A training run's sweep on two processes gives the records of one process (the sweep of
tests/slow/test_sweep.py)."""

from __future__ import annotations

import numpy as np
from test_sweep import (  # noqa: F401  (run_dir, swept: the suite, and its one-process sweep)
    cli,
    entries,
    records_of,
    run_dir,
    suite_config_file,
    swept,
)

import helpers


def test_a_sweep_on_two_processes_equals_one_process(run_dir, swept, tmp_path):  # noqa: F811
    ckpt, files = run_dir
    cfg = suite_config_file(tmp_path, entries(files))
    out = tmp_path / "out"
    port = helpers.free_port()
    procs = [
        cli(
            cfg,
            f"--config.checkpoint.dir={ckpt}",
            "--config.checkpoint.step=all",
            f"--config.output.dir={out}",
            process=i,
            processes=2,
            port=port,
        )
        for i in range(2)
    ]
    for p in procs:
        _, stderr = p.communicate(timeout=300)
        assert p.returncode == 0, stderr[-2000:]
    one = {(r["kind"], r["step"], r["dataset"]): r for r in records_of(swept)}
    two = records_of(out)
    assert len(two) == len(one)
    for r in two:
        expected = one[r["kind"], r["step"], r["dataset"]]
        if "sums" in r:
            assert r["sums"]["num_tokens"] == expected["sums"]["num_tokens"]
            assert np.isclose(r["sums"]["nll_sum"], expected["sums"]["nll_sum"], rtol=1e-12)
        assert np.isclose(
            r["metrics"]["bits_per_byte"], expected["metrics"]["bits_per_byte"], rtol=1e-12
        )
