"""A Hugging Face `tokenizer.json` through the `tokenizers` library (`HFTokenizer`), and the rule
by which a long document may be cut into pieces that give the same tokens (`_hf_cut_rule`)."""

from __future__ import annotations

import itertools
import json
import os
from typing import Any

import numpy as np

from ppl_jax.errors import ConfigError
from ppl_jax.tokenizer.core import (
    BYTE_PIECE,
    META,
    Tokenizer,
    keep_space,
    no_token_spans_a_space,
    space_cuts,
    span_lengths,
    specials,
    texts_of,
)

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
    """How a `tokenizer.json` may be cut at `CUT` spaces: "keep" (pieces keep their leading
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
    if META not in vocab or not no_token_spans_a_space(vocab):
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
        return [ids for ids, _ in self._encode_all(texts_of(texts, "encode"), with_bytes=False)]

    def encode_with_bytes(self, texts: list[str]) -> list[tuple[np.ndarray, np.ndarray]]:
        return self._encode_all(texts_of(texts, "encode_with_bytes"), with_bytes=True)

    def _encode_all(self, texts: list[str], with_bytes: bool) -> list[tuple[np.ndarray, ...]]:
        """Short texts in batches of at most `piece_chars` characters (`encode_batch`), long ones
        piece by piece."""
        out: list[Any] = [None] * len(texts)
        batch: list[int] = []

        def flush() -> None:
            encs = self._tok.encode_batch([texts[i] for i in batch], add_special_tokens=False)
            if with_bytes and self._byte_level:
                self._byte_level_batch(encs, [texts[i] for i in batch], batch, out)
                batch.clear()
                return
            for i, enc in zip(batch, encs, strict=True):
                ids, ends, is_byte = self._from_encoding(enc, texts[i], 0, with_bytes)
                total = len(texts[i].encode("utf-8")) if with_bytes else 0
                out[i] = (ids, span_lengths(ends, is_byte, total) if with_bytes else None)
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
        return space_cuts(text, self.piece_chars) if self._cut_rule else []

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

    def encode_flat_with_bytes(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """`Tokenizer.encode_flat_with_bytes`; short texts of a byte-level vocabulary in batches
        of at most `piece_chars` characters, each measured at once (`_byte_level_flat`)."""
        texts = texts_of(texts, "encode_flat_with_bytes")
        chars = np.fromiter(map(len, texts), np.int64, count=len(texts))
        if not self._byte_level or not texts or int(chars.max()) > self.piece_chars:
            return super().encode_flat_with_bytes(texts)
        ends = np.cumsum(chars)
        parts = []
        a = 0
        while a < len(texts):  # batches as `_encode_all` makes them
            before = int(ends[a - 1]) if a else 0
            b = max(int(np.searchsorted(ends, before + self.piece_chars, side="right")), a + 1)
            batch = texts[a:b]
            encs = self._tok.encode_batch(batch, add_special_tokens=False)
            parts.append(self._byte_level_flat(encs, batch))
            a = b
        if len(parts) == 1:
            return parts[0]
        ids, lengths, sizes = zip(*parts, strict=True)
        return np.concatenate(ids), np.concatenate(lengths), np.concatenate(sizes)

    def _byte_level_flat(
        self, encs: list[Any], texts: list[str]
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """`(ids [n] int32, byte lengths [n] int32, sizes [d] int64)` of a batch of whole short
        texts of a byte-level vocabulary, for the batch at once: each token covers the bytes its
        string spells (`_token_bytes`), the text's trailing bytes no token covers counted with
        its last token (what `_from_encoding` and `span_lengths` give one text at a time)."""
        ids = [e.ids for e in encs]  # each `Encoding.ids` builds a new list: read once
        sizes = np.fromiter(map(len, ids), np.int64, count=len(ids))
        flat = np.fromiter(itertools.chain.from_iterable(ids), np.int32, count=int(sizes.sum()))
        del ids
        lengths = self._token_bytes()[flat].astype(np.int32)
        bounds = np.cumsum(sizes)
        starts = bounds - sizes
        covered = np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)])
        totals = np.fromiter((len(t.encode("utf-8")) for t in texts), np.int64, count=len(texts))
        rest = np.maximum(0, totals - (covered[bounds] - covered[starts]))
        last = bounds[sizes > 0] - 1
        lengths[last] += rest[sizes > 0].astype(np.int32)
        return flat, lengths, sizes

    def _byte_level_batch(
        self, encs: list[Any], texts: list[str], where: list[int], out: list[Any]
    ) -> None:
        """`out[where[j]] = (ids, byte lengths)` of a batch of whole short texts of a byte-level
        vocabulary (`_byte_level_flat`)."""
        flat, lengths, sizes = self._byte_level_flat(encs, texts)
        bounds = np.cumsum(sizes)
        for j, (a, b) in enumerate(zip((bounds - sizes).tolist(), bounds.tolist(), strict=True)):
            out[where[j]] = (flat[a:b], lengths[a:b])

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
        is_byte = np.asarray([bool(BYTE_PIECE.fullmatch(t)) for t in enc.tokens], bool)
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

    def char_spans(self, text: str) -> tuple[np.ndarray, np.ndarray]:
        """`Tokenizer.char_spans`: the ids and character offsets of the `tokenizers` library's
        encoding of the whole text without special tokens, as transformers' fast tokenizers
        report them (`return_offsets_mapping`, post-processor trimming included)."""
        enc = self._tok.encode(text, add_special_tokens=False)
        spans = np.asarray(enc.offsets, np.int64).reshape(-1, 2)
        return np.asarray(enc.ids, np.int32), spans

    def _token_texts(self, ids: list[int]) -> list[str]:
        texts = self._tok.decode_batch([[i] for i in ids], skip_special_tokens=False)
        pieces = [self._tok.id_to_token(i) or "" for i in ids]
        return [keep_space(p, t) for p, t in zip(pieces, texts, strict=True)]

    def describe(self) -> dict[str, Any]:
        return {"type": "hf", "name": self.name, "tokenizer_json": self._json, **specials(self)}
