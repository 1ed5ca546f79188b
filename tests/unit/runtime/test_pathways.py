"""Pathways on Cloud, simulated on CPU (issue 38 item 7): under `JAX_PLATFORMS=proxy` the one
controller joins no processes whatever the cluster's variables say, registers the proxy backend
through `pathwaysutils`, and a device without memory statistics is no error."""

from __future__ import annotations

import os
import sys
import types

import pytest
from test_rollcall import _slurm

from ppl_jax.errors import ConfigError
from ppl_jax.runtime import distributed, pathways, rollcall


@pytest.mark.parametrize("platforms", ["proxy", "proxy,cpu", "cpu, Proxy", "tpu,cpu,proxy,gpu"])
def test_pathways_is_named_by_jax_platforms(monkeypatch, platforms):
    assert pathways.in_use(platforms)
    monkeypatch.setenv("JAX_PLATFORMS", platforms)
    assert pathways.in_use()


@pytest.mark.parametrize("platforms", ["", "cpu", "tpu", "cpu,tpu,gpu", "proxyless"])
def test_other_platforms_are_not_pathways(monkeypatch, platforms):
    assert not pathways.in_use(platforms)
    monkeypatch.setenv("JAX_PLATFORMS", platforms)
    assert not pathways.in_use()


def _never(what):
    def called(*args, **kwargs):
        raise AssertionError(f"{what} called under Pathways")

    return called


def _fake_pathwaysutils(monkeypatch) -> list[str]:
    calls = []
    module = types.ModuleType("pathwaysutils")
    module.initialize = lambda: calls.append("pathwaysutils.initialize")
    monkeypatch.setitem(sys.modules, "pathwaysutils", module)
    return calls


def _gke_tpu(monkeypatch) -> None:
    """The variables GKE sets in worker 1 of a 2-host TPU slice's JobSet."""
    for name in list(os.environ):
        if name.startswith(("SLURM_", "OMPI_", "PPL_JAX_", "JAX_COORDINATOR")):
            monkeypatch.delenv(name)
    monkeypatch.setenv("TPU_WORKER_HOSTNAMES", "w-0.ppl,w-1.ppl")
    monkeypatch.setenv("TPU_WORKER_ID", "1")


@pytest.mark.parametrize("cluster", ["slurm", "gke_tpu"])
def test_under_pathways_no_process_joins(monkeypatch, cluster):
    """`PPL_JAX_DISTRIBUTED=1` and a cluster's variables (SLURM's, GKE's TPU ones), yet neither
    the roll call nor `jax.distributed.initialize` runs: the proxy backend is registered once."""
    import jax

    _slurm(monkeypatch, 4095, 1) if cluster == "slurm" else _gke_tpu(monkeypatch)
    monkeypatch.setenv("PPL_JAX_DISTRIBUTED", "1")
    monkeypatch.setenv("JAX_PLATFORMS", "proxy")
    calls = _fake_pathwaysutils(monkeypatch)
    monkeypatch.setattr(jax.distributed, "initialize", _never("jax.distributed.initialize"))
    monkeypatch.setattr(rollcall, "detect_cluster", _never("the cluster detection"))
    monkeypatch.setattr(rollcall, "roll_call", _never("the roll call"))
    hook = sys.excepthook
    assert distributed.initialize_from_env() is False
    assert calls == ["pathwaysutils.initialize"]
    assert sys.excepthook is hook  # no lost-process guard: there are no other processes


def test_several_processes_under_pathways_is_one_sentence(monkeypatch):
    monkeypatch.setenv("JAX_PLATFORMS", "proxy")
    monkeypatch.setenv("PPL_JAX_NUM_PROCESSES", "2")
    monkeypatch.setenv("PPL_JAX_PROCESS_ID", "0")
    monkeypatch.setenv("PPL_JAX_COORDINATOR", "localhost:1234")
    calls = _fake_pathwaysutils(monkeypatch)
    with pytest.raises(ConfigError, match=r"^PPL_JAX_NUM_PROCESSES=2 .* one controller .*\.$"):
        distributed.initialize_from_env()
    assert calls == []


def test_pathways_without_pathwaysutils_is_one_sentence(monkeypatch):
    monkeypatch.delenv("PPL_JAX_NUM_PROCESSES", raising=False)
    monkeypatch.setenv("JAX_PLATFORMS", "proxy,cpu")
    monkeypatch.setitem(sys.modules, "pathwaysutils", None)  # import raises ImportError
    with pytest.raises(ConfigError, match=r"JAX_PLATFORMS=proxy,cpu .*pip install pathwaysutils"):
        distributed.initialize_from_env()


class _Device:
    def __init__(self, answer):
        self.answer = answer

    def memory_stats(self):
        if isinstance(self.answer, BaseException):
            raise self.answer
        return self.answer


@pytest.mark.parametrize(
    "answer",
    [None, {}, NotImplementedError("proxy"), RuntimeError("UNIMPLEMENTED: MemoryStats")],
)
def test_a_device_without_memory_statistics_gives_none(answer):
    assert pathways.memory_stats(_Device(answer)) == {}
    assert pathways.memory_stats(object()) == {}  # no such method at all
    assert pathways.memory_stats(_Device({"peak_bytes_in_use": 7})) == {"peak_bytes_in_use": 7}


def test_the_benchmarks_read_memory_statistics_that_may_be_missing(monkeypatch):
    """Where ppl_jax's code reads `memory_stats()` (the benchmarks' peak device memory)."""
    import jax

    from benchmarks import bench_long_gpu

    for answer in (None, RuntimeError("UNIMPLEMENTED"), {"peak_bytes_in_use": 7}):
        monkeypatch.setattr(jax, "devices", lambda answer=answer: [_Device(answer)])
        expected = 7 if isinstance(answer, dict) else None
        assert bench_long_gpu._peak_bytes() == expected
