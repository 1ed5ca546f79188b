"""The tokenizer interface (`Tokenizer`), the byte tokenizer, and the helpers the others share:
pieces of long documents cut at spaces (`space_cuts`), the UTF-8 bytes each token covers
(`spans`, `span_lengths`), compact arrays while a long document is encoded (`compact`, `join`).
See `ppl_jax.tokenizer` for the whole family.
"""

from __future__ import annotations

import abc
import re
from typing import Any

import numpy as np


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
    # Characters per piece of a long document (see the module docstring); tests make it small.
    piece_chars: int = 1 << 18

    def encode(self, texts: list[str]) -> list[np.ndarray]:
        """Encodes each text. Returns `[num_tokens_i] int32` arrays, one per text.

        Raises:
          TypeError: a `str` in place of the list (it would be encoded character by character;
            `encode([text])[0]` encodes one text). Likewise for the other `encode_*` methods.
        """
        return [self._encode_document(t, with_bytes=False)[0] for t in texts_of(texts, "encode")]

    def encode_with_bytes(self, texts: list[str]) -> list[tuple[np.ndarray, np.ndarray]]:
        """Encodes each text, with the UTF-8 bytes of the text each token covers.

        Returns:
          Per text, `(ids [n] int32, byte_lengths [n] int32)`; the lengths add up to the text's
          UTF-8 length for a tokenizer that keeps every byte (bits per byte count these).
        """
        texts = texts_of(texts, "encode_with_bytes")
        return [self._encode_document(t, with_bytes=True) for t in texts]

    def encode_flat_with_bytes(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """`encode_with_bytes` of many texts laid end to end (no array per text: for many short
        documents).

        Returns:
          `(ids [n] int32, byte_lengths [n] int32, sizes [len(texts)] int64)`: every text's ids
          and byte lengths, one text after another, and each text's number of tokens.
        """
        encoded = self.encode_with_bytes(texts_of(texts, "encode_flat_with_bytes"))
        sizes = np.fromiter((ids.size for ids, _ in encoded), np.int64, count=len(encoded))
        if not encoded:
            return np.zeros(0, np.int32), np.zeros(0, np.int32), sizes
        ids = np.concatenate([e[0] for e in encoded]).astype(np.int32, copy=False)
        lengths = np.concatenate([e[1] for e in encoded]).astype(np.int32, copy=False)
        return ids, lengths, sizes

    def _encode_document(self, text: str, with_bytes: bool) -> tuple[np.ndarray, np.ndarray]:
        """`(ids [n] int32, byte_lengths [n] int32)` of one document (lengths empty unless
        `with_bytes`), encoded piece by piece between the cuts of `_safe_cuts`."""
        cuts = self._safe_cuts(text) if len(text) > self.piece_chars else []
        bounds = [0, *cuts, len(text)]
        ids_parts, len_parts = [], []
        byte_start, done = 0, 0  # bytes of text before the piece; bytes counted so far
        for k in range(len(bounds) - 1):
            piece = text[bounds[k] : bounds[k + 1]]
            ids, ends, is_byte = self._encode_piece(piece, first=k == 0, with_bytes=with_bytes)
            ids_parts.append(compact(ids))
            if with_bytes:
                lengths, done = spans(ends + byte_start, is_byte, done)
                len_parts.append(compact(lengths))
            byte_start += len(piece.encode("utf-8"))
            del piece, ids, ends, is_byte
        ids = join(ids_parts)
        if not with_bytes:
            return ids, np.zeros(0, np.int32)
        lengths = join(len_parts)
        if lengths.size:
            lengths[-1] += byte_start - done  # trailing text no token ends in counts with the last
        return ids, lengths

    def _safe_cuts(self, text: str) -> list[int]:
        """Character offsets at which `text` may be cut into pieces that tokenize, one by one, to
        exactly the tokens of the whole; empty where the tokenizer has no such rule."""
        return []

    def _encode_piece(
        self, piece: str, first: bool, with_bytes: bool
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """`(ids [n] int32, ends [n] int64, is_byte [n] bool)` of one piece (`first`: it starts
        the document): each token's end in UTF-8 bytes from the piece's start, and whether it is
        a byte-fallback token (see `spans`). `ends`/`is_byte` may be empty without bytes."""
        raise NotImplementedError(f"{type(self).__name__} does not report token byte lengths")

    def token_id(self, token: str) -> int | None:
        """The id of a token's string (special tokens included), or None if it has none."""
        return None

    def char_spans(self, text: str) -> tuple[np.ndarray, np.ndarray]:
        """`(ids [n] int32, spans [n, 2] int64)`: the tokens of `text` (as `encode` gives them)
        and the characters each covers, `[start, end)` in code points of `text` (what
        transformers' `return_offsets_mapping` reports, for LongPPL's matching of two
        tokenizers' tokens). Here from the UTF-8 bytes each token covers (`encode_with_bytes`),
        a token that begins or ends inside a character covering all of it; `HFTokenizer` gives
        the `tokenizers` library's own offsets."""
        ids, lengths = self.encode_with_bytes([text])[0]
        raw = np.frombuffer(text.encode("utf-8"), np.uint8)
        lead = np.concatenate([[0], np.cumsum((raw & 0xC0) != 0x80)])  # characters before byte x
        ends = np.cumsum(lengths, dtype=np.int64)
        starts = ends - lengths
        first = np.where(starts < raw.size, lead[np.minimum(starts + 1, raw.size)] - 1, lead[-1])
        return ids, np.stack([first, lead[ends]], axis=1).astype(np.int64)

    def first_token_bytes(self, text: str) -> int:
        """UTF-8 bytes of `text` covered by its first token (the context-only token of a stream),
        as `encode_with_bytes` counts them."""
        lengths = self.encode_with_bytes([text])[0][1]
        return int(lengths[0]) if lengths.size else 0

    def token_texts(self, ids: np.ndarray) -> list[str]:
        """The text of each token alone, for per-token outputs (`ppl_jax.outputs.tokens`).

        Each id is decoded on its own, as the tokenizer decodes a one-token sequence (special
        tokens spelled out, e.g. "<s>"), except that a token spelled with a leading "▁" keeps
        that space: SentencePiece and Metaspace decoders drop the space of a text's first
        token, which would glue the words of a row of token texts together. A token that is
        not valid UTF-8 alone (one byte of a character split across byte-level or byte-fallback
        tokens) comes out with U+FFFD replacement characters. An id outside the tokenizer's
        vocabulary (a model's padding rows) gives "". Texts are cached per id.

        Args:
          ids: token ids, any shape and integer dtype.

        Returns:
          One string per id, in `ids.ravel()` order.
        """
        cache: dict[int, str] = self.__dict__.setdefault("_token_text_cache", {})
        flat = np.asarray(ids).reshape(-1)
        missing = [i for i in np.unique(flat).tolist() if i not in cache]
        known = [i for i in missing if 0 <= i < self.vocab_size]
        cache.update(zip(known, self._token_texts(known), strict=True))
        cache.update((i, "") for i in missing if not 0 <= i < self.vocab_size)
        return [cache[i] for i in flat.tolist()]

    def _token_texts(self, ids: list[int]) -> list[str]:
        """`token_texts` of ids inside the vocabulary, uncached."""
        raise NotImplementedError(f"{type(self).__name__} does not decode single tokens")

    @abc.abstractmethod
    def describe(self) -> dict[str, Any]:
        """A JSON-able description from which `from_description` rebuilds this tokenizer."""


BYTE_PIECE = re.compile(r"<0x[0-9A-Fa-f]{2}>")


def texts_of(texts: list[str], method: str) -> list[str]:
    """`texts`, or TypeError for one `str` in place of the list (iterating it would encode each
    character as a text of its own, silently)."""
    if isinstance(texts, str):
        raise TypeError(
            f"Tokenizer.{method} takes a list of texts, not a str (it would encode each "
            f"character as a text): pass [text] (tok.{method}([text])[0] for one text)."
        )
    return texts


def compact(x: np.ndarray) -> np.ndarray:
    """`x` (non-negative integers) in the smallest unsigned dtype that holds them, to keep the
    pieces of a long document small until they are joined."""
    return x.astype(np.min_scalar_type(int(x.max()))) if x.size else x


def join(parts: list[np.ndarray]) -> np.ndarray:
    """`[sum n_i] int32`: the parts in order, each freed once copied (no second full copy)."""
    out = np.empty(sum(p.size for p in parts), np.int32)
    at = 0
    while parts:
        part = parts.pop(0)
        out[at : at + part.size] = part
        at += part.size
    return out


def spans(ends: np.ndarray, is_byte: np.ndarray, done: int) -> tuple[np.ndarray, int]:
    """`([n] int32 bytes per token, bytes counted)` from each token's end (bytes into the text),
    continuing a document of which `done` bytes are already counted.

    A token covers the bytes from where the previous one stopped to its own end, so text that
    normalization drops (runs of whitespace) counts with the next token. Byte-fallback tokens
    (`<0xNN>`) of one character share that character's span; each counts its own single byte,
    and the last of them whatever the span has left. Text after the last end is left uncounted.
    """
    start = done
    if not ends.size:
        return np.zeros(0, np.int32), done
    if not (is_byte[:-1] & is_byte[1:]).any():
        stops = np.maximum.accumulate(np.maximum(ends, done))
    else:  # bytes of characters the vocabulary lacks: the sequential rule
        stops = np.empty(ends.size, np.int64)
        for i in range(ends.size):
            stop = max(done, int(ends[i]))
            if is_byte[i] and i + 1 < ends.size and is_byte[i + 1] and ends[i + 1] <= stop:
                stop = min(stop, done + 1)  # one byte; the rest of the character comes next
            stops[i] = done = stop
    lengths = np.diff(stops, prepend=start).astype(np.int32)
    return lengths, int(stops[-1])


def span_lengths(ends: list[int], is_byte: list[bool], total: int) -> np.ndarray:
    """`[n] int32` bytes per token of a whole text (`spans`), trailing text with the last."""
    lengths, done = spans(np.asarray(ends, np.int64), np.asarray(is_byte, bool), 0)
    if lengths.size:
        lengths[-1] += max(0, total - done)
    return lengths


# A cut: a single space between two non-whitespace characters (Python's whitespace, a superset of
# Unicode White_Space, which the tokenizers' regexes and SentencePiece use).
CUT = re.compile(r"(?<=\S) (?=\S)")
META = "\u2581"  # "▁", SentencePiece's and Metaspace's spelling of a space


def space_cuts(text: str, size: int) -> list[int]:
    """Offsets of `CUT` spaces in `text`, about `size` characters apart (none in a text without
    one: it is then encoded whole)."""
    cuts: list[int] = []
    pos = size
    while pos < len(text):
        m = CUT.search(text, pos)
        if m is None:
            break
        cuts.append(m.start())
        pos = m.start() + size
    return cuts


def keep_space(piece: str, text: str) -> str:
    """`text` (a token decoded alone) with the spaces that the leading "▁"s of its `piece`
    spell, of which decoders drop one at the start of a text."""
    missing = (len(piece) - len(piece.lstrip(META))) - (len(text) - len(text.lstrip(" ")))
    return " " * missing + text if missing > 0 else text


def no_token_spans_a_space(pieces: Any) -> bool:
    """Whether no vocabulary entry holds "▁" after another character than "▁": then no token can
    cover both sides of a space that follows a non-space (models spell that space "▁")."""
    return not any(re.search(f"[^{META}]{META}", p) for p in pieces)


class ByteTokenizer(Tokenizer):
    """UTF-8 bytes as tokens: ids 0..255, one token per byte (`[n] int32` ids and `[n] int32`
    ones: 8 bytes of host memory per byte of text)."""

    name = "byte"
    vocab_size = 256

    def _encode_document(self, text: str, with_bytes: bool) -> tuple[np.ndarray, np.ndarray]:
        ids = np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(np.int32)
        return ids, np.ones(ids.size if with_bytes else 0, np.int32)

    def _token_texts(self, ids: list[int]) -> list[str]:
        # A byte of a multi-byte character is not UTF-8 alone: U+FFFD. Ids past 255 (a
        # subclass's special tokens) have no text.
        return [bytes([i]).decode("utf-8", errors="replace") if i < 256 else "" for i in ids]

    def describe(self) -> dict[str, Any]:
        return {"type": "byte"}


def specials(tok: Tokenizer) -> dict[str, Any]:
    """The BOS/EOS ids and BOS policy of a tokenizer, as its description keeps them."""
    return {"bos_id": tok.bos_id, "eos_id": tok.eos_id, "add_bos_default": tok.add_bos_default}
