"""The harness model's `--model_args`, checked before any weight is read (no lm_eval import).

`open_model` turns the keys into the checkpoint, step, model, tokenizer and mesh, exactly as the
command line and the library resolve them (`ppl_jax.checkpoints.Checkpoint.tokenizer_for`): a
bad value is one sentence naming the key, and a tokenizer with neither BOS nor EOS (and no
`prefix_token_id`) is refused here, in the caller's words, not when the first empty context is
scored after the tasks were built. `check_command_line` runs it on the harness's own argv before
lm-evaluation-harness indexes its tasks.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from ppl_jax import tokenizer as tokenizer_lib
from ppl_jax.checkpoints import Checkpoint, architecture, open_checkpoint
from ppl_jax.errors import ConfigError
from ppl_jax.models.interface import LanguageModel
from ppl_jax.runtime import mesh as mesh_lib

COMMAND_LINE = "give prefix_token_id=ID in --model_args"
LIBRARY = "pass prefix_token_id=ID to PplJaxLM (or PplJaxLM.from_params)"
KEYS = ("checkpoint", "step", "format", "dtype", "attention", "tokenizer", "seq_len",
        "batch_size", "packing", "mesh_data", "mesh_model", "add_bos_token", "prefix_token_id",
        "device", "max_batch_size")  # fmt: skip


def integer(key: str, value: Any, default: int | None = None) -> int | None:
    """A model_args value as an integer (`default` for None or '').

    Raises:
      ConfigError: `model_args: key=value is not an integer.`
    """
    if value is None or (isinstance(value, str) and not value.strip()):
        return default
    try:
        if isinstance(value, bool):
            raise ValueError(value)
        return int(str(value).strip())
    except (TypeError, ValueError):
        raise ConfigError(f"model_args: {key}={value} is not an integer.") from None


def step_of(value: Any) -> int | None:
    """The `step` key: None for None, '' or `latest`; else a step number (0 or more).

    Raises:
      ConfigError: anything else, naming it.
    """
    if isinstance(value, str) and value.strip().lower() in ("", "latest"):
        return None
    step = integer("step", value)
    if step is not None and step < 0:
        raise ConfigError(f"model_args: step={value} is not a step number (0 or more, or latest).")
    return step


def flag(key: str, value: Any) -> bool | None:
    """A model_args value as a bool (`true`, `false`, 1, 0), or None for None.

    Raises:
      ConfigError: anything else.
    """
    if value is None or isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("true", "1", "yes"):
        return True
    if text in ("false", "0", "no"):
        return False
    raise ConfigError(f"model_args: {key}={value} is not true or false.")


def check_prefix(tok: tokenizer_lib.Tokenizer, prefix_token_id: int | None, words: str) -> None:
    """Refuses a tokenizer with neither BOS nor EOS and no `prefix_token_id`: an empty context
    and a rolling document's first token need a prefix token (HFLM's `prefix_token_id`).

    Raises:
      ConfigError: in the caller's words (`COMMAND_LINE`, `LIBRARY`).
    """
    if prefix_token_id is None and tok.bos_id is None and tok.eos_id is None:
        raise ConfigError(
            f"the tokenizer ({tok.name}) has neither a BOS nor an EOS token to stand for an empty "
            f"context or precede a document; {words}."
        )


@dataclasses.dataclass
class Opened:
    """What `--model_args` resolve to before any weight is read."""

    ckpt: Checkpoint
    step: int | None
    dtype: str
    attention: str
    model: LanguageModel
    tokenizer: tokenizer_lib.Tokenizer
    mesh: Any
    seq_len: int | None
    batch_size: int
    packing: bool
    add_bos_token: bool | None
    prefix_token_id: int | None


def open_model(words: str = LIBRARY, **args: Any) -> Opened:
    """The harness model's keys (`KEYS`; see `PplJaxLM`) resolved and checked, no weight read.

    Raises:
      ConfigError: an unknown key, no checkpoint, a value of the wrong kind (naming the key), a
        tokenizer without BOS or EOS and no prefix token (in `words`); as `open_checkpoint`,
        `Checkpoint.tokenizer_for` and the mesh.
      CheckpointError: as the checkpoint's reader.
    """
    unknown = sorted(set(args) - set(KEYS))
    if unknown:
        raise ConfigError(
            f"model_args: unknown key(s) {', '.join(unknown)} for --model ppl_jax; see "
            f"docs/harness.md for the keys it takes."
        )
    checkpoint = args.get("checkpoint")
    if not checkpoint:
        raise ConfigError(
            "model_args: --model ppl_jax needs checkpoint=DIR (an Orbax or Hugging Face "
            "checkpoint directory, or a hub id hf://org/name)."
        )
    ckpt = (
        checkpoint
        if isinstance(checkpoint, Checkpoint)
        else open_checkpoint(str(checkpoint), str(args.get("format") or "auto"))
    )
    step = step_of(args.get("step"))
    seq_len = integer("seq_len", args.get("seq_len"))
    batch = args.get("batch_size", 8)
    batch_size = 8 if str(batch).startswith("auto") else integer("batch_size", batch, 8)
    prefix = integer("prefix_token_id", args.get("prefix_token_id"))
    mesh = mesh_lib.make_mesh(
        integer("mesh_data", args.get("mesh_data"), -1),
        integer("mesh_model", args.get("mesh_model"), 1),
    )
    dtype = str(args.get("dtype") or "float32")
    step = ckpt.resolve_step(step)
    arch = architecture.resolve(ckpt, step)
    attention = arch.attention(str(args.get("attention") or "auto"), dtype, mesh)
    model = arch.model(dtype, attention)
    tok, _ = ckpt.tokenizer_for(
        str(args.get("tokenizer") or "auto"), step=step, model=model, key="tokenizer"
    )
    check_prefix(tok, prefix, words)
    packing = flag("packing", args.get("packing", True))
    return Opened(ckpt, step, dtype, attention, model, tok, mesh, seq_len, batch_size,
                  True if packing is None else packing, flag("add_bos_token", args.get("add_bos_token")),
                  prefix)  # fmt: skip


def _model_args(argv: Sequence[str]) -> tuple[str | None, str | None]:
    """`--model` and `--model_args` of the harness's argv (either `--key value` or
    `--key=value`)."""
    found: dict[str, str] = {}
    for i, arg in enumerate(argv):
        for key in ("--model", "--model_args"):
            if arg == key and i + 1 < len(argv):
                found[key] = argv[i + 1]
            elif arg.startswith(key + "="):
                found[key] = arg[len(key) + 1 :]
    return found.get("--model"), found.get("--model_args")


def check_command_line(argv: Sequence[str]) -> None:
    """For `--model ppl_jax`, checks `--model_args` (`open_model`, no weight read) before the
    harness indexes its tasks, so that a mistake is reported in seconds, in the command line's
    words.

    Raises:
      ConfigError, CheckpointError: as `open_model`.
    """
    model, model_args = _model_args(argv)
    if model != "ppl_jax" or model_args is None:
        return
    args = {}
    for part in model_args.split(","):
        key, sep, value = part.partition("=")
        if sep and key.strip():
            args[key.strip()] = value.strip()
    if model_args.strip().startswith("{"):
        return  # a JSON dict: the harness parses it, the constructor checks it
    open_model(COMMAND_LINE, **args)
