"""A run is never lost: the output folder, its lock, atomic files, and the journal that resumes an
interrupted run with the numbers of an uninterrupted one, bit for bit.

In-process tests stop a run with a real signal sent to this process from the progress callback
after a chosen batch (deterministic); `test_resume_cli.py` kills real command-line runs.
"""

from __future__ import annotations

import json
import os
import signal

import numpy as np
import pytest

from ppl_jax.config.defaults import get_config
from ppl_jax.config.settings import from_config
from ppl_jax.errors import ConfigError, Interrupted
from ppl_jax.evaluation.run import evaluate
from ppl_jax.evaluation.spec import RunSpec
from ppl_jax.outputs import journal
from ppl_jax.outputs.folder import OutputDir


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("corpus") / "text.txt"
    path.write_text(
        "\n".join(f"line {i}: " + "the quick brown fox " * (i % 7) for i in range(300)),
        encoding="utf-8",
    )
    return str(path)


def settings(checkpoint: str, corpus: str, out: str, **overrides) -> RunSpec:
    c = get_config()
    c.checkpoint.dir = checkpoint
    c.data.path = corpus
    c.data.format = "lines"
    c.eval.seq_len = 32
    c.eval.stride = 24
    c.eval.batch_size = 8
    c.output.dir = out
    c.output.progress = False
    c.output.gzip_baseline = False
    c.output.journal_every = 2
    for key, value in overrides.items():
        section, name = key.split("__")
        setattr(getattr(c, section), name, value)
    return from_config(c)


class Progress:
    """A progress observer of the scoring loop (what `run`'s progress factory returns): counts
    the windows, and sends `sig` to this process after `batches` batches (if given)."""

    def __init__(self, num_windows, done, batches=0, sig=None):
        self.windows, self.batches, self.sig, self.seen = [done], batches, sig, 0

    def should_stop(self, i):
        return False

    def on_batch(self, i, rows, host):
        self.windows.append(sum(len(row) for row in rows))
        self.seen += 1
        if self.seen == self.batches:
            os.kill(os.getpid(), self.sig)

    def close(self):
        pass


def signal_after(batches: int, sig: int):
    """A progress factory whose observer sends `sig` to this process after `batches` batches."""
    return lambda num_windows, done: Progress(num_windows, done, batches, sig)


@pytest.fixture(scope="module")
def uninterrupted(tiny_checkpoint, corpus, tmp_path_factory):
    out = str(tmp_path_factory.mktemp("whole"))
    with OutputDir.open(out) as o:
        ev = evaluate(settings(tiny_checkpoint, corpus, out), out=o)
    assert ev.layout.num_batches > 10  # enough batches to stop halfway
    return ev


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_signal_stops_and_the_same_run_resumes_bit_for_bit(
    tiny_checkpoint, corpus, tmp_path, uninterrupted, sig
):
    s = settings(tiny_checkpoint, corpus, str(tmp_path))
    before = signal.getsignal(signal.SIGINT)  # Python's default, or SIG_IGN in a background job
    with OutputDir.open(s.output_dir) as out, pytest.raises(Interrupted) as info:
        evaluate(s, signal_after(5, sig), out=out)
    assert info.value.exit_code == 128 + sig
    assert signal.Signals(sig).name in str(info.value) and "resume" in str(info.value)
    # Handlers are restored after the run.
    assert signal.getsignal(signal.SIGINT) is before
    with np.load(tmp_path / journal.NAME) as z:
        done = z["batch_done"]
    # The batch in flight when the signal came is fetched too.
    assert 5 <= done.sum() <= 6 < done.size

    bars = []

    def count_windows(num_windows, done):
        bars.append(Progress(num_windows, done))
        return bars[-1]

    with OutputDir.open(s.output_dir) as out:
        resumed = evaluate(s, count_windows, out=out)
    assert resumed.resumed_batches == done.sum()
    (bar,) = bars
    assert bar.windows[0] > 0  # the bar starts where it stopped
    assert sum(bar.windows) == resumed.plan.windows.num_windows
    assert resumed.sums == uninterrupted.sums  # float64 NLL sum equal bit for bit
    assert resumed.metrics == uninterrupted.metrics
    for name in ("window_nll", "window_tokens", "window_entropy", "window_correct"):
        np.testing.assert_array_equal(
            getattr(resumed.totals, name), getattr(uninterrupted.totals, name)
        )


