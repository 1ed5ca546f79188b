"""Tokenizers: UTF-8 bytes, a Hugging Face `tokenizer.json` through the `tokenizers` library, or a
SentencePiece model (Kudo & Richardson 2018) through the `sentencepiece` library.

A tokenizer is described by a small JSON-able dict (`describe()`), stored beside a checkpoint so
that evaluation needs only the checkpoint directory, and rebuilt with `from_description`. The
description keeps the BOS/EOS ids and the BOS policy, which `ppl_jax.checkpoints.hf.load_tokenizer` may have
taken from a `tokenizer_config.json`.

Long documents are tokenized in pieces of about `Tokenizer.piece_chars` characters, cut only where
the tokenizer provably gives the same tokens for the pieces as for the whole (`_safe_cuts`), so
that host memory stays a few times the text instead of the ~70x that one `tokenizers` encoding
of a long text holds; a tokenizer with no such rule encodes the whole document at once.
"""

from __future__ import annotations

import abc
import base64
import json
import os
import re
from typing import Any

import numpy as np

from ppl_jax.errors import CheckpointError, ConfigError


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
        """Encodes each text. Returns `[num_tokens_i] int32` arrays, one per text."""
        return [self._encode_document(t, with_bytes=False)[0] for t in texts]

    def encode_with_bytes(self, texts: list[str]) -> list[tuple[np.ndarray, np.ndarray]]:
        """Encodes each text, with the UTF-8 bytes of the text each token covers.

        Returns:
          Per text, `(ids [n] int32, byte_lengths [n] int32)`; the lengths add up to the text's
          UTF-8 length for a tokenizer that keeps every byte (bits per byte count these).
        """
        return [self._encode_document(t, with_bytes=True) for t in texts]

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
            ids_parts.append(_compact(ids))
            if with_bytes:
                lengths, done = _spans(ends + byte_start, is_byte, done)
                len_parts.append(_compact(lengths))
            byte_start += len(piece.encode("utf-8"))
            del piece, ids, ends, is_byte
        ids = _join(ids_parts)
        if not with_bytes:
            return ids, np.zeros(0, np.int32)
        lengths = _join(len_parts)
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
        a byte-fallback token (see `_spans`). `ends`/`is_byte` may be empty without bytes."""
        raise NotImplementedError(f"{type(self).__name__} does not report token byte lengths")

    def token_id(self, token: str) -> int | None:
        """The id of a token's string (special tokens included), or None if it has none."""
        return None

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


_BYTE_PIECE = re.compile(r"<0x[0-9A-Fa-f]{2}>")


def _compact(x: np.ndarray) -> np.ndarray:
    """`x` (non-negative integers) in the smallest unsigned dtype that holds them, to keep the
    pieces of a long document small until they are joined."""
    return x.astype(np.min_scalar_type(int(x.max()))) if x.size else x


def _join(parts: list[np.ndarray]) -> np.ndarray:
    """`[sum n_i] int32`: the parts in order, each freed once copied (no second full copy)."""
    out = np.empty(sum(p.size for p in parts), np.int32)
    at = 0
    while parts:
        part = parts.pop(0)
        out[at : at + part.size] = part
        at += part.size
    return out


def _spans(ends: np.ndarray, is_byte: np.ndarray, done: int) -> tuple[np.ndarray, int]:
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


def _span_lengths(ends: list[int], is_byte: list[bool], total: int) -> np.ndarray:
    """`[n] int32` bytes per token of a whole text (`_spans`), trailing text with the last."""
    lengths, done = _spans(np.asarray(ends, np.int64), np.asarray(is_byte, bool), 0)
    if lengths.size:
        lengths[-1] += max(0, total - done)
    return lengths


# A cut: a single space between two non-whitespace characters (Python's whitespace, a superset of
# Unicode White_Space, which the tokenizers' regexes and SentencePiece use).
_CUT = re.compile(r"(?<=\S) (?=\S)")
META = "\u2581"  # "▁", SentencePiece's and Metaspace's spelling of a space


