"""Converts a Hugging Face checkpoint directory into a ppl_jax Orbax checkpoint. Wiring only.

    ppl-jax convert HF_DIR ORBAX_DIR [--dtype float32|bfloat16]

The params are read with `ppl_jax.checkpoints.hf.load_params` onto a mesh over every device (`data` = all,
`model` = 1, the default sharding rules), then saved with `ppl_jax.checkpoints.orbax.save_train_state`
as step 0 of `{"step": 0, "params": ..., "opt_state": {}}` with the metadata
`{"model": description, "tokenizer": tokenizer description or None, "source": ...}`, so that
`checkpoint.read_metadata`, `model.build` and `checkpoint.restore_params` load it like any other
ppl_jax checkpoint. A user's mistake prints `ppl-jax: error: ...` and exits with status 2.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any, NoReturn

from absl import logging


def convert(hf_dir: str, out_dir: str, dtype: str = "float32") -> dict[str, Any]:
    """Converts `hf_dir` into an Orbax checkpoint at `out_dir` (step 0).

    Args:
      hf_dir: a Hugging Face directory (see `ppl_jax.checkpoints.hf.is_hf_checkpoint`).
      out_dir: the Orbax checkpoint directory; it must not exist or must be empty.
      dtype: `float32` or `bfloat16`, the dtype of the saved params.

    Returns:
      The metadata saved beside the params.

    Raises:
      CheckpointError: not a Hugging Face directory, an output directory with files in it, or
        any error of `hf.read_description` / `hf.load_params` / `hf.read_tokenizer`.
      ConfigError: an unknown dtype.
    """
    import jax.numpy as jnp

    from ppl_jax.checkpoints import hf
    from ppl_jax.checkpoints import orbax as checkpoint
    from ppl_jax.config.defaults import DEFAULT_RULES
    from ppl_jax.errors import CheckpointError, ConfigError
    from ppl_jax.models import registry
    from ppl_jax.runtime import mesh as mesh_lib

    dtypes = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}
    if dtype not in dtypes:
        raise ConfigError(f"--dtype={dtype!r} is not one of {', '.join(dtypes)}.")
    if not hf.is_hf_checkpoint(hf_dir):
        raise CheckpointError(
            f"--hf_dir={hf_dir!r} is not a Hugging Face checkpoint directory (config.json and "
            f"model.safetensors or model.safetensors.index.json)."
        )
    if os.path.exists(out_dir) and (not os.path.isdir(out_dir) or os.listdir(out_dir)):
        raise CheckpointError(
            f"--out={out_dir!r} exists and is not an empty directory; give a new path."
        )
    model = registry.build(hf.read_description(hf_dir), dtypes[dtype])
    tok = hf.read_tokenizer(hf_dir) if hf.has_tokenizer(hf_dir) else None
    mesh = mesh_lib.make_mesh(-1, 1)
    target, _ = mesh_lib.param_targets(
        model.abstract_params, model.logical_axes, mesh, DEFAULT_RULES
    )
    params = hf.load_params(hf_dir, target)
    metadata = {
        "model": model.description,
        "tokenizer": tok.describe() if tok is not None else None,
        "source": {"format": "hf", "dir": os.path.abspath(hf_dir)},
    }
    checkpoint.save_train_state(
        out_dir, 0, {"step": 0, "params": params, "opt_state": {}}, metadata
    )
    return metadata


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line, as for every other mistake
        self.exit(2, f"ppl-jax: error: bad flag: {message} (see ppl-jax convert --help)\n")


def main(argv: list[str] | None = None) -> int:
    """`ppl-jax convert HF_DIR OUT [--dtype float32|bfloat16]` (also `--hf_dir=`, `--out=`)."""
    from ppl_jax.errors import PplJaxError

    parser = _Parser(
        prog="ppl-jax convert",
        description="Converts a Hugging Face checkpoint directory into a ppl_jax Orbax "
        "checkpoint (step 0), which ppl-jax then reads without safetensors.",
    )
    parser.add_argument(
        "hf_dir_arg", nargs="?", metavar="HF_DIR", help="the Hugging Face directory"
    )
    parser.add_argument("out_arg", nargs="?", metavar="OUT", help="the Orbax directory to write")
    parser.add_argument("--hf_dir", help="the same as HF_DIR")
    parser.add_argument("--out", help="the same as OUT")
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    args = parser.parse_args(argv)
    logging.set_verbosity(logging.ERROR)  # Orbax's informational logs are not for users
    hf_dir, out = args.hf_dir or args.hf_dir_arg, args.out or args.out_arg
    if not hf_dir or not out:
        return _fail(
            "give both the Hugging Face checkpoint and the Orbax checkpoint to write: "
            "ppl-jax convert HF_DIR OUT."
        )
    try:
        meta = convert(os.path.expanduser(hf_dir), os.path.expanduser(out), args.dtype)
    except PplJaxError as e:
        return _fail(str(e))
    tok = "no tokenizer" if meta["tokenizer"] is None else meta["tokenizer"]["type"] + " tokenizer"
    print(f"wrote {out} (step 0, {meta['model']['family']} family, {args.dtype}, {tok})")
    return 0


def _fail(message: str) -> int:
    print(f"ppl-jax: error: {message}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
