"""The tokenizer of a Hugging Face directory: `tokenizer.json` or `tokenizer.model`, with the
BOS/EOS ids and BOS policy of its `tokenizer_config.json`."""

from __future__ import annotations

import os

from ppl_jax.errors import CheckpointError
from ppl_jax.runtime import paths
from ppl_jax.tokenizer.base import (
    HFTokenizer,
    SentencePieceTokenizer,
    Tokenizer,
    apply_tokenizer_config,
)


def has_tokenizer(path: str) -> bool:
    """Whether the directory holds `tokenizer.json` or a SentencePiece `tokenizer.model`."""
    return any(paths.isfile(paths.join(path, n)) for n in ("tokenizer.json", "tokenizer.model"))


def _name(path: str, file: str) -> str:
    return f"{os.path.basename(os.path.normpath(path))}/{file}"


def load_tokenizer(path: str) -> Tokenizer:
    """The tokenizer of a Hugging Face directory, with its BOS/EOS ids and BOS policy.

    `tokenizer.json` (the `tokenizers` library) is preferred to `tokenizer.model`
    (SentencePiece), as transformers does. The BOS policy (`eval.add_bos=auto`) is that of
    transformers >= 5 `AutoTokenizer.from_pretrained(path)`: with a `tokenizer.json`, BOS exactly
    when its post-processor adds one (`add_bos_token` of `tokenizer_config.json` is ignored, as
    transformers 5 drops it); with a `tokenizer.model` only, BOS when `add_bos_token` is true.
    `bos_token` and `eos_token` of `tokenizer_config.json` win where present; otherwise they come
    from the tokenizer itself (see `ppl_jax.tokenizer.base.apply_tokenizer_config`).

    Raises:
      CheckpointError: no tokenizer file, an unreadable one, or a `tokenizer_config.json` that
        does not fit it (see `ppl_jax.tokenizer.base.apply_tokenizer_config`).
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