def _space_cuts(text: str, size: int) -> list[int]:
    """Offsets of `_CUT` spaces in `text`, about `size` characters apart (none in a text without
    one: it is then encoded whole)."""
    cuts: list[int] = []
    pos = size
    while pos < len(text):
        m = _CUT.search(text, pos)
        if m is None:
            break
        cuts.append(m.start())
        pos = m.start() + size
    return cuts


def _keep_space(piece: str, text: str) -> str:
    """`text` (a token decoded alone) with the spaces that the leading "▁"s of its `piece`
    spell, of which decoders drop one at the start of a text."""
    missing = (len(piece) - len(piece.lstrip(META))) - (len(text) - len(text.lstrip(" ")))
    return " " * missing + text if missing > 0 else text


def _no_token_spans_a_space(pieces: Any) -> bool:
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


# Split regexes (tokenizers `Split` before a `ByteLevel` without its own regex) whose matches never
# hold a non-whitespace character followed by a space and which match every character: GPT-2's
# and tiktoken cl100k's (Llama 3), and Qwen2's (cl100k with single digits).
_KNOWN_SPLITS = (
    r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+",
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+",
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+",
)
# Unicode normalizations: a space (a starter that composes with nothing) is a boundary of each.
_UNICODE_NORMALIZERS = ("NFC", "NFD", "NFKC", "NFKD")


def _hf_cut_rule(spec: dict[str, Any], vocab: Any) -> str | None:
    """How a `tokenizer.json` may be cut at `_CUT` spaces: "keep" (pieces keep their leading
    space), "drop" (a piece after the first drops it, as the tokenizer prepends "▁" to a text:
    Llama 2 style), or None (no proven rule: encode documents whole).

    Proofs. Byte-level BPE with GPT-2's regex (or a known `Split` regex): no pre-token holds a
    non-space followed by a space, so the pre-tokens of the pieces are those of the whole, and BPE
    runs within a pre-token; a Unicode normalizer has a boundary at a space; `add_prefix_space`
    adds nothing to a piece that starts with a space. Metaspace / Prepend+Replace BPE or Unigram:
    the whole text is spelled "...x▁y..." and a piece after the first, without its space, "▁y..."
    (the tokenizer prepends "▁"); no vocabulary entry holds "x▁", so no merge (BPE) or lattice
    edge (Unigram) crosses the cut. Added tokens must not hold spaces nor strip them.
    """
    model = spec.get("model") or {}
    if model.get("type") not in ("BPE", "Unigram") or model.get("dropout"):
        return None
    for t in spec.get("added_tokens") or []:
        content = t.get("content", "")
        if t.get("lstrip") or t.get("rstrip") or any(c.isspace() or c == META for c in content):
            return None
    norm, pre = spec.get("normalizer"), spec.get("pre_tokenizer") or {}
    norms = (norm or {}).get("normalizers", [norm] if norm else [])
    pres = pre.get("pretokenizers", [pre] if pre else [])
    types = [p.get("type") for p in pres]
    if model.get("type") == "BPE" and types and types[-1] == "ByteLevel":
        if any(n.get("type") not in _UNICODE_NORMALIZERS for n in norms):
            return None
        if types == ["ByteLevel"] and pres[0].get("use_regex", True):
            return "keep"
        if (
            types == ["Split", "ByteLevel"]
            and not pres[1].get("use_regex", True)
            and (pres[0].get("pattern") or {}).get("Regex") in _KNOWN_SPLITS
            and pres[0].get("behavior") == "Isolated"
            and not pres[0].get("invert")
        ):
            return "keep"
        return None
    if META not in vocab or not _no_token_spans_a_space(vocab):
        return None
    norm_types = [n.get("type") for n in norms]
    replace = {"type": "Replace", "pattern": {"String": " "}, "content": META}
    if norm_types in (["Prepend", "Replace"], ["Replace"]) and not types:
        if norms[-1] != replace or (norm_types[0] == "Prepend" and norms[0]["prepend"] != META):
            return None
        return "drop" if norm_types[0] == "Prepend" else "keep"
    if not norms and types == ["Metaspace"] and pres[0].get("replacement") == META:
        scheme = pres[0].get("prepend_scheme")
        if scheme is None:  # tokenizers before 0.19: add_prefix_space
            scheme = "always" if pres[0].get("add_prefix_space", True) else "never"
        return "drop" if scheme in ("first", "always") else "keep"
    return None


