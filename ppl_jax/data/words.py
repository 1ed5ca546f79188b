"""Counting words: whitespace-separated words of UTF-8 bytes in bounded memory, and
lm-evaluation-harness's regex count (the denominators of word perplexity)."""

from __future__ import annotations

import re

WORD_CHUNK = 1 << 20  # bytes decoded at a time when counting words


def count_words(raw: bytes, lo: int = 0, hi: int | None = None, chunk: int = WORD_CHUNK) -> int:
    """`len(raw[lo:hi].decode("utf-8", errors="ignore").split())`, in bounded memory.

    The bytes are decoded `chunk` at a time, each cut moved back to the start of a UTF-8
    character (so no character is split and `errors="ignore"` drops the same bytes as a whole
    decode would); a word that runs across a cut is counted once.
    """
    hi = len(raw) if hi is None else hi
    view = memoryview(raw)
    words, joined = 0, False  # joined: the previous chunk ended inside a word
    while lo < hi:
        cut = min(hi, lo + chunk)
        while lo < cut < hi and (raw[cut] & 0xC0) == 0x80:  # a continuation byte
            cut -= 1
        if cut == lo:  # a character longer than the chunk (never for chunk >= 4): take it whole
            cut = lo + 1
            while cut < hi and (raw[cut] & 0xC0) == 0x80:
                cut += 1
        text = bytes(view[lo:cut]).decode("utf-8", errors="ignore")
        words += len(text.split())
        if joined and text and not text[0].isspace():
            words -= 1
        if text:
            joined = not text[-1].isspace()
        lo = cut
    return words


def words_after(text: str, first_bytes: int) -> int:
    """The `str.split` words of `text` after its first `first_bytes` UTF-8 bytes (its first
    token's, context only when a protocol scores a document without BOS; 0 when nothing else)."""
    return count_words(text.encode("utf-8"), first_bytes)


def count_harness_words(text: str) -> int:
    """`len(re.split(r"\\s+", text))` (lm-evaluation-harness's word count), without the list."""
    return sum(1 for _ in re.finditer(r"\s+", text)) + 1
