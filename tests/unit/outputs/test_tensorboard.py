"""The TensorBoard sink: every scalar read back from the event files, at its tag and step."""

from __future__ import annotations

import datetime
import glob
import os
import struct
import sys

import numpy as np
import pytest
from tensorboardX.proto import event_pb2  # the diagnostics extra: a test dependency
from tensorboardX.record_writer import masked_crc32c

from ppl_jax.errors import ConfigError
from ppl_jax.metrics.sums import Sums
from ppl_jax.outputs import store, tensorboard


def read_events(path: str) -> list:
    """The `Event`s of one event file, from its TFRecord framing: uint64 length, masked CRC-32C
    of the length, the bytes, masked CRC-32C of the bytes (all little-endian)."""
    events = []
    with open(path, "rb") as f:
        data = f.read()
    at = 0
    while at < len(data):
        header = data[at : at + 8]
        (length,) = struct.unpack("<Q", header)
        (header_crc,) = struct.unpack("<I", data[at + 8 : at + 12])
        body = data[at + 12 : at + 12 + length]
        (body_crc,) = struct.unpack("<I", data[at + 12 + length : at + 16 + length])
        assert header_crc == masked_crc32c(header) and body_crc == masked_crc32c(body)
        events.append(event_pb2.Event.FromString(body))
        at += 16 + length
    return events


def scalars_in(logdir: str) -> dict[tuple[str, int], tuple[float, float]]:
    """(tag, step) -> (value, wall time) over every event file of `logdir`; no pair twice."""
    out = {}
    for path in sorted(glob.glob(os.path.join(logdir, "events.out.tfevents.*"))):
        events = read_events(path)
        assert events[0].file_version == "brain.Event:2"
        for event in events[1:]:
            for value in event.summary.value:
                assert (value.tag, event.step) not in out
                out[value.tag, event.step] = (value.simple_value, event.wall_time)
    return out


def suite_records() -> list[dict]:
    rng = np.random.default_rng(0)
    records = []
    tags = {"web": {"domain": "web"}, "code": {"domain": "code"}, "wiki": {"domain": "web"}}
    for step in (0, 500, 1000):
        time = datetime.datetime(2025, 1, 1, 0, step // 100, tzinfo=datetime.UTC)
        step_records = []
        for name in tags:
            tokens = int(rng.integers(100, 10_000))
            sums = Sums(
                nll_sum=float(tokens * rng.uniform(2.0, 8.0)),
                num_tokens=tokens,
                num_bytes=0 if name == "code" else tokens * 4,  # code: no bits per byte
                num_words=tokens // 2,
            )
            step_records.append(
                store.dataset_record(
                    step=step,
                    dataset=name,
                    sums=sums,
                    fingerprint="f",
                    tags=tags[name],
                    checkpoint=f"/c/{step}",
                    time=time.isoformat(),
                )
            )
        records += step_records + store.average_records(step_records, time=time.isoformat())
    return records


def expected_scalars(records: list[dict]) -> dict[tuple[str, int], float]:
    """Written out by hand from the records, float32 as TensorBoard keeps it."""
    out = {}
    for r in records:
        if r["kind"] == "dataset":
            prefix = "eval/" + r["dataset"]
        else:
            prefix = "eval/average/" + r["dataset"]
        for metric, value in r["metrics"].items():
            if value is not None:
                out[f"{prefix}/{metric}", r["step"] or 0] = float(np.float32(value))
    return out


def test_scalars_read_back_at_their_tags_and_steps(tmp_path):
    records = suite_records()
    logdir = str(tmp_path / "tensorboard")
    sink = tensorboard.TensorBoardSink(logdir)
    sink.write(records[:10])
    # On disk when write returns, before close.
    assert set(scalars_in(logdir)) == set(expected_scalars(records[:10]))
    sink.write(records[10:])
    sink.close()
    got = scalars_in(logdir)
    expected = expected_scalars(records)
    assert {k: v for k, (v, _) in got.items()} == expected
    tags = {tag for tag, _ in got}
    assert "eval/average/macro/domain=web/perplexity" in tags  # '=' kept, not renamed to '_'
    assert "eval/average/micro/perplexity" in tags and "eval/web/word_perplexity" in tags
    assert "eval/code/bits_per_byte" not in tags  # null: not written
    for average in ("micro", "macro", "macro/domain=code"):  # null: code has no bytes
        assert f"eval/average/{average}/bits_per_byte" not in tags
    assert "eval/average/macro/domain=web/bits_per_byte" in tags
    assert {step for _, step in got} == {0, 500, 1000}
    # The macro perplexity is the mean of the datasets' perplexities (not of anything else).
    ppl = [got[f"eval/{d}/perplexity", 500][0] for d in ("web", "code", "wiki")]
    assert got["eval/average/macro/perplexity", 500][0] == pytest.approx(np.mean(ppl), rel=1e-6)
    # Wall time is the record's time.
    when = datetime.datetime(2025, 1, 1, 0, 10, tzinfo=datetime.UTC).timestamp()
    assert got["eval/web/perplexity", 1000][1] == when


def test_a_null_step_goes_at_step_0_and_two_sinks_keep_their_files(tmp_path):
    logdir = str(tmp_path / "tb")
    record = store.dataset_record(
        step=None,
        dataset="hf",
        sums=Sums(nll_sum=30.0, num_tokens=10, num_bytes=40),
        fingerprint="f",
    )
    later = dict(record, step=7, dataset="later")
    with tensorboard.TensorBoardSink(logdir) as a, tensorboard.TensorBoardSink(logdir) as b:
        a.write([record])
        b.write([later])
    assert len(glob.glob(os.path.join(logdir, "events.out.tfevents.*"))) == 2
    got = scalars_in(logdir)
    assert got["eval/hf/perplexity", 0][0] == pytest.approx(np.exp(3.0), rel=1e-7)
    assert got["eval/later/bits_per_byte", 7][0] == pytest.approx(30 / 40 / np.log(2), rel=1e-7)
    assert "eval/hf/word_perplexity" not in {tag for tag, _ in got}  # no words: null


def test_without_tensorboardx_the_error_says_what_to_install(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorboardX.event_file_writer", None)  # import fails
    for call in (tensorboard.check_available, lambda: tensorboard.TensorBoardSink(str(tmp_path))):
        with pytest.raises(ConfigError) as info:
            call()
        assert str(info.value) == (
            "output.tensorboard=true needs tensorboardX: pip install 'ppl_jax[diagnostics]'."
        )
    assert os.listdir(tmp_path) == []
