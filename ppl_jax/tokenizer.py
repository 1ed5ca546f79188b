"""Tokenizers: UTF-8 bytes, a Hugging Face `tokenizer.json` through the `tokenizers` library, or a
SentencePiece model (Kudo & Richardson 2018) through the `sentencepiece` library.

A tokenizer is described by a small JSON-able dict (`describe()`), stored beside a checkpoint so
that evaluation needs only the checkpoint directory, and rebuilt with `from_description`. The
description keeps the BOS/EOS ids and the BOS policy, which `ppl_jax.hf.load_tokenizer` may have
taken from a `tokenizer_config.json`.
"""

from __future__ import annotations

import abc
import base64
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

    def encode_with_bytes(self, texts: list[str]) -> list[tuple[np.ndarray, np.ndarray]]:
        """Encodes each text, with the UTF-8 bytes of the text each token covers.

        Returns:
          Per text, `(ids [n] int32, byte_lengths [n] int64)`; the lengths add up to the text's
          UTF-8 length for a tokenizer that keeps every byte (bits per byte count these).
        """
        raise NotImplementedError(f"{type(self).__name__} does not report token byte lengths")

    def token_id(self, token: str) -> int | None:
        """The id of a token's string (special tokens included), or None if it has none."""
        return None

    def first_token_bytes(self, text: str) -> int:
        """UTF-8 bytes of `text` covered by its first token (the context-only token of a stream),
        as `encode_with_bytes` counts them."""
        lengths = self.encode_with_bytes([text])[0][1]
        return int(lengths[0]) if lengths.size else 0

    @abc.abstractmethod
    def describe(self) -> dict[str, Any]:
        """A JSON-able description from which `from_description` rebuilds this tokenizer."""


_BYTE_PIECE = re.compile(r"<0x[0-9A-Fa-f]{2}>")


def _span_lengths(ends: list[int], is_byte: list[bool], total: int) -> np.ndarray:
    """`[n] int64` bytes per token from each token's end offset (bytes into the text).

    A token covers the bytes from where the previous one stopped to its own end, so text that
    normalization drops (runs of whitespace) counts with the next token and trailing text with
    the last. Byte-fallback tokens (`<0xNN>`) of one character share that character's span;
    each counts its own single byte, and the last of them whatever the span has left.
    """
    lengths = np.zeros(len(ends), np.int64)
    done = 0
    for i, (end, byte) in enumerate(zip(ends, is_byte, strict=True)):
        stop = max(done, end)
        if byte and i + 1 < len(ends) and is_byte[i + 1] and ends[i + 1] <= stop:
            stop = min(stop, done + 1)  # one byte; the rest of the character comes next
        lengths[i] = stop - done
        done = stop
    if len(ends):
        lengths[-1] += max(0, total - done)
    return lengths


class ByteTokenizer(Tokenizer):
    """UTF-8 bytes as tokens: ids 0..255, one token per byte."""

    name = "byte"
    vocab_size = 256

    def encode(self, texts: list[str]) -> list[np.ndarray]:
        return [np.frombuffer(t.encode("utf-8"), dtype=np.uint8).astype(np.int32) for t in texts]

    def encode_with_bytes(self, texts: list[str]) -> list[tuple[np.ndarray, np.ndarray]]:
        return [(ids, np.ones(ids.size, np.int64)) for ids in self.encode(texts)]

    def describe(self) -> dict[str, Any]:
        return {"type": "byte"}


