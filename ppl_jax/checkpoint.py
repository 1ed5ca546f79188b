"""Orbax checkpoints: training states saved by a training loop, restored as params for scoring.

All Orbax calls of ppl_jax live here. A checkpoint directory is an Orbax `CheckpointManager`
directory of numbered steps; each step holds two items:

- `state`: the training state `{"step", "params", "opt_state"}` (optax state included);
- `metadata`: JSON `{"model": <architecture>, "tokenizer": <tokenizer description>}`,

so that evaluation needs only the directory. Restoring reads the `metadata`, then only the
`params` subtree of `state` (the optimizer state is never read), straight into the target
shardings, and then checks every weight (MaxText's `_raise_on_weight_mismatch` habit: Orbax does
not raise for a leaf missing from the checkpoint when partial restore is on; we do).
"""

from __future__ import annotations

import os
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp

from ppl_jax.errors import CheckpointError

STATE = "state"
METADATA = "metadata"


def save_train_state(
    directory: str,
    step: int,
    state: dict[str, Any],
    metadata: dict[str, Any],
    max_to_keep: int | None = None,
) -> None:
    """Saves a training state `{"step", "params", "opt_state"}` and its metadata as `step`.

    Args:
      directory: the checkpoint directory (created if absent).
      step: the step number.
      state: the training state; `params` is a string-keyed dict of arrays.
      metadata: `{"model": architecture dict, "tokenizer": tokenizer description}`.
      max_to_keep: how many steps to keep (None keeps all).
    """
    options = ocp.CheckpointManagerOptions(max_to_keep=max_to_keep, create=True)
    with ocp.CheckpointManager(os.path.abspath(directory), options=options) as manager:
        manager.save(
            step,
            args=ocp.args.Composite(
                **{
                    STATE: ocp.args.StandardSave(state),
                    METADATA: ocp.args.JsonSave(metadata),
                }
            ),
        )
        manager.wait_until_finished()


def _manager(directory: str) -> ocp.CheckpointManager:
    if not os.path.isdir(directory):
        raise CheckpointError(
            f"checkpoint.dir: no such directory {directory!r}. Give an Orbax checkpoint "
            f"directory (numbered step folders inside)."
        )
    return ocp.CheckpointManager(
        os.path.abspath(directory),
        item_handlers={STATE: ocp.PyTreeCheckpointHandler(), METADATA: ocp.JsonCheckpointHandler()},
        options=ocp.CheckpointManagerOptions(read_only=True),
    )


def _pick_step(manager: ocp.CheckpointManager, directory: str, step: int | None) -> int:
    steps = sorted(manager.all_steps())
    if not steps:
        raise CheckpointError(
            f"checkpoint.dir {directory!r} holds no finalized checkpoint step (an interrupted save "
            f"leaves none). Point checkpoint.dir at a directory of saved steps."
        )
    if step is None:
        return steps[-1]
    if step not in steps:
        raise CheckpointError(
            f"checkpoint.step={step} is not in {directory!r}; its finalized steps are "
            f"{steps}. Set checkpoint.step to one of them, or to 'latest'."
        )
    return step


def read_metadata(directory: str, step: int | None) -> tuple[int, dict[str, Any]]:
    """The chosen step and its metadata (`model` architecture, `tokenizer` description).

    Args:
      directory: the checkpoint directory.
      step: a step number, or None for the latest finalized step.

    Raises:
      CheckpointError: no such directory, no finalized step, the step is absent, or the step
        has no metadata item.
    """
    with _manager(directory) as manager:
        chosen = _pick_step(manager, directory, step)
        if not os.path.isdir(os.path.join(directory, str(chosen), METADATA)):
            raise CheckpointError(
                f"step {chosen} of {directory!r} has no '{METADATA}' item (the model "
                f"architecture and tokenizer); save checkpoints with "
                f"ppl_jax.checkpoint.save_train_state."
            )
        restored = manager.restore(
            chosen, args=ocp.args.Composite(**{METADATA: ocp.args.JsonRestore()})
        )
        return chosen, dict(restored[METADATA])


def _paths(tree: Any) -> dict[str, Any]:
    flat = jax.tree_util.tree_flatten_with_path(tree)[0]
    return {"/".join(str(getattr(k, "key", k)) for k in path): leaf for path, leaf in flat}


def restore_params(directory: str, step: int, target: Any) -> Any:
    """Restores only `params` of the training state at `step`, into the given shardings.

    Args:
      directory: the checkpoint directory.
      step: a finalized step (see `read_metadata`).
      target: the params tree with `jax.ShapeDtypeStruct(shape, dtype, sharding=...)` leaves;
        stored weights are cast to each leaf's dtype.

    Returns:
      The params tree of `jax.Array`s, each with its target sharding.

    Raises:
      CheckpointError: naming every weight that is missing or of another shape.
    """
    with _manager(directory) as manager:
        stored = manager.item_metadata(step)[STATE]
        stored_tree = getattr(stored, "tree", stored)
        if not isinstance(stored_tree, dict) or "params" not in stored_tree:
            raise CheckpointError(
                f"step {step} of {directory!r} holds no training state with 'params'."
            )
        stored_shapes = {k: tuple(v.shape) for k, v in _paths(stored_tree["params"]).items()}
        expected = _paths(target)
        problems = []
        for name, want in expected.items():
            if name not in stored_shapes:
                problems.append(f"'{name}' is missing")
            elif stored_shapes[name] != tuple(want.shape):
                problems.append(
                    f"'{name}' has shape {stored_shapes[name]}, the architecture says "
                    f"{tuple(want.shape)}"
                )
        if problems:
            raise CheckpointError(
                f"step {step} of {directory!r} does not match the stored architecture: "
                + "; ".join(problems)
                + ". The checkpoint is partial or belongs to another model."
            )
        abstract = {"params": target}
        restored = manager.restore(
            step,
            args=ocp.args.Composite(
                **{
                    STATE: ocp.args.PyTreeRestore(
                        item=abstract,
                        restore_args=ocp.checkpoint_utils.construct_restore_args(abstract),
                        partial_restore=True,
                    )
                }
            ),
        )
    params = restored[STATE]["params"]
    got = _paths(params)
    for name, want in expected.items():
        leaf = got.get(name)
        if not isinstance(leaf, jax.Array) or leaf.shape != want.shape or leaf.dtype != want.dtype:
            raise CheckpointError(
                f"weight '{name}' of step {step} in {directory!r} did not restore as "
                f"{want.dtype}{list(want.shape)} (got {type(leaf).__name__} "
                f"{getattr(leaf, 'dtype', '')}{list(np.shape(leaf)) if leaf is not None else ''})."
            )
    return params
