"""Errors for a user's mistakes: bad input, bad settings, bad checkpoints.

Every error a user can cause by what they pass in (a path, a setting, a corpus, a checkpoint) is a
`PplJaxError`. The command line prints its message as one paragraph and exits with status 2,
without a traceback; anything else is a bug in ppl_jax and keeps its traceback.
"""

from __future__ import annotations


class PplJaxError(Exception):
    """A user-facing error: the message names the file, document, weight or setting, and the fix."""


class ConfigError(PplJaxError):
    """A setting is out of range or inconsistent with the model, the mesh or the devices."""


class DataError(PplJaxError):
    """The corpus cannot be read or scored: missing path, empty corpus, bad UTF-8, bad token id."""


class CheckpointError(PplJaxError):
    """The checkpoint directory is missing, unfinished, or lacks a weight of the right shape."""


class NumericsError(PplJaxError):
    """The model produced a NaN or an infinity at a scored position."""


class Interrupted(PplJaxError):
    """The run stopped on a signal (SIGTERM, SIGINT) after saving its journal; the message says
    where it stopped and how to resume. `exit_code` is 128 + the signal number."""

    def __init__(self, message: str, exit_code: int):
        super().__init__(message)
        self.exit_code = exit_code