class HFTokenizer(Tokenizer):
    """A Hugging Face `tokenizers` tokenizer from its `tokenizer.json` text."""

    # Names of BOS and EOS tokens, for a tokenizer.json that does not add them itself (GPT-2's
    # `<|endoftext|>` is both, as in transformers' GPT2Tokenizer).
    BOS_NAMES = ("<s>", "<|begin_of_text|>", "<bos>", "<|startoftext|>", "<|endoftext|>")
    EOS_NAMES = ("</s>", "<|end_of_text|>", "<eos>", "<|endoftext|>")

    def __init__(self, tokenizer_json: str, name: str = "tokenizer.json"):
        """Builds the tokenizer and finds its specials from the tokenizer itself: a BOS id and
        `add_bos_default` from what encoding with special tokens prepends (its post-processor),
        otherwise BOS and EOS by the usual token names (`BOS_NAMES`, `EOS_NAMES`); set the
        attributes to override."""
        from tokenizers import Tokenizer as _Tok

        self._json = tokenizer_json
        self._tok = _Tok.from_str(tokenizer_json)
        self.name = name
        self.vocab_size = self._tok.get_vocab_size(with_added_tokens=True)
        spec = json.loads(tokenizer_json)
        # Byte-level BPE (GPT-2 and kin) spells each byte as one character of a token's string.
        self._byte_level = "ByteLevel" in json.dumps(spec.get("decoder"))
        self._added = {t.content for t in self._tok.get_added_tokens_decoder().values()}
        self._bytes_by_id: np.ndarray | None = None
        self._cut_rule = _hf_cut_rule(spec, self._tok.get_vocab(with_added_tokens=True))
        del spec
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
        return [ids for ids, _ in self._encode_all(texts, with_bytes=False)]

    def encode_with_bytes(self, texts: list[str]) -> list[tuple[np.ndarray, np.ndarray]]:
        return self._encode_all(texts, with_bytes=True)

    def _encode_all(self, texts: list[str], with_bytes: bool) -> list[tuple[np.ndarray, ...]]:
        """Short texts in batches of at most `piece_chars` characters (`encode_batch`), long ones
        piece by piece."""
        out: list[Any] = [None] * len(texts)
        batch: list[int] = []

        def flush() -> None:
            encs = self._tok.encode_batch([texts[i] for i in batch], add_special_tokens=False)
            for i, enc in zip(batch, encs, strict=True):
                ids, ends, is_byte = self._from_encoding(enc, texts[i], 0, with_bytes)
                total = len(texts[i].encode("utf-8")) if with_bytes else 0
                out[i] = (ids, _span_lengths(ends, is_byte, total) if with_bytes else None)
            batch.clear()

        chars = 0
        for i, text in enumerate(texts):
            if len(text) > self.piece_chars:
                out[i] = self._encode_document(text, with_bytes)
                continue
            if chars + len(text) > self.piece_chars and batch:
                flush()
                chars = 0
            batch.append(i)
            chars += len(text)
        if batch:
            flush()
        return out

    def _safe_cuts(self, text: str) -> list[int]:
        return _space_cuts(text, self.piece_chars) if self._cut_rule else []

    def _encode_piece(
        self, piece: str, first: bool, with_bytes: bool
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        skip = int(not first and self._cut_rule == "drop")  # the piece's leading space
        enc = self._tok.encode(piece[skip:], add_special_tokens=False)
        ids, ends, is_byte = self._from_encoding(enc, piece[skip:], skip, with_bytes)
        if skip and with_bytes and ids.size and enc.tokens[0] == META:
            ends[0] = skip  # a lone prepended "▁" stands for the dropped space (the library
            # aligns it with the next character instead)
        return ids, ends, is_byte

    def _from_encoding(
        self, enc: Any, text: str, shift: int, with_bytes: bool
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Ids, token ends in bytes (plus `shift`) and byte-fallback flags of an encoding."""
        ids = np.asarray(enc.ids, dtype=np.int32)
        if not with_bytes:
            return ids, np.zeros(0, np.int64), np.zeros(0, bool)
        if self._byte_level:
            # Each character of a byte-level token's string is one byte of the text; an added
            # token (e.g. "<|endoftext|>" written in the text) is its own UTF-8 spelling.
            ends = np.cumsum(self._token_bytes()[ids]) + shift
            return ids, ends, np.zeros(ids.size, bool)
        char_to_byte = np.cumsum([0] + [len(c.encode("utf-8")) for c in text], dtype=np.int64)
        ends = char_to_byte[np.asarray([end for _, end in enc.offsets], np.int64)] + shift
        is_byte = np.asarray([bool(_BYTE_PIECE.fullmatch(t)) for t in enc.tokens], bool)
        return ids, ends.reshape(-1), is_byte

    def _token_bytes(self) -> np.ndarray:
        """`[vocab_size] int64`: the bytes of text each token of a byte-level vocabulary spells
        (one per character of its string; an added token's UTF-8 length), built once."""
        if self._bytes_by_id is None:
            table = np.zeros(self.vocab_size, np.int64)
            for token, i in self._tok.get_vocab(with_added_tokens=True).items():
                table[i] = len(token.encode("utf-8")) if token in self._added else len(token)
            self._bytes_by_id = table
        return self._bytes_by_id

    def _token_texts(self, ids: list[int]) -> list[str]:
        texts = self._tok.decode_batch([[i] for i in ids], skip_special_tokens=False)
        pieces = [self._tok.id_to_token(i) or "" for i in ids]
        return [_keep_space(p, t) for p, t in zip(pieces, texts, strict=True)]

    def describe(self) -> dict[str, Any]:
        return {"type": "hf", "name": self.name, "tokenizer_json": self._json, **_specials(self)}


class SentencePieceTokenizer(Tokenizer):
    """A SentencePiece model (`tokenizer.model`) through the `sentencepiece` library.

    Encoding adds no BOS or EOS (the library's default); `bos_id` and `eos_id` are the model's own
    (`bos_id()`, `eos_id()`; None where it has none) and `add_bos_default` is False, the
    library's default, unless set (from a `tokenizer_config.json`, e.g. Llama 2's
    `add_bos_token: true`).

    Long documents are cut at `_CUT` spaces when the model's normalization allows it: with the
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
        if not _no_token_spans_a_space(pieces):
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
        return _space_cuts(text, self.piece_chars) if self._cut_rule else []

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
            else _keep_space(sp.id_to_piece(i), sp.decode([i]))
            for i in ids
        ]

    def describe(self) -> dict[str, Any]:
        return {
            "type": "sentencepiece",
            "name": self.name,
            "model_base64": base64.b64encode(self._proto).decode("ascii"),
            **_specials(self),
        }


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
    `tokenizer.json`, a SentencePiece `.model`, or a Hugging Face directory (`ppl_jax.checkpoints.hf`).

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
        from ppl_jax.tokenizer.directory import load_tokenizer  # the module imports this one

        return load_tokenizer(path)
    if path.endswith(".model"):
        return SentencePieceTokenizer.from_file(path)
    return HFTokenizer.from_file(path)
