"""Loading a tokenizer: `load_tokenizer` for a setting (`data.tokenizer`: the checkpoint's own
description, `byte`, a `tokenizer.json`, a SentencePiece model or a Hugging Face directory),
`from_description` for a stored description, and `check_vocabulary`, which refuses a tokenizer
that is plausibly not the model's.

A tokenizer is described by a small JSON-able dict (`Tokenizer.describe()`), stored beside a
checkpoint so that evaluation needs only the checkpoint directory, and rebuilt with
`from_description`. The description keeps the BOS/EOS ids and the BOS policy, which
`ppl_jax.tokenizer.directory.read_tokenizer` may have taken from a `tokenizer_config.json`.
"""

from __future__ import annotations

import base64
import os
from collections.abc import Callable
from typing import Any

from ppl_jax.errors import ConfigError
from ppl_jax.runtime import paths
from ppl_jax.tokenizer.core import ByteTokenizer, Tokenizer
from ppl_jax.tokenizer.directory import TOKENIZER_FILES, read_tokenizer
from ppl_jax.tokenizer.hf import HFTokenizer
from ppl_jax.tokenizer.spm import SentencePieceTokenizer


def check_vocabulary(tok: Tokenizer, model_vocab_size: int, *, allow_mismatch: bool) -> str | None:
    """Checks that `tok` is plausibly the model's own tokenizer, by vocabulary size.

    The model's vocabulary may be the tokenizer's (special tokens included) exactly, rounded up
    to a multiple of 64 or 128 (padding for matmul efficiency, as GPT-NeoX and Megatron do), or at
    most 1% larger (a few spare rows). Anything else, or a model vocabulary smaller than the
    tokenizer's, is a mismatch: a foreign tokenizer whose ids happen to fit the embedding table
    would be scored silently with a meaningless perplexity.

    Returns:
      None when the sizes fit; with `allow_mismatch`, a one-sentence note for the results instead
      of raising.

    Raises:
      ConfigError: a mismatch without `allow_mismatch` (naming both sizes, the tokenizer, and
        `data.allow_tokenizer_mismatch=true`).
    """
    n, m = int(tok.vocab_size), int(model_vocab_size)
    padded = {n, -(-n // 64) * 64, -(-n // 128) * 128}
    if m in padded or n < m <= n * 1.01:
        return None
    what = (
        f"the tokenizer {tok.name!r} has {n} ids but the model's vocabulary has {m}"
        f"{' (smaller)' if m < n else ''}, more than padding apart"
    )
    if allow_mismatch:
        return f"{what}; scored anyway because data.allow_tokenizer_mismatch=true."
    raise ConfigError(
        f"{what}: it is probably not the checkpoint's tokenizer; use data.tokenizer=auto (the "
        f"checkpoint's own) or set data.allow_tokenizer_mismatch=true to score anyway."
    )


def for_setting(
    setting: str,
    own: Callable[[], Tokenizer | None],
    vocab_size: int,
    *,
    allow_mismatch: bool = False,
    key: str = "data.tokenizer",
    missing: str = "the checkpoint carries no tokenizer",
) -> tuple[Tokenizer, str | None]:
    """The tokenizer a run scores with: the one resolution of `data.tokenizer` (the command
    line, the library and the harness model all ask here, through `Checkpoint.tokenizer_for`).

    Args:
      setting: `auto` (the checkpoint's own: `own()`), `byte`, or a path (a `tokenizer.json`, a
        SentencePiece `.model`, a folder holding one; `load_tokenizer`).
      own: the checkpoint's own tokenizer, or None where it carries none (called for `auto`
        only).
      vocab_size: the model's vocabulary (`check_vocabulary`).
      allow_mismatch: score with a tokenizer whose vocabulary does not fit the model's
        (`data.allow_tokenizer_mismatch`), noting why.
      key: the setting's name in the caller's words, for the sentences.
      missing: the sentence's words when `own()` is None (the checkpoint, and where it would
        keep a tokenizer).

    Returns:
      (the tokenizer, None or the note on a mismatch that was allowed).

    Raises:
      ConfigError: `auto` for a checkpoint that carries no tokenizer; a bad path; a vocabulary
        that does not fit without `allow_mismatch` (`check_vocabulary`).
    """
    if setting == "auto":
        tok = own()
        if tok is None:
            raise ConfigError(
                f"{key}=auto, but {missing}; set {key} to a tokenizer.json, a SentencePiece "
                f".model, a folder holding one, or 'byte'."
            )
    else:
        tok = load_tokenizer(setting)
    return tok, check_vocabulary(tok, vocab_size, allow_mismatch=allow_mismatch)


def from_description(desc: dict[str, Any]) -> Tokenizer:
    """Rebuilds a tokenizer from `Tokenizer.describe()` output (BOS/EOS settings included; a
    description without them, from before they were stored, gets the tokenizer's own)."""
    kind = desc.get("type")
    if kind == "byte":
        return ByteTokenizer()
    if kind == "hf":
        tok: Tokenizer = HFTokenizer(
            desc["tokenizer_json"], name=desc.get("name", "tokenizer.json")
        )
    elif kind == "sentencepiece":
        tok = SentencePieceTokenizer(
            base64.b64decode(desc["model_base64"]), name=desc.get("name", "tokenizer.model")
        )
    else:
        raise ConfigError(
            f"unknown tokenizer description type {kind!r} (expected 'byte', 'hf' or "
            f"'sentencepiece')."
        )
    for key in ("bos_id", "eos_id", "add_bos_default"):
        if key in desc:
            setattr(tok, key, desc[key])
    return tok


def load_tokenizer(spec: str, checkpoint_description: dict[str, Any] | None = None) -> Tokenizer:
    """The tokenizer for `data.tokenizer`: `auto` (the checkpoint's own), `byte`, or a path: a
    `tokenizer.json`, a SentencePiece `.model`, or a Hugging Face directory
    (`ppl_jax.checkpoints.formats.safetensors`).

    Raises:
      ConfigError: `auto` with a checkpoint that stores no tokenizer, or a bad path.
    """
    if spec == "auto":
        if not checkpoint_description:
            raise ConfigError(
                "data.tokenizer=auto, but the checkpoint stores no tokenizer description; "
                "set --config.data.tokenizer=byte or to a tokenizer.json path."
            )
        return from_description(checkpoint_description)
    if spec == "byte":
        return ByteTokenizer()
    path = os.path.expanduser(spec)
    if os.path.isdir(path):
        _refuse_links_out(path)
        return read_tokenizer(path)
    if path.endswith(".model"):
        return SentencePieceTokenizer.from_file(path)
    return HFTokenizer.from_file(path)


def _refuse_links_out(folder: str) -> None:
    """Refuses a tokenizer folder whose tokenizer files are links leading out of it (or, in the
    Hugging Face hub cache, out of the repository's `blobs`), as for checkpoints
    (docs/trust.md): a folder's files are read only from inside it.

    Raises:
      ConfigError: such a link, naming it and where it leads.
    """
    for file in TOKENIZER_FILES:
        if os.path.lexists(os.path.join(folder, file)):
            real, inside = paths.resolves_inside(folder, file)
            if not inside:
                raise ConfigError(
                    f"{os.path.join(folder, file)!r} is a link to {real!r}, outside the tokenizer "
                    f"folder {folder!r} (data.tokenizer); its files are read only from inside "
                    f"it: copy the file into the folder."
                )
