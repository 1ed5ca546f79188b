"""Errors for a user's mistakes: bad input, bad settings, bad checkpoints.

Every error a user can cause by what they pass in (a path, a setting, a corpus, a checkpoint) is a
`PplJaxError`. The command line prints its message as one paragraph and exits with status 2,
without a traceback; anything else is a bug in ppl_jax and keeps its traceback.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator


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


def quoted(value: object, limit: int = 60) -> str:
    """`repr(value)` cut to `limit` characters, ending in "...", for a bad value named in an
    error's sentence (a config's or a file's value may be megabytes long)."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


_CHECKPOINT_KEY = re.compile(r"(?<![\w.])checkpoint\.(dir|step|format)\b")


@contextlib.contextmanager
def settings_named(prefix: str) -> Iterator[None]:
    """Within the block, an error whose sentence names the scored model's settings
    `checkpoint.dir`, `checkpoint.step` or `checkpoint.format` is raised again naming those of
    another model opened by the same readers: `<prefix>.dir`, ... (`longppl.evaluator`,
    `reference.checkpoint`), so that the sentence names the setting to fix.

    Raises:
      PplJaxError: the same kind of error, its settings renamed (`Interrupted` unchanged).
    """
    try:
        yield
    except PplJaxError as e:
        text = _CHECKPOINT_KEY.sub(lambda m: f"{prefix}.{m.group(1)}", str(e))
        if isinstance(e, Interrupted) or text == str(e):
            raise
        raise type(e)(text) from None