class HFTokenizer(Tokenizer):
    """A Hugging Face `tokenizers` tokenizer from its `tokenizer.json` text."""

    # Names of BOS and EOS tokens, for a tokenizer.json that does not add them itself (GPT-2's
    # `<|endoftext|>` is both, as in transformers' GPT2Tokenizer).
    BOS_NAMES = ("<s>", "<|begin_of_text|>", "<bos>", "<|startoftext|>", "<|endoftext|>")
    EOS_NAMES = ("</s>", "<|end_of_text|>", "<eos>", "<|endoftext|>")

    def __init__(self, tokenizer_json: str, name: str = "tokenizer.json"):
        """Builds the tokenizer and finds its specials from the tokenizer itself: a BOS id and
        `add_bos_default` from what encoding with special tokens prepends, otherwise BOS and EOS
        by the usual token names (`BOS_NAMES`, `EOS_NAMES`); set the attributes to override."""
        from tokenizers import Tokenizer as _Tok

        self._json = tokenizer_json
        self._tok = _Tok.from_str(tokenizer_json)
        self.name = name
        self.vocab_size = self._tok.get_vocab_size(with_added_tokens=True)
        # Byte-level BPE (GPT-2 and kin) spells each byte as one character of a token's string.
        self._byte_level = "ByteLevel" in json.dumps(json.loads(tokenizer_json).get("decoder"))
        probe = self._tok.encode("a", add_special_tokens=True)
        self.add_bos_default = bool(probe.special_tokens_mask and probe.special_tokens_mask[0])
        self.bos_id = probe.ids[0] if self.add_bos_default else self._first_of(self.BOS_NAMES)
        self.eos_id = self._first_of(self.EOS_NAMES)

    def _first_of(self, names: tuple[str, ...]) -> int | None:
        return next((i for i in map(self.token_id, names) if i is not None), None)

    def token_id(self, token: str) -> int | None:
        """The id of a token string (special tokens included), or None if it is not in the vocab."""
        return self._tok.token_to_id(token)

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

    def encode_with_bytes(self, texts: list[str]) -> list[tuple[np.ndarray, np.ndarray]]:
        out = []
        for text, enc in zip(
            texts, self._tok.encode_batch(texts, add_special_tokens=False), strict=True
        ):
            ids = np.asarray(enc.ids, dtype=np.int32)
            if self._byte_level:
                # Each character of a byte-level token's string is one byte of the text; an added
                # token (e.g. "<|endoftext|>" written in the text) is its own UTF-8 spelling.
                added = {t.content for t in self._tok.get_added_tokens_decoder().values()}
                lengths = [len(t.encode("utf-8")) if t in added else len(t) for t in enc.tokens]
            else:
                char_to_byte = np.concatenate(
                    [[0], np.cumsum([len(c.encode("utf-8")) for c in text])]
                ).astype(np.int64)
                ends = [int(char_to_byte[end]) for _, end in enc.offsets]
                is_byte = [bool(_BYTE_PIECE.fullmatch(t)) for t in enc.tokens]
                lengths = _span_lengths(ends, is_byte, len(text.encode("utf-8")))
            out.append((ids, np.asarray(lengths, np.int64)))
        return out

    def describe(self) -> dict[str, Any]:
        return {"type": "hf", "name": self.name, "tokenizer_json": self._json, **_specials(self)}


