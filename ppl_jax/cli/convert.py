"""Converts a Hugging Face checkpoint directory into a ppl_jax Orbax checkpoint. Wiring only.

    ppl-jax convert HF_DIR ORBAX_DIR [--step N] [--dtype float32|bfloat16]

The params are read with `ppl_jax.checkpoints.formats.safetensors.load_params` onto a mesh over
every device (`data` = all, `model` = 1, the default sharding rules), then saved with
`ppl_jax.checkpoints.formats.orbax.save_train_state` as step N (default 0) of
`{"step": N, "params": ..., "opt_state": {}}` with the metadata
`{"model": description, "tokenizer": tokenizer description or None, "source": ...}`, so that
`checkpoint.read_metadata`, `model.build` and `checkpoint.restore_params` load it like any other
ppl_jax checkpoint.

A sweep from converted checkpoints: convert each Hugging Face directory into the same ORBAX_DIR
at its own step (`--step 1000`, `--step 2000`, ...), then score `checkpoint.step=all`. A step
the directory holds already is refused (nothing is overwritten), so is a directory that holds
anything but step folders, or steps of another architecture (a sweep scores one model), and a
step past `MAX_STEP`. A user's mistake prints `ppl-jax: error: ...` and exits with status 2.

A convert stopped (SIGTERM, Ctrl-C, `kill -9`) while it saves leaves Orbax's temporary folder of
its step (`N.orbax-checkpoint-tmp-<timestamp>`), which no reader takes for a step: the same
command removes it and writes the step again, and any other command ignores it (finalized steps
are never touched). The stop's line says so (`STOPPED`).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from typing import Any, NoReturn

from absl import logging

from ppl_jax.runtime import preemption

# The largest step: a run's steps travel between processes as int64 (`evaluation/steps.py`).
MAX_STEP = 2**63 - 1
STOPPED = (
    "the step it was writing is left unfinished (N.orbax-checkpoint-tmp-*, never read as a step), "
    "and the same command removes it and writes the step again; finished steps are untouched"
)


def convert(hf_dir: str, out_dir: str, dtype: str = "float32", step: int = 0) -> dict[str, Any]:
    """Converts `hf_dir` into step `step` of the Orbax checkpoint `out_dir`.

    Args:
      hf_dir: a Hugging Face directory (see
        `ppl_jax.checkpoints.formats.safetensors.is_hf_checkpoint`).
      out_dir: the Orbax checkpoint directory: new, empty, or one this command wrote (its step
        folders only), whose steps hold the same architecture.
      dtype: `float32` or `bfloat16`, the dtype of the saved params.
      step: the step number to save it as (0 to `MAX_STEP`), not one `out_dir` holds; an
        unfinished save of it (Orbax's temporary folder, left by a stopped convert) is removed.

    Returns:
      The metadata saved beside the params.

    Raises:
      CheckpointError: not a Hugging Face directory; an output directory that holds something
        other than step folders, holds `step` already, or holds another architecture (checked
        before any weight is read); or any error of `safetensors.read_description` /
        `safetensors.load_params` / `safetensors.read_tokenizer`.
      ConfigError: an unknown dtype, a step below 0 or past `MAX_STEP`.
    """
    import jax.numpy as jnp

    from ppl_jax.checkpoints.formats import orbax as checkpoint
    from ppl_jax.checkpoints.formats import safetensors
    from ppl_jax.config.defaults import DEFAULT_RULES
    from ppl_jax.errors import CheckpointError, ConfigError
    from ppl_jax.models import registry
    from ppl_jax.runtime import mesh as mesh_lib

    dtypes = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}
    if dtype not in dtypes:
        raise ConfigError(f"--dtype={dtype!r} is not one of {', '.join(dtypes)}.")
    if isinstance(step, bool) or not isinstance(step, int) or not 0 <= step <= MAX_STEP:
        raise ConfigError(
            f"--step={step!r}: give the step as a whole number from 0 to {MAX_STEP:,} (nothing "
            f"was written)."
        )
    if not safetensors.is_hf_checkpoint(hf_dir):
        raise CheckpointError(
            f"--hf_dir={hf_dir!r} is not a Hugging Face checkpoint directory (config.json and "
            f"model.safetensors or model.safetensors.index.json)."
        )
    model = registry.build(safetensors.read_description(hf_dir), dtypes[dtype])
    unfinished = _check_out(out_dir, step, model.description)
    tok = safetensors.read_tokenizer(hf_dir) if safetensors.has_tokenizer(hf_dir) else None
    mesh = mesh_lib.make_mesh(-1, 1)
    target, _ = mesh_lib.param_targets(
        model.abstract_params, model.logical_axes, mesh, DEFAULT_RULES
    )
    params = safetensors.load_params(hf_dir, target)
    metadata = {
        "model": model.description,
        "tokenizer": tok.describe() if tok is not None else None,
        "source": {"format": "hf", "dir": os.path.abspath(hf_dir)},
    }
    for folder in unfinished:  # a stopped convert's, of this step: written again below
        shutil.rmtree(folder)
    checkpoint.save_train_state(
        out_dir, step, {"step": step, "params": params, "opt_state": {}}, metadata
    )
    return metadata


def _check_out(out_dir: str, step: int, description: dict[str, Any]) -> list[str]:
    """Refuses (CheckpointError, one sentence) an output directory that is not a new or empty
    one, nor one of step folders without `step` whose latest step holds `description`; Orbax's
    temporary folders of unfinished saves are let be. Returns those of `step` (to remove)."""
    import jax.numpy as jnp

    from ppl_jax.checkpoints.formats import orbax as checkpoint
    from ppl_jax.errors import CheckpointError
    from ppl_jax.models import registry

    if not os.path.exists(out_dir):
        return []
    if not os.path.isdir(out_dir):
        raise CheckpointError(f"--out={out_dir!r} is a file; give a directory.")
    names, mine = [], []  # mine: Orbax's temporary folders of `step`'s unfinished saves
    for n in os.listdir(out_dir):
        tmp = checkpoint.unfinished_step(n) if os.path.isdir(f"{out_dir}/{n}") else None
        if tmp is None:
            names.append(n)
        elif tmp == step:
            mine.append(os.path.join(out_dir, n))
    if not names:
        return mine
    others = sorted(n for n in names if not (n.isdigit() and os.path.isdir(f"{out_dir}/{n}")))
    if others:
        raise CheckpointError(
            f"--out={out_dir!r} holds {others[0]!r}, not a step folder of a converted "
            f"checkpoint; give a new directory, or one this command wrote."
        )
    if any(int(n) == step for n in names):
        raise CheckpointError(
            f"--out={out_dir!r} already holds step {step}; give another --step (nothing was "
            f"written)."
        )
    latest, meta = checkpoint.read_metadata(out_dir, None)
    stored = registry.build(meta["model"], jnp.float32, "xla").description
    if stored != description:
        raise CheckpointError(
            f"--out={out_dir!r} holds step {latest} of another architecture than the Hugging "
            f"Face directory's; a sweep scores the steps of one model, so give another --out."
        )
    return mine


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line, as for every other mistake
        self.exit(2, f"ppl-jax: error: bad flag: {message} (see ppl-jax convert --help)\n")


def main(argv: list[str] | None = None) -> int:
    """`ppl-jax convert HF_DIR OUT [--step N] [--dtype float32|bfloat16]` (also `--hf_dir=`,
    `--out=`); a stop by a signal meanwhile says `STOPPED`."""
    with preemption.stop_note(STOPPED):
        return _main(argv)


def _main(argv: list[str] | None) -> int:
    from ppl_jax.errors import PplJaxError

    parser = _Parser(
        prog="ppl-jax convert",
        description="Converts a Hugging Face checkpoint directory into a ppl_jax Orbax "
        "checkpoint (step 0, or --step N), which ppl-jax then reads without safetensors. "
        "Converting several directories into one OUT at their own steps makes a sweep "
        "(score it with --config.checkpoint.step=all).",
    )
    parser.add_argument(
        "hf_dir_arg", nargs="?", metavar="HF_DIR", help="the Hugging Face directory"
    )
    parser.add_argument("out_arg", nargs="?", metavar="OUT", help="the Orbax directory to write")
    parser.add_argument("--hf_dir", help="the same as HF_DIR")
    parser.add_argument("--out", help="the same as OUT")
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    parser.add_argument(
        "--step",
        type=int,
        default=0,
        metavar="N",
        help="the step to save it as (default 0); OUT may hold other steps of the same model",
    )
    args = parser.parse_args(argv)
    logging.set_verbosity(logging.ERROR)  # Orbax's informational logs are not for users
    hf_dir, out = args.hf_dir or args.hf_dir_arg, args.out or args.out_arg
    if not hf_dir or not out:
        return _fail(
            "give both the Hugging Face checkpoint and the Orbax checkpoint to write: "
            "ppl-jax convert HF_DIR OUT."
        )
    try:
        meta = convert(os.path.expanduser(hf_dir), os.path.expanduser(out), args.dtype, args.step)
    except PplJaxError as e:
        return _fail(str(e))
    tok = "no tokenizer" if meta["tokenizer"] is None else meta["tokenizer"]["type"] + " tokenizer"
    print(f"wrote {out} (step {args.step}, {meta['model']['family']} family, {args.dtype}, {tok})")
    return 0


def _fail(message: str) -> int:
    print(f"ppl-jax: error: {message}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
