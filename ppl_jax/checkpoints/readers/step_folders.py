"""`StepFolders`: the step lookup of a reader whose run saves one folder per step.

levanter/marin (`step-<N>/`), EasyDeL (`run-<N>/`) and T5X (`checkpoint_<N>/`) keep every step
in its own folder, complete when a marker file is in it (levanter's `metadata.json`, EasyDeL's
`tensorstore_index.json`, T5X's `checkpoint`). One mixin lists the complete steps, resolves the
one asked for, and names its folder; the readers say only the folder's name and the marker.
"""

from __future__ import annotations

import re

from ppl_jax.errors import CheckpointError
from ppl_jax.runtime import paths


def step_number(pattern: re.Pattern, path: str) -> int | None:
    """The step number in a folder's name (the last part of `path`) if `pattern` matches it
    whole (its first group), else None."""
    found = pattern.fullmatch(path.rstrip("/").rsplit("/", 1)[-1])
    return int(found.group(1)) if found else None


class StepFolders:
    """Steps as folders of `self.path` (or `self.single`: the path is one step's folder).

    A reader sets `STEP` (the folder name's pattern, the number its first group), `FOLDER` (the
    name of step N's folder, `str.format`ted with `step`), `NONE_YET` (what the run holds when
    no step is complete, after "holds no"), `A_STEP` (what a listed step is) and implements
    `complete(folder)`.

    Raises (`steps`, `resolve_step`):
      CheckpointError: the directory is missing, holds no complete step, or not the step asked
        for (the sentence lists the steps it holds).
    """

    STEP: re.Pattern
    FOLDER: str
    NONE_YET: str
    A_STEP: str = "a complete step"
    path: str
    single: bool

    def complete(self, folder: str) -> bool:
        """Whether `folder` holds a complete step (its marker)."""
        raise NotImplementedError

    def steps(self) -> list[int]:
        if self.single:
            return []
        if not paths.isdir(self.path):
            raise CheckpointError(f"checkpoint.dir: no such directory {self.path!r}.")
        found = [(step_number(self.STEP, n), n) for n in paths.listdir(self.path)]
        return sorted(
            n for n, name in found if n is not None and self.complete(paths.join(self.path, name))
        )

    def resolve_step(self, step: int | None) -> int | None:
        if self.single:
            return None
        steps = self.steps()
        if not steps:
            raise CheckpointError(f"{self.path!r} holds no {self.NONE_YET}.")
        if step is None:
            return steps[-1]
        if step not in steps:
            raise CheckpointError(
                f"step {step} is not {self.A_STEP} of {self.path!r} (its steps: "
                f"{', '.join(map(str, steps))})."
            )
        return step

    def _folder(self, step: int | None) -> str:
        return self.path if step is None else paths.join(self.path, self.FOLDER.format(step=step))

    def files(self, step: int | None) -> str:
        return self._folder(step)

    def _where(self, step: int | None) -> str:
        return f"{self.path!r}" + (f" step {step}" if step is not None else "")
