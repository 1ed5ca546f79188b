"""Command-line runs on two processes killed halfway (a preemption notice reaching one host of
two; one host of two lost) and run again with the same command end with the results of an
uninterrupted run on two processes, bit for bit."""

from __future__ import annotations

import signal

import pytest
from test_resume_cli import killed_then_resumed, whole_run


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> dict:
    return whole_run(tmp_path_factory, 2)


SIGNALS = [signal.SIGTERM, signal.SIGKILL]


@pytest.mark.parametrize("sig", SIGNALS, ids=[s.name for s in SIGNALS])
def test_killed_halfway_on_two_processes_then_the_same_command_resumes(
    tmp_path, uninterrupted, sig
):
    killed_then_resumed(tmp_path, uninterrupted, sig, 2)
