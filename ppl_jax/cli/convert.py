"""Converts a Hugging Face checkpoint directory into a ppl_jax Orbax checkpoint. Wiring only.

    python -m ppl_jax.convert --hf_dir=DIR --out=ORBAX_DIR [--dtype=float32]

The params are read with `ppl_jax.checkpoints.hf.load_params` onto a mesh over every device (`data` = all,
`model` = 1, the default sharding rules), then saved with `ppl_jax.checkpoints.orbax.save_train_state`
as step 0 of `{"step": 0, "params": ..., "opt_state": {}}` with the metadata
`{"model": description, "tokenizer": tokenizer description or None, "source": ...}`, so that
`checkpoint.read_metadata`, `model.build` and `checkpoint.restore_params` load it like any other
ppl_jax checkpoint. A user's mistake prints `ppl-jax: error: ...` and exits with status 2.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from absl import app, flags, logging

_HF_DIR = flags.DEFINE_string(
    "hf_dir",
    None,
    "Hugging Face checkpoint directory (config.json, safetensors weights, tokenizer).",
)
_OUT = flags.DEFINE_string(
    "out", None, "Orbax checkpoint directory to create (must not exist or be empty)."
)
_DTYPE = flags.DEFINE_enum(
    "dtype", "float32", ["float32", "bfloat16"], "dtype of the saved params."
)


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
        any error of `hf.read_description` / `hf.load_params` / `hf.load_tokenizer`.
      ConfigError: an unknown dtype.
    """
    import jax.numpy as jnp

    from ppl_jax.checkpoints import hf
    from ppl_jax.checkpoints import orbax as checkpoint
    from ppl_jax.config.defaults import DEFAULT_RULES
    from ppl_jax.errors import CheckpointError, ConfigError
    from ppl_jax.models import nnx as nnx_lib
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
    model = nnx_lib.build(hf.read_description(hf_dir), dtypes[dtype])
    tok = hf.load_tokenizer(hf_dir) if hf.has_tokenizer(hf_dir) else None
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


def main(argv: list[str]) -> None:
    from ppl_jax.errors import PplJaxError

    logging.set_verbosity(logging.ERROR)  # Orbax's informational logs are not for users
    if len(argv) > 1:
        _fail(f"unexpected arguments: {' '.join(argv[1:])}")
    if not _HF_DIR.value or not _OUT.value:
        _fail(
            "give both --hf_dir=DIR (a Hugging Face checkpoint) and --out=DIR (the Orbax "
            "checkpoint to write)."
        )
    try:
        meta = convert(
            os.path.expanduser(_HF_DIR.value), os.path.expanduser(_OUT.value), _DTYPE.value
        )
    except PplJaxError as e:
        _fail(str(e))
    tok = "no tokenizer" if meta["tokenizer"] is None else meta["tokenizer"]["type"] + " tokenizer"
    print(f"wrote {_OUT.value} (step 0, {meta['model']['family']} family, {_DTYPE.value}, {tok})")


def _fail(message: str) -> None:
    print(f"ppl-jax: error: {message}", file=sys.stderr)
    sys.exit(2)


def _parse_flags(argv: list[str]) -> list[str]:
    try:
        return flags.FLAGS(argv)
    except flags.Error as e:
        _fail(f"bad flag: {e}. --helpfull lists the flags.")


if __name__ == "__main__":
    app.run(main, flags_parser=_parse_flags)
