"""The tokenizer of a Hugging Face directory: `tokenizer.json` or `tokenizer.model`, with the
BOS/EOS ids and BOS policy of its `tokenizer_config.json`."""

from __future__ import annotations

import os
from typing import Any

from ppl_jax.errors import CheckpointError
from ppl_jax.runtime import paths
from ppl_jax.tokenizer.core import Tokenizer
from ppl_jax.tokenizer.hf import HFTokenizer
from ppl_jax.tokenizer.spm import SentencePieceTokenizer

# The files of a tokenizer folder (a Hugging Face directory's tokenizer).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "tokenizer_config.json")


def has_tokenizer(path: str) -> bool:
    """Whether the directory holds `tokenizer.json` or a SentencePiece `tokenizer.model`."""
    return any(paths.isfile(paths.join(path, n)) for n in ("tokenizer.json", "tokenizer.model"))


def _name(path: str, file: str) -> str:
    return f"{os.path.basename(os.path.normpath(path))}/{file}"


def read_tokenizer(path: str) -> Tokenizer:
    """The tokenizer of a Hugging Face directory, with its BOS/EOS ids and BOS policy.

    `tokenizer.json` (the `tokenizers` library) is preferred to `tokenizer.model`
    (SentencePiece), as transformers does. The BOS policy (`eval.add_bos=auto`) is that of
    transformers >= 5 `AutoTokenizer.from_pretrained(path)`: with a `tokenizer.json`, BOS exactly
    when its post-processor adds one (`add_bos_token` of `tokenizer_config.json` is ignored, as
    transformers 5 drops it); with a `tokenizer.model` only, BOS when `add_bos_token` is true.
    `bos_token` and `eos_token` of `tokenizer_config.json` win where present; otherwise they come
    from the tokenizer itself (see `apply_tokenizer_config`).

    Raises:
      CheckpointError: no tokenizer file, an unreadable one, or a `tokenizer_config.json` that
        does not fit it (see `apply_tokenizer_config`).
    """
    config_path = paths.join(path, "tokenizer_config.json")
    tc = paths.read_json_object(config_path, "") if paths.isfile(config_path) else {}
    try:
        if paths.isfile(paths.join(path, "tokenizer.json")):
            text = paths.read_bytes(paths.join(path, "tokenizer.json")).decode("utf-8")
            tok = HFTokenizer(text, name=_name(path, "tokenizer.json"))
        elif paths.isfile(paths.join(path, "tokenizer.model")) and paths.is_local(path):
            tok = SentencePieceTokenizer.from_file(
                os.path.join(path, "tokenizer.model"), name=_name(path, "tokenizer.model")
            )
        elif paths.isfile(paths.join(path, "tokenizer.model")):
            tok = SentencePieceTokenizer(
                paths.read_bytes(paths.join(path, "tokenizer.model")),
                name=_name(path, "tokenizer.model"),
            )
        else:
            raise CheckpointError(f"{path!r} has no tokenizer.json or tokenizer.model.")
    except CheckpointError:
        raise
    except Exception as e:  # the tokenizer libraries raise their own exception types
        raise CheckpointError(f"the tokenizer in {path!r} cannot be read ({e}).") from None
    apply_tokenizer_config(tok, tc, config_path)
    return tok


def apply_tokenizer_config(tok: Tokenizer, config: dict[str, Any], where: str) -> None:
    """Sets `bos_id`, `eos_id` and `add_bos_default` from a Hugging Face `tokenizer_config.json`,
    as transformers >= 5 `AutoTokenizer.from_pretrained` does.

    Its `bos_token` / `eos_token` (a string, an AddedToken `{"content": ...}`, or null for none)
    win where present; absent keys leave the tokenizer's own values. `add_bos_token` counts only
    for a SentencePiece model: with a `tokenizer.json` transformers 5 drops it (and
    `add_eos_token`) and adds what the tokenizer.json post-processor adds
    (`PreTrainedTokenizerBase._from_pretrained`); a SentencePiece-only directory adds BOS when it
    is true (absent counts as false).

    Raises:
      CheckpointError: a named token that the vocabulary lacks, or BOS asked for but none named.
    """

    for field, attr in (("bos_token", "bos_id"), ("eos_token", "eos_id")):
        if field in config:
            token = config[field]
            token = token.get("content") if isinstance(token, dict) else token
            token_id = None if token is None else tok.token_id(token)
            if token is not None and token_id is None:
                raise CheckpointError(
                    f"{where!r} names {field} {token!r}, which the tokenizer lacks."
                )
            setattr(tok, attr, token_id)
    if isinstance(tok, SentencePieceTokenizer):
        tok.add_bos_default = bool(config.get("add_bos_token", False))
    if tok.add_bos_default and tok.bos_id is None:
        raise CheckpointError(f"{where!r} asks for a BOS token but names none.")
