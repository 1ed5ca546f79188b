"""Words are counted in bounded memory exactly as the whole-text definitions count them."""

import random
import re

import pytest

from ppl_jax.data.words import count_harness_words, count_words

PIECES = ["a", "bc", "é", "戦場", "😀", " ", "  ", "\n", "\t", "\u00a0", "\u2028", "\x1c", "\u3000"]


def random_texts(seed: int, n: int = 300):
    rng = random.Random(seed)
    for _ in range(n):
        yield "".join(rng.choice(PIECES) for _ in range(rng.randrange(0, 40)))


@pytest.mark.parametrize("chunk", [1, 2, 3, 5, 8, 1 << 20])
def test_count_words_equals_split_of_the_whole_decoded_span(chunk):
    rng = random.Random(chunk)
    for text in random_texts(chunk):
        raw = text.encode("utf-8")
        # Spans may begin or end inside a character (byte-level tokens split characters).
        lo = rng.randrange(0, len(raw) + 1)
        hi = rng.randrange(lo, len(raw) + 1)
        expected = len(raw[lo:hi].decode("utf-8", errors="ignore").split())
        assert count_words(raw, lo, hi, chunk=chunk) == expected, (text, lo, hi)


def test_count_harness_words_equals_re_split():
    for text in random_texts(7):
        assert count_harness_words(text) == len(re.split(r"\s+", text)), text