class SentencePieceTokenizer(Tokenizer):
    """A SentencePiece model (`tokenizer.model`) through the `sentencepiece` library.

    Encoding adds no BOS or EOS (the library's default); `bos_id` and `eos_id` are the model's own
    (`bos_id()`, `eos_id()`; None where it has none) and `add_bos_default` is False, the
    library's default, unless set (from a `tokenizer_config.json`, e.g. Llama 2's
    `add_bos_token: true`).
    """

    def __init__(self, model_proto: bytes, name: str = "tokenizer.model"):
        import sentencepiece

        self._proto = bytes(model_proto)
        self._sp = sentencepiece.SentencePieceProcessor(model_proto=self._proto)
        self.name = name
        self.vocab_size = self._sp.get_piece_size()
        self.bos_id = self._sp.bos_id() if self._sp.bos_id() >= 0 else None
        self.eos_id = self._sp.eos_id() if self._sp.eos_id() >= 0 else None
        self.add_bos_default = False

    @staticmethod
    def from_file(path: str, name: str | None = None) -> SentencePieceTokenizer:
        """Loads a `.model` file. Raises ConfigError if it is missing or not a SentencePiece model."""
        if not os.path.isfile(path):
            raise ConfigError(
                f"data.tokenizer: no such file {path!r}; give a SentencePiece .model."
            )
        with open(path, "rb") as f:
            proto = f.read()
        try:
            return SentencePieceTokenizer(proto, name=name or os.path.basename(path))
        except Exception as e:  # sentencepiece raises RuntimeError / its own types
            raise ConfigError(
                f"data.tokenizer: {path!r} is not a valid SentencePiece model ({e})."
            ) from None

    def token_id(self, token: str) -> int | None:
        """The id of a piece, or None if the model lacks it (SentencePiece maps it to unk)."""
        i = self._sp.piece_to_id(token)
        return i if self._sp.id_to_piece(i) == token else None

    def encode(self, texts: list[str]) -> list[np.ndarray]:
        return [np.asarray(ids, dtype=np.int32) for ids in self._sp.encode(texts, out_type=int)]

    def _pieces(self, text: str) -> Any:
        """The pieces of `text`, each with `id` and `begin`/`end` byte offsets into `text`."""
        try:
            return self._sp.encode(text, out_type="proto").pieces
        except ValueError:  # sentencepiece before "proto" named it "immutable_proto"
            return self._sp.encode(text, out_type="immutable_proto").pieces

    def encode_with_bytes(self, texts: list[str]) -> list[tuple[np.ndarray, np.ndarray]]:
        out = []
        for text in texts:
            pieces = self._pieces(text)
            ids = np.asarray([p.id for p in pieces], dtype=np.int32)
            lengths = _span_lengths(
                [int(p.end) for p in pieces],
                [bool(self._sp.is_byte(p.id)) for p in pieces],
                len(text.encode("utf-8")),
            )
            out.append((ids, lengths))
        return out

    def describe(self) -> dict[str, Any]:
        return {
            "type": "sentencepiece",
            "name": self.name,
            "model_base64": base64.b64encode(self._proto).decode("ascii"),
            **_specials(self),
        }


def apply_tokenizer_config(tok: Tokenizer, config: dict[str, Any], where: str) -> None:
    """Sets `bos_id`, `eos_id` and `add_bos_default` from a Hugging Face `tokenizer_config.json`.

    Its `bos_token` / `eos_token` (a string, an AddedToken `{"content": ...}`, or null for none)
    and `add_bos_token` win where present; absent keys leave the tokenizer's own values.

    Raises:
      CheckpointError: a named token that the vocabulary lacks, or BOS asked for but none named.
    """
    from ppl_jax.errors import CheckpointError

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
    if "add_bos_token" in config:
        tok.add_bos_default = bool(config["add_bos_token"])
    if tok.add_bos_default and tok.bos_id is None:
        raise CheckpointError(f"{where!r} asks for a BOS token but names none.")


def _specials(tok: Tokenizer) -> dict[str, Any]:
    return {"bos_id": tok.bos_id, "eos_id": tok.eos_id, "add_bos_default": tok.add_bos_default}


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


def load(spec: str, checkpoint_description: dict[str, Any] | None) -> Tokenizer:
    """The tokenizer for `data.tokenizer`: `auto` (the checkpoint's own), `byte`, or a path: a
    `tokenizer.json`, a SentencePiece `.model`, or a Hugging Face directory (`ppl_jax.hf`).

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
        from ppl_jax import hf

        return hf.load_tokenizer(path)
    if path.endswith(".model"):
        return SentencePieceTokenizer.from_file(path)
    return HFTokenizer.from_file(path)


def check_vocabulary(tok: Tokenizer, model_vocab_size: int, *, allow_mismatch: bool) -> str | None:
    """TEMPORARY stand-in until the tokenizer branch lands."""
    return None
