"""Damaged steps of another trainer's checkpoint (MaxText's golden run, written by MaxText):
lost array files or B+tree nodes are reported as damage of the step, in one sentence naming it,
never as a mapping mistake (issue 26) nor with Orbax's tracebacks."""

from __future__ import annotations

import gc
import glob
import os
import shutil

import pytest

from ppl_jax.checkpoints import architecture, open_checkpoint
from ppl_jax.config.defaults import DEFAULT_RULES
from ppl_jax.errors import CheckpointError
from ppl_jax.runtime import mesh as mesh_lib

import helpers

RUN = os.path.join(helpers.GOLDEN, "trainers", "maxtext_llama2_scanned")
pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")


@pytest.fixture
def run(tmp_path):
    path = str(tmp_path / "run")
    shutil.copytree(RUN, path)
    yield path
    gc.collect()


def _restore(path: str):
    with open(os.path.join(path, "architecture.txt")) as f:
        ckpt = open_checkpoint(path, architecture=f.read().strip())
    model = architecture.resolve(ckpt).model()
    mesh = mesh_lib.make_mesh(-1, 1)
    target = mesh_lib.param_targets(model.abstract_params, model.logical_axes, mesh, DEFAULT_RULES)
    return ckpt.restore(1, target[0])


def _items(path: str) -> str:
    return os.path.join(path, "checkpoints", "1", "items")


@pytest.mark.parametrize(
    "lost",
    [
        "d",  # the B+tree nodes of the item's root database
        "ocdbt.process_0/d",  # the array data and the process's nodes
        "d+ocdbt.process_0/d",  # both (what `rm -r */d` does)
    ],
)
def test_deleted_array_files_are_damage(run, lost, capfd):
    for folder in lost.split("+"):
        shutil.rmtree(os.path.join(_items(run), folder))
    with pytest.raises(CheckpointError) as e:
        _restore(run)
    msg = str(e.value)
    assert msg.startswith(f"step 1 of {run!r} is damaged: "), msg
    assert "mapping" not in msg and "given by no stored weight" not in msg, msg
    assert msg.endswith("or evaluate another step (checkpoint.step)."), msg
    gc.collect()
    assert "Traceback" not in capfd.readouterr().err


def test_an_emptied_tree_metadata_is_damage(run):
    # A _METADATA that lists nothing (as Orbax returns for a tree it cannot read) is not an
    # architecture without weights.
    with open(os.path.join(_items(run), "_METADATA"), "w") as f:
        f.write('{"tree_metadata": {}}')
    with pytest.raises(CheckpointError, match=f"step 1 of {run!r} is damaged"):
        _restore(run)


def test_the_intact_copy_restores(run):
    assert _restore(run)
    assert glob.glob(os.path.join(_items(run), "ocdbt.process_0", "d", "*"))


def test_after_a_failed_read_only_orbax_leftovers_are_dropped(monkeypatch):
    # The shutdown reports after a damage sentence ("Exception ignored in: <coroutine object
    # _read_array_index_and_device_put>", hundreds of lines, issue 26) come from Orbax's own
    # coroutines; from the first failed read on they are dropped, and nothing else is.
    import sys
    import types

    from orbax.checkpoint._src.serialization import serialization

    from ppl_jax.checkpoints.formats import damage

    seen = []
    monkeypatch.setattr(sys, "unraisablehook", seen.append)
    with damage.quiet_failed_reads():
        pass
    read = serialization._read_array_index_and_device_put
    code = read.__code__
    keywords = code.co_varnames[code.co_argcount : code.co_argcount + code.co_kwonlyargcount]
    leftover = read(*[None] * code.co_argcount, **dict.fromkeys(keywords))  # never awaited
    try:
        sys.unraisablehook(types.SimpleNamespace(object=leftover, exc_traceback=None))
    finally:
        leftover.close()

    async def mine():
        return 1

    own = mine()
    try:
        sys.unraisablehook(types.SimpleNamespace(object=own, exc_traceback=None))
    finally:
        own.close()
    assert [u.object for u in seen] == [own]
    assert damage.is_failed_read_leftover(leftover) and not damage.is_failed_read_leftover(own)


def test_a_failed_reads_leftover_tasks_are_dropped_even_before_its_sentence(
    tmp_path, monkeypatch, caplog
):
    """Orbax's event loop thread may collect the failed tasks of a restore (asyncio then logs
    "Task exception was never retrieved ... ValueError: NOT_FOUND") before the failure reaches
    ppl_jax: 1 `watch` run of 3 over a half-copied step printed that traceback before its
    sentence. Made deterministic here: the restore itself logs such a report, then fails."""
    import asyncio
    import logging

    import jax
    import numpy as np
    from orbax.checkpoint._src.serialization import serialization

    from ppl_jax.checkpoints.formats import orbax

    path = str(tmp_path / "ckpt")
    helpers.save_random_checkpoint(path, steps=(5,))
    read = serialization._read_array_index_and_device_put
    code = read.__code__
    keywords = code.co_varnames[code.co_argcount : code.co_argcount + code.co_kwonlyargcount]
    try:  # an exception raised inside Orbax's coroutine, as its failed reads' are
        asyncio.run(read(*[None] * code.co_argcount, **dict.fromkeys(keywords)))
    except Exception as e:
        leftover = e

    def restore(subset):
        logging.getLogger("asyncio").error(
            "Task exception was never retrieved\nfuture: <Task finished>", exc_info=leftover
        )
        raise ValueError("NOT_FOUND: Error reading local file")

    monkeypatch.setattr(logging.getLogger("asyncio"), "filters", [])  # as in a fresh process
    abstract = {"params/embedding": jax.ShapeDtypeStruct((1,), np.float32)}
    with pytest.raises(CheckpointError, match=f"step 5 of {path!r} is damaged"):
        orbax.read_arrays(os.path.join(path, "5", "state"), path, 5, abstract, restore=restore)
    assert [r.getMessage() for r in caplog.records if r.name == "asyncio"] == []