def test_a_journal_of_another_run_is_refused_with_what_changed(tiny_checkpoint, corpus, tmp_path):
    s = settings(tiny_checkpoint, corpus, str(tmp_path))
    with OutputDir.open(s.output_dir) as out, pytest.raises(Interrupted):
        evaluate(s, signal_after(3, signal.SIGTERM), out=out)
    changed = settings(tiny_checkpoint, corpus, str(tmp_path), eval__seq_len=40)
    with OutputDir.open(s.output_dir) as out, pytest.raises(ConfigError) as info:
        evaluate(changed, out=out)
    message = str(info.value)
    assert "protocol.seq_len: 32 -> 40" in message and "journal" in message
    # The data file rewritten: named too.
    os.utime(corpus, ns=(1, 1))
    with OutputDir.open(s.output_dir) as out, pytest.raises(ConfigError, match="data.files"):
        evaluate(s, out=out)
    # Starting afresh is allowed when asked for.
    fresh = settings(tiny_checkpoint, corpus, str(tmp_path), output__resume=False)
    with OutputDir.open(s.output_dir) as out:
        assert evaluate(fresh, out=out).resumed_batches == 0


def test_a_second_run_on_a_locked_folder_stops_naming_the_holder(tmp_path):
    with OutputDir.open(str(tmp_path)):
        with pytest.raises(ConfigError) as info:
            OutputDir.open(str(tmp_path))
        assert f"process {os.getpid()}" in str(info.value) and "in use" in str(info.value)
    OutputDir.open(str(tmp_path)).close()  # free again once released


@pytest.mark.parametrize("case", ["file", "read-only", "results-is-a-folder"])
def test_an_unusable_output_folder_is_refused_before_anything_is_read(tmp_path, case):
    target = tmp_path / "out"
    if case == "file":
        target.write_text("x")
    elif case == "read-only":
        if os.geteuid() == 0:
            # root writes anywhere; a folder inside a file stands in for an unwritable one
            target = tmp_path / "file" / "out"
            (tmp_path / "file").write_text("x")
        else:
            target.mkdir()
            target.chmod(0o500)
    else:
        (target / "results.json").mkdir(parents=True)
    with pytest.raises(ConfigError, match="output.dir|is a folder"):
        OutputDir.open(str(target))


def test_writes_are_atomic_and_strict(tmp_path):
    with OutputDir.open(str(tmp_path)) as out:
        out.write_json("results.json", {"a": 1})
        with pytest.raises(ValueError):
            out.write_json("results.json", {"a": float("nan")})
        # The failed write left the old file whole and no temporary behind.
        assert json.loads((tmp_path / "results.json").read_text()) == {"a": 1}
        assert sorted(p.name for p in tmp_path.iterdir()) == [".lock", "results.json"]


def test_concurrent_writers_never_mix_their_contents(tmp_path):
    """Two writers of one file (each with its own temporary file) and a reader: the reader sees
    one writer's whole content every time, never a mix (a shared temporary name mixed them)."""
    import threading

    contents = [{"run": name, "data": [name] * 20_000} for name in ("a", "b")]
    out = OutputDir(str(tmp_path), lock_fd=None)
    out.write_json("results.json", contents[0])
    stop = threading.Event()

    def writer(content):
        while not stop.is_set():
            out.write_json("results.json", content)

    threads = [threading.Thread(target=writer, args=(c,)) for c in contents]
    for t in threads:
        t.start()
    try:
        for _ in range(200):
            assert json.loads((tmp_path / "results.json").read_text()) in contents
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert [p.name for p in tmp_path.iterdir()] == ["results.json"]
