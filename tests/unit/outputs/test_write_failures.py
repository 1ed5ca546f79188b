"""A full disk, a folder removed mid-run and a killed writer (issue 19): one sentence, nothing
half-written, nothing lost that was finished, no temporary left for ever."""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import tempfile

import pytest
from test_tokens import SpecialBytes, batch_arrays, make_plan

from ppl_jax.errors import ConfigError, Interrupted
from ppl_jax.outputs import folder as folder_lib
from ppl_jax.outputs import store
from ppl_jax.outputs import tokens as tokens_lib
from ppl_jax.outputs.folder import OutputDir
from ppl_jax.plans.layout import plan_layout
from ppl_jax.runtime import preemption


def disk_full(*a, **k):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def test_results_json_on_a_full_disk_is_one_sentence_and_keeps_the_old_file(tmp_path, monkeypatch):
    with OutputDir.open(str(tmp_path)) as out:
        out.write_json("results.json", {"old": 1})
        monkeypatch.setattr(folder_lib.os, "fsync", disk_full)
        with pytest.raises(ConfigError, match=r"results.json could not be written \(No space"):
            out.write_json("results.json", {"new": 2})
    assert json.loads((tmp_path / "results.json").read_text()) == {"old": 1}
    assert sorted(os.listdir(tmp_path)) == [".lock", "results.json"]


def test_results_jsonl_on_a_full_disk_keeps_every_stored_record(tmp_path, monkeypatch):
    results = store.ResultsStore.in_dir(str(tmp_path))
    first = {"kind": "dataset", "step": 1, "dataset": "a", "metrics": {"bits_per_byte": 1.0}}
    results.append([first])
    before = (tmp_path / "results.jsonl").read_bytes()
    monkeypatch.setattr(folder_lib.os, "fsync", disk_full)
    with pytest.raises(ConfigError, match=r"results.jsonl could not be written \(No space"):
        results.append([{**first, "step": 2}])
    assert (tmp_path / "results.jsonl").read_bytes() == before
    assert os.listdir(tmp_path) == ["results.jsonl"]


def test_tokens_parquet_on_a_full_disk_is_one_sentence_and_leaves_nothing(tmp_path, monkeypatch):
    p = make_plan("sliding", 8, 8, False)
    layout = plan_layout(p.windows, 2)
    rows = layout.batch_rows(0)
    arrays, _ = batch_arrays(p, rows, layout.widths[0], 0)
    path = str(tmp_path / "tokens.parquet")
    monkeypatch.setattr(tokens_lib.os, "fsync", disk_full)
    with pytest.raises(ConfigError, match=r"tokens.parquet could not be written \(No space"):
        with tokens_lib.TokenWriter(path, p, SpecialBytes(), "toy") as w:
            w.add(rows, arrays)
    assert os.listdir(tmp_path) == []


def test_an_output_dir_removed_mid_run_is_made_again(tmp_path, capsys):
    import shutil

    where = tmp_path / "out"
    with OutputDir.open(str(where)) as out:
        out.write_json("results.json", {"a": 1})
        shutil.rmtree(where)
        out.write_bytes("journal.npz", b"journal")
        assert (where / "journal.npz").read_bytes() == b"journal"
        assert "was removed during the run; made it again" in capsys.readouterr().err
        with pytest.raises(ConfigError, match="in use by another run"):
            OutputDir.open(str(where))  # locked again


def test_temporaries_of_a_killed_writer_are_removed_when_the_folder_is_next_opened(tmp_path):
    code = (
        "import os, tempfile, sys; "
        "fd, p = tempfile.mkstemp(prefix='.tokens.parquet.', suffix='.tmp', dir=sys.argv[1]); "
        "os.kill(os.getpid(), 9)"
    )
    subprocess.run([sys.executable, "-c", code, str(tmp_path)])
    fd, other = tempfile.mkstemp(prefix=".results.json.", suffix=".tmp", dir=tmp_path)
    os.close(fd)
    (tmp_path / "notes.tmp").write_text("a user's file")
    left = sorted(os.listdir(tmp_path))
    assert len([n for n in left if n.startswith(".tokens.parquet.")]) == 1
    with OutputDir.open(str(tmp_path)):
        assert sorted(os.listdir(tmp_path)) == [".lock", "notes.tmp"]


def test_a_signal_inside_signals_raise_is_an_interrupted_sentence():
    previous = signal.getsignal(signal.SIGTERM)
    with pytest.raises(Interrupted, match="SIGTERM while tokenizing data 'x': stopped") as e:
        with preemption.signals_raise("tokenizing data 'x'"):
            os.kill(os.getpid(), signal.SIGTERM)
            signal.sigtimedwait([], 0.1) if hasattr(signal, "sigtimedwait") else None
    assert e.value.exit_code == 143
    assert signal.getsignal(signal.SIGTERM) == previous
