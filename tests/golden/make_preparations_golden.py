"""Writes tests/golden/preparations.json: lm-evaluation-harness's own `wikitext` functions on
synthetic pages, for tests/unit/data/test_preparations.py.

    pip install '.[reference]'
    python tests/golden/make_preparations_golden.py                          # synthetic pages
    python tests/golden/make_preparations_golden.py --data "$PPL_JAX_TEST_DATA"  # and WikiText-2

For each input page it stores `wikitext_detokenizer({"page": page})` and the word and byte counts
of the task's `process_results` (lm_eval/tasks/wikitext/preprocess_wikitext.py). The inputs are
`PAGES` (written to exercise every rule of the detokenizer and of the word count) and `fuzz(0)`
(random strings of the characters and pieces the rules act on).

With `--data DIR` (the folder PPL_JAX_TEST_DATA names) it also stores, for DIR/wikitext-2/test.txt
and valid.txt, the harness's per-page counts and the SHA-256 of its detokenized pages, the pages
cut by `ppl_jax.data.preparations.wikitext_pages` (the document-level builder script is not
installable offline); tests/shared_data/test_preparations_data.py compares. Without it, that entry
of the existing file is kept.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
GOLDEN = os.path.join(HERE, "preparations.json")
WIKITEXT_FILES = ("wikitext-2/test.txt", "wikitext-2/valid.txt")

PAGES = [
    # contractions and possessives
    "The players ' union met the boss 's lawyers ; the Jones ' house , its ' s",
    "/' 5/ and /' 52/ and /'5/ and /' \u0663/ and x/' 0/y",
    # number separators
    "1 @-@ 2 , 3 @,@ 000 , 4 @.@ 5 ; @-@ alone , a@-@b , 6 @.@ @.@ 7",
    # punctuation
    "a : b ; c . d ! e ? f , g . . . h , , i ?! j ( k . ) l",
    # pairs, across lines, nested, unmatched, empty
    "( a ) (  ) ( a ( b ) c ) [ x\n y ] { \t z \x0c } \" q \" ' s ' ( open [ ] ) close (",
    '" one " two " three " \' four \' five \' six',
    "( \u2028 a \u00a0) ( \x1c b \x85 ) (\u3000c\u3000) [\u2029] { \x1f }",
    # headings
    "= = = = A = = = = \n = = = B = = = \n = = C = = \n = = = = = D = = = = = \n = E =",
    # degree sign, line ends, placeholders, 's
    "20 \u00b0 C , 5 \u00b0C , \u00b0 , 3 \u00b0 \u00b0 4",
    "a \nb\n c  \n  d \n \n e\t\n\tf",
    "N of N N N people , N\nN and  N  N . 's 's s 'z",
    # word counts: leading, trailing and unusual whitespace; empty
    "",
    " ",
    "\n",
    " word ",
    "two\u2028words\u00a0three\x1cfour",
    # a WikiText-like page
    " = Robert Boulter = \n \n Robert Boulter is an English film , television and theatre actor "
    ". He had a guest @-@ starring role on the television series The Bill in 2000 . He was cast "
    'as " Craig " in the episode " Teddy \'s Story " ( 2004 ) [ 1 ] . \n \n = = Career = = \n \n '
    "= = = 2000 \u2013 2005 = = = \n \n In 2000 Boulter had a 4 @,@ 000 @-@ seat role ; it was 5 "
    "@.@ 5 \u00b0 C and N players ' fans . \n ",
]

_PIECES = (
    " ", " ", " ", "\n", "\t", "\u2028", "\u00a0", "s", "'", '"', "(", ")", "[", "]", "{", "}",
    "@-@", "@,@", "@.@", "@", "-", ",", ".", ":", ";", "!", "?", "=", "= =", "\u00b0", "N", "/",
    "5", "a", "\u00e9",
)  # fmt: skip


def fuzz(seed: int, count: int = 400, max_pieces: int = 40) -> list[str]:
    """`count` random strings of up to `max_pieces` of `_PIECES` (the characters and pieces the
    detokenizer's rules act on), seeded."""
    rng = random.Random(seed)
    return [
        "".join(rng.choice(_PIECES) for _ in range(rng.randrange(max_pieces + 1)))
        for _ in range(count)
    ]


def harness(pages: list[str]) -> dict:
    """The harness's detokenized pages and per-page word and byte counts."""
    from lm_eval.tasks.wikitext import preprocess_wikitext as wikitext

    counts = [wikitext.process_results({"page": p}, [0.0]) for p in pages]
    for c in counts:  # the three metrics count bytes on the same string
        assert c["byte_perplexity"][1] == c["bits_per_byte"][1]
    return {
        "detokenized": [wikitext.wikitext_detokenizer({"page": p}) for p in pages],
        "words": [c["word_perplexity"][1] for c in counts],
        "bytes": [c["bits_per_byte"][1] for c in counts],
    }


def digest(texts: list[str]) -> str:
    """SHA-256 of the texts, each UTF-8 encoded and followed by a NUL."""
    h = hashlib.sha256()
    for t in texts:
        h.update(t.encode("utf-8") + b"\0")
    return h.hexdigest()


def wikitext_numbers(data: str) -> dict:
    """Per WikiText-2 file: its SHA-256, the harness's counts and detokenized pages' digest."""
    from ppl_jax.data.preparations import wikitext_pages

    out = {}
    for name in WIKITEXT_FILES:
        raw = open(os.path.join(data, name), "rb").read()
        pages = [p for _, p in wikitext_pages(raw.decode("utf-8"))]
        h = harness(pages)
        out[name] = {
            "sha256": hashlib.sha256(raw).hexdigest(),
            "words": h["words"],
            "bytes": h["bytes"],
            "detokenized_sha256": digest(h["detokenized"]),
        }
    return out


def versions() -> dict[str, str]:
    import lm_eval

    return {"lm_eval": getattr(lm_eval, "__version__", "?"), "python": sys.version.split()[0]}


def numbers(data: str | None, previous: dict | None) -> dict:
    fuzzed = fuzz(0)
    out = {
        "generated_with": versions(),
        "pages": PAGES,
        "pages_harness": harness(PAGES),
        "fuzz": fuzzed,
        "fuzz_harness": harness(fuzzed),
    }
    if data is not None:
        out["wikitext"] = wikitext_numbers(data)
    elif previous and "wikitext" in previous:
        out["wikitext"] = previous["wikitext"]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", help="the shared data folder (holds wikitext-2/test.txt)")
    args = parser.parse_args()
    previous = None
    if os.path.exists(GOLDEN):
        with open(GOLDEN, encoding="utf-8") as f:
            previous = json.load(f)
    contents = numbers(args.data, previous)
    with open(GOLDEN, "w", encoding="utf-8") as f:
        json.dump(contents, f, indent=1, ensure_ascii=True)
        f.write("\n")
    print(f"{GOLDEN}: {os.path.getsize(GOLDEN) / 1e3:.0f} kB")


if __name__ == "__main__":
    main()
