"""A command-line run read through a mapping file, killed with SIGKILL halfway, then run again
after the mapping file was edited (another model): the journal is refused in one sentence naming
`checkpoint.mapping`, and nothing is scored; with the file as it was, the same command resumes.
(tests/unit/evaluation/test_resume_settings.py changes every other setting in process.)"""

from __future__ import annotations

import json
import signal

import numpy as np
from test_resume_cli import finish, run, start, wait_for_batches

import ppl_jax
from ppl_jax.config.defaults import demo_checkpoint_dir
from ppl_jax.outputs import journal

MAPPING = "rules:\n  - {from: '(?P<name>.*)', to: '{name}'}\n"
SCALED = "rules:\n  - {from: final_norm, to: final_norm, scale: 2.0}\n" + MAPPING.split("\n", 1)[1]


def test_a_mapping_file_edited_after_a_kill_refuses_the_journal(tmp_path):
    mapping, architecture = tmp_path / "map.yaml", tmp_path / "arch.json"
    mapping.write_text(MAPPING)
    architecture.write_text(
        json.dumps(ppl_jax.open_checkpoint(demo_checkpoint_dir()).description())
    )
    extra = (
        f"--config.checkpoint.mapping={mapping}",
        f"--config.checkpoint.architecture={architecture}",
        "--config.data.tokenizer=byte",
    )
    out = tmp_path / "out"
    proc = start(out, extra=extra)
    wait_for_batches(out, 5, [proc])
    proc.send_signal(signal.SIGKILL)
    finish(proc, timeout=60)
    with np.load(out / journal.NAME) as z:
        done = int(z["batch_done"].sum())
    mapping.write_text(SCALED)
    (refused,) = run(out, extra=extra)
    assert refused.returncode == 2, refused.stderr[-2000:]
    last = refused.stderr.strip().splitlines()[-1]
    assert "Traceback" not in refused.stderr and last.startswith("ppl-jax: error: ")
    assert "is the journal of another run, which differs in: checkpoint.mapping changed" in last
    mapping.write_text(MAPPING)
    (again,) = run(out, extra=extra)
    assert again.returncode == 0, again.stderr[-2000:]
    assert json.loads((out / "results.json").read_text())["resumed_batches"] >= done
