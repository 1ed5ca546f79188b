"""No link leads out of a checkpoint: the protocol runs the one check of links
(`ppl_jax.runtime.paths.refuse_links_out`) before every answer that opens a checkpoint's files,
so that a reader cannot forget it.

`Checkpoint` (`ppl_jax.checkpoints.checkpoint`) is a `LinksChecked`: each method of `OPENING`
that a reader defines is wrapped, when the class is made, in `check_links(step)` first. The
check walks the step's folder (`Checkpoint.files(step)`; the latest step's for `step=None`)
once per reader object and folder, and refuses a link anywhere below it that resolves outside
the checkpoint folder (`Checkpoint.path`). A reader whose files lie elsewhere than below its
`path` (a hub id's snapshot in the hub cache) says where by `links_scope`.
"""

from __future__ import annotations

import functools
from typing import Any, ClassVar

from ppl_jax.runtime import paths

# The protocol's answers that open a checkpoint's files (a reader's own `step` first).
OPENING = (
    "stored",
    "read",
    "restore",
    "carried_description",
    "stored_tokenizer",
    "layout_lines",
    "quantization",
    "identity",
)


def _checked(method):
    @functools.wraps(method)
    def checked(self, step=None, *args: Any, **kwargs: Any):
        self.check_links(step)
        return method(self, step, *args, **kwargs)

    checked.links_checked = True
    return checked


class LinksChecked:
    """The mixin of `Checkpoint` that runs `check_links` before each answer of `OPENING`."""

    OPENING: ClassVar[tuple[str, ...]] = OPENING

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for name in OPENING:
            method = cls.__dict__.get(name)
            if callable(method) and not getattr(method, "links_checked", False):
                setattr(cls, name, _checked(method))

    def links_scope(self, step: int | None) -> tuple[str, str]:
        """`(the folder whose files the answers for `step` open, the checkpoint folder nothing
        may lead out of)`; `step` as the reader resolved it. Default: `files(step)` in `path`."""
        return self.files(step), self.path  # type: ignore[attr-defined]

    def check_links(self, step: int | None) -> None:
        """Refuses a link leading out of the checkpoint below the folder of `step` (None: the
        latest step; `paths.refuse_links_out`), once per folder.

        Raises:
          CheckpointError: such a link, naming it and where it leads; or as `resolve_step`.
        """
        checked: set[str] = self.__dict__.setdefault("_links_checked", set())
        resolved = self.resolve_step(step) if step is None else step  # type: ignore[attr-defined]
        folder, root = self.links_scope(resolved)
        if folder not in checked:
            paths.refuse_links_out(folder, root)
            checked.add(folder)
