"""A SentencePiece model (Kudo & Richardson 2018) through the `sentencepiece` library."""

from __future__ import annotations

import base64
import os
from typing import Any

import numpy as np

from ppl_jax.errors import ConfigError
from ppl_jax.tokenizer.core import (
    META,
    Tokenizer,
    keep_space,
    no_token_spans_a_space,
    space_cuts,
    specials,
)


class SentencePieceTokenizer(Tokenizer):
    """A SentencePiece model (`tokenizer.model`) through the `sentencepiece` library.

    Encoding adds no BOS or EOS (the library's default); `bos_id` and `eos_id` are the model's own
    (`bos_id()`, `eos_id()`; None where it has none) and `add_bos_default` is False, the
    library's default, unless set (from a `tokenizer_config.json`, e.g. Llama 2's
    `add_bos_token: true`).

    Long documents are cut at `CUT` spaces when the model's normalization allows it: with the
    dummy prefix a piece after the first drops its leading space (the model prepends "▁" as the
    space would have been spelled; with extra whitespace removal that space would have been
    stripped anyway); without the dummy prefix only when whitespace is kept as is. No piece of the
    vocabulary may hold "x▁" (checked), and "▁" must be one, so that neither BPE merges nor the
    unigram lattice cross the cut. (Unigram: Viterbi scores after the cut are the piece's plus a
    constant; float rounding could in principle break a near-tie differently.)
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
        self._cut_rule = self._find_cut_rule()

    def _find_cut_rule(self) -> str | None:
        try:
            one, two = self._sp.normalize("x x"), self._sp.normalize("x  x")
        except (AttributeError, TypeError):  # sentencepiece without normalize()
            return None
        if self.token_id(META) is None:
            return None
        pieces = (self._sp.id_to_piece(i) for i in range(self.vocab_size))
        if not no_token_spans_a_space(pieces):
            return None
        if one == f"{META}x{META}x":  # dummy prefix (not a suffix)
            return "drop"
        if one == f"x{META}x" and two == f"x{META}{META}x":  # no prefix, whitespace kept
            return "keep"
        return None

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

    def _safe_cuts(self, text: str) -> list[int]:
        return space_cuts(text, self.piece_chars) if self._cut_rule else []

    def _encode_piece(
        self, piece: str, first: bool, with_bytes: bool
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        skip = int(not first and self._cut_rule == "drop")
        if not with_bytes:
            ids = np.asarray(self._sp.encode(piece[skip:], out_type=int), np.int32)
            return ids, np.zeros(0, np.int64), np.zeros(0, bool)
        pieces = self._pieces(piece[skip:])
        ids = np.asarray([p.id for p in pieces], dtype=np.int32)
        ends = np.asarray([p.end for p in pieces], np.int64) + skip
        is_byte = np.asarray([self._sp.is_byte(p.id) for p in pieces], bool)
        return ids, ends, is_byte

    def _pieces(self, text: str) -> Any:
        """The pieces of `text`, each with `id` and `begin`/`end` byte offsets into `text`."""
        try:
            return self._sp.encode(text, out_type="proto").pieces
        except ValueError:  # sentencepiece before "proto" named it "immutable_proto"
            return self._sp.encode(text, out_type="immutable_proto").pieces

    def _token_texts(self, ids: list[int]) -> list[str]:
        sp = self._sp
        # The library decodes a control token (<s>) to "" and <unk> to " ⁇ ": spell them out.
        return [
            sp.id_to_piece(i)
            if sp.is_control(i) or sp.is_unknown(i)
            else keep_space(sp.id_to_piece(i), sp.decode([i]))
            for i in ids
        ]

    def describe(self) -> dict[str, Any]:
        return {
            "type": "sentencepiece",
            "name": self.name,
            "model_base64": base64.b64encode(self._proto).decode("ascii"),
            **specials(self),
        }
