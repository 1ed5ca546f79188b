"""Before a long run, what it will cost (issue 39, item 10): the windows, tokens and batches at
once, an estimate after the first batch, and on a CPU how to cut the work."""

from __future__ import annotations

import dataclasses

import numpy as np

from ppl_jax import tokenizer
from ppl_jax.data.spec import DatasetSpec
from ppl_jax.evaluation.run.hooks import cost_note
from ppl_jax.outputs import cost
from ppl_jax.plans import planner
from ppl_jax.plans.spec import BatchSpec, ProtocolSpec
from ppl_jax.runtime import mesh as mesh_lib

import helpers


def note_of(platform: str, seconds_per_batch: float, **fields) -> tuple[cost.CostNote, list]:
    lines: list[str] = []
    now = [100.0]
    note = cost.CostNote(
        windows=2306, tokens=295_877, batches=289, batch_size=8, platform=platform,
        write=lines.append, clock=lambda: now[0], **fields,
    )  # fmt: skip
    note.start()
    assert not note.should_stop(0)
    now[0] += seconds_per_batch
    note.on_batch(0, [], None)
    note.on_batch(1, [], None)  # said once
    return note, lines


def test_a_long_cpu_run_says_its_cost_and_how_to_cut_it():
    """7 h on a loaded CPU (the first command on a 135M GGUF over WikiText-2's test split)."""
    _, lines = note_of("cpu", 90.0, strided=True)
    assert lines == [
        "scoring 2,306 windows (295,877 tokens) in 289 batches of 8 rows on 1 cpu device",
        "the first batch took 90.0 s: about 7 h 14 min for all 289",
        "on a CPU this is long; to cut the work: --config.data.max_tokens=6800 (the first 6,800 "
        "tokens, about 10 min), a larger eval.stride (fewer windows), or a GPU.",
    ]


def test_a_short_run_or_a_gpu_gets_no_advice():
    assert len(note_of("cpu", 1.0)[1]) == 2  # 289 s: no hint
    _, lines = note_of("gpu", 90.0, num_devices=8)
    assert lines[0].endswith("on 8 gpu devices") and len(lines) == 2
    _, lines = note_of("cpu", 90.0)  # a protocol without a stride
    assert "eval.stride" not in lines[2] and "max_tokens" in lines[2]


def test_durations():
    assert [cost.duration_text(s) for s in (0.4, 89, 91, 3599, 5400, 26_000)] == [
        "0 s", "89 s", "2 min", "60 min", "1 h 30 min", "7 h 13 min",
    ]  # fmt: skip


def test_the_pair_note_counts_what_its_journal_does_not_hold(tmp_path):
    path = helpers.corpus_files(tmp_path, [helpers.stdlib_text(3000)])
    tok = tokenizer.load_tokenizer("byte", None)
    d = planner.plan_dataset(
        DatasetSpec(path=path), ProtocolSpec(seq_len=64), tok, 256, BatchSpec(batch_size=4)
    )
    mesh = mesh_lib.make_mesh(-1, 1)
    done = np.zeros(d.layout.num_batches, bool)
    note = cost_note(d, done, mesh)
    assert (note.windows, note.batches, note.batch_size) == (
        d.plan.windows.num_windows,
        d.layout.num_batches,
        4,
    )
    assert note.tokens == int(d.plan.windows.num_scored().sum()) and note.strided
    assert note.platform == "cpu" and note.num_devices == mesh.devices.size
    done[:2] = True
    half = cost_note(d, done, mesh)
    assert half.batches == d.layout.num_batches - 2 and half.windows == note.windows - 8
    lines: list[str] = []
    done[:] = True  # a journal that holds every batch: nothing to say
    dataclasses.replace(cost_note(d, done, mesh), write=lines.append).start()
    assert lines == []
