"""Tokenizers: UTF-8 bytes, or a Hugging Face `tokenizer.json` through the `tokenizers` library.

A tokenizer is described by a small JSON-able dict (`describe()`), stored beside a checkpoint so
that evaluation needs only the checkpoint directory, and rebuilt with `from_description`.
"""

from __future__ import annotations

import abc
import json
import os
import re
from typing import Any

import numpy as np

from ppl_jax.errors import ConfigError


class Tokenizer(abc.ABC):
    """Text to token ids, with no special tokens added.

    Attributes:
      name: for reports.
      vocab_size: number of ids, special tokens included.
      bos_id: the beginning-of-sequence token id, or None if the tokenizer has none.
      eos_id: the end-of-sequence token id, or None.
      add_bos_default: whether the tokenizer's own configuration prepends BOS (what
        `eval.add_bos=auto` follows).
    """

    name: str
    vocab_size: int
    bos_id: int | None = None
    eos_id: int | None = None
    add_bos_default: bool = False

    @abc.abstractmethod
    def encode(self, texts: list[str]) -> list[np.ndarray]:
        """Encodes each text. Returns `[num_tokens_i] int32` arrays, one per text."""

    @abc.abstractmethod
    def first_token_bytes(self, text: str) -> int:
        """UTF-8 bytes of `text` covered by its first token (the context-only token of a stream)."""

    @abc.abstractmethod
    def describe(self) -> dict[str, Any]:
        """A JSON-able description from which `from_description` rebuilds this tokenizer."""


class ByteTokenizer(Tokenizer):
    """UTF-8 bytes as tokens: ids 0..255, one token per byte."""

    name = "byte"
    vocab_size = 256

    def encode(self, texts: list[str]) -> list[np.ndarray]:
        return [np.frombuffer(t.encode("utf-8"), dtype=np.uint8).astype(np.int32) for t in texts]

    def first_token_bytes(self, text: str) -> int:
        return 1 if text else 0

    def describe(self) -> dict[str, Any]:
        return {"type": "byte"}


class HFTokenizer(Tokenizer):
    """A Hugging Face `tokenizers` tokenizer from its `tokenizer.json` text."""

    def __init__(self, tokenizer_json: str, name: str = "tokenizer.json"):
        from tokenizers import Tokenizer as _Tok

        self._json = tokenizer_json
        self._tok = _Tok.from_str(tokenizer_json)
        self.name = name
        self.vocab_size = self._tok.get_vocab_size(with_added_tokens=True)
        # Byte-level BPE (GPT-2 and kin) spells each byte as one character of a token's string.
        self._byte_level = "ByteLevel" in json.dumps(json.loads(tokenizer_json).get("decoder"))

    @staticmethod
    def from_file(path: str) -> HFTokenizer:
        """Loads `path` (a `tokenizer.json`). Raises ConfigError if it is missing or unreadable."""
        if not os.path.isfile(path):
            raise ConfigError(f"data.tokenizer: no such file {path!r}; give a tokenizer.json.")
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read()
            return HFTokenizer(text, name=os.path.basename(path))
        except Exception as e:  # the tokenizers library raises its own exception type
            raise ConfigError(
                f"data.tokenizer: {path!r} is not a valid tokenizer.json ({e})."
            ) from None

    def encode(self, texts: list[str]) -> list[np.ndarray]:
        encodings = self._tok.encode_batch(texts, add_special_tokens=False)
        return [np.asarray(e.ids, dtype=np.int32) for e in encodings]

    def first_token_bytes(self, text: str) -> int:
        enc = self._tok.encode(text, add_special_tokens=False)
        if not enc.ids:
            return 0
        end = enc.offsets[0][1]
        if len(enc.ids) > 1 and enc.offsets[1][0] < end:
            # The first character is split over several tokens (byte-level BPE, byte fallback),
            # and the offsets give the whole character: count the first token's own bytes.
            if re.fullmatch(r"<0x[0-9A-Fa-f]{2}>", enc.tokens[0]):
                return 1
            if self._byte_level:
                return len(enc.tokens[0])
        return len(text[:end].encode("utf-8"))

    def describe(self) -> dict[str, Any]:
        return {"type": "hf", "name": self.name, "tokenizer_json": self._json}


def from_description(desc: dict[str, Any]) -> Tokenizer:
    """Rebuilds a tokenizer from `Tokenizer.describe()` output."""
    kind = desc.get("type")
    if kind == "byte":
        return ByteTokenizer()
    if kind == "hf":
        return HFTokenizer(desc["tokenizer_json"], name=desc.get("name", "tokenizer.json"))
    raise ConfigError(f"unknown tokenizer description type {kind!r} (expected 'byte' or 'hf').")


def load(spec: str, checkpoint_description: dict[str, Any] | None) -> Tokenizer:
    """The tokenizer for `data.tokenizer`: `auto` (the checkpoint's own), `byte`, or a path.

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
    return HFTokenizer.from_file(os.path.expanduser(spec))


