"""Long documents are tokenized in pieces cut at provably safe spaces (`ppl_jax.tokenizer`): the
ids and per-token byte lengths must be exactly those of the whole document, for every tokenizer
kind, on random texts with runs of whitespace, newlines, multibyte UTF-8 and cuts every few
characters. Run as a script to measure peak host memory on a 50 MB one-line document:

    python tests/unit/tokenizer/test_tokenizer_memory.py [--tokenizer tokenizer.json] [--mb 50]
"""

import json
import os
import random
import sys

import numpy as np
import pytest

from ppl_jax.tokenizer import ByteTokenizer, HFTokenizer, SentencePieceTokenizer

if __name__ == "__main__":  # run as a script: helpers sits in tests/
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
import helpers  # noqa: E402

FIXTURES = os.path.join(helpers.REPO, "tests", "golden", "tokenizers")
CL100K = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
ALPHABET = ["a", "b", "é", "ü", "日", "本", "😀", "Ω", "7", ".", "'", "-", "x", "ab", "the"]
SPACES = [" ", " ", " ", "  ", "   ", "\n", "\n\n", "\t", " \n", "\u00a0", "\u3000"]


def _json(name):
    with open(os.path.join(FIXTURES, name), encoding="utf-8") as f:
        return json.load(f)


def _variant(name, **changes):
    spec = _json(name)
    spec.update(changes)
    return HFTokenizer(json.dumps(spec), name=f"{name} variant")


def tokenizers():
    """Every kind, with the cut rule it should get ("keep"/"drop": pieces; None: whole)."""
    llama = _json("llama_bpe.json")
    return {
        "bytelevel": (HFTokenizer.from_file(os.path.join(FIXTURES, "bytelevel_bpe.json")), "keep"),
        "bytelevel_split_cl100k": (
            _variant(
                "bytelevel_bpe.json",
                pre_tokenizer={
                    "type": "Sequence",
                    "pretokenizers": [
                        {
                            "type": "Split",
                            "pattern": {"Regex": CL100K},
                            "behavior": "Isolated",
                            "invert": False,
                        },
                        {
                            "type": "ByteLevel",
                            "add_prefix_space": False,
                            "trim_offsets": True,
                            "use_regex": False,
                        },
                    ],
                },
                normalizer={"type": "NFC"},
            ),
            "keep",
        ),
        "llama_metaspace": (
            HFTokenizer.from_file(os.path.join(FIXTURES, "llama_bpe.json")),
            "drop",
        ),
        # Llama 2's older tokenizer.json: Prepend("▁") + Replace(" ", "▁"), no pre-tokenizer.
        "llama_prepend_replace": (
            _variant(
                "llama_bpe.json",
                pre_tokenizer=None,
                normalizer={
                    "type": "Sequence",
                    "normalizers": [
                        {"type": "Prepend", "prepend": "\u2581"},
                        {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"},
                    ],
                },
            ),
            "drop",
        ),
        "llama_metaspace_never": (
            _variant(
                "llama_bpe.json",
                pre_tokenizer={**llama["pre_tokenizer"], "prepend_scheme": "never"},
            ),
            "keep",
        ),
        "sentencepiece_bpe": (
            SentencePieceTokenizer.from_file(os.path.join(FIXTURES, "sp_bpe.model")),
            "drop",
        ),
        "sentencepiece_unigram_nfkc": (
            SentencePieceTokenizer.from_file(os.path.join(FIXTURES, "sp_unigram.model")),
            "drop",
        ),
        # An unknown pre-tokenizer regex: no proof, so documents are encoded whole.
        "bytelevel_unknown_split": (
            _variant(
                "bytelevel_bpe.json",
                pre_tokenizer={
                    "type": "Sequence",
                    "pretokenizers": [
                        {
                            "type": "Split",
                            "pattern": {"Regex": r"\S+\s?"},
                            "behavior": "Isolated",
                            "invert": False,
                        },
                        {
                            "type": "ByteLevel",
                            "add_prefix_space": False,
                            "trim_offsets": True,
                            "use_regex": False,
                        },
                    ],
                },
            ),
            None,
        ),
    }


TOKENIZERS = tokenizers()


def random_text(rng):
    parts = []
    for _ in range(rng.randint(0, 40)):
        parts.append("".join(rng.choice(ALPHABET) for _ in range(rng.randint(1, 6))))
        parts.append(rng.choice(SPACES))
    start = rng.choice(["", " ", "  ", "\n"])
    return start + "".join(parts[: rng.randint(0, len(parts))])


def _whole_and_pieces(tok, text, piece_chars):
    tok.piece_chars = 1 << 40
    whole = tok.encode_with_bytes([text])[0], tok.encode([text])[0]
    tok.piece_chars = piece_chars
    pieces = tok.encode_with_bytes([text])[0], tok.encode([text])[0]
    cuts = tok._safe_cuts(text) if len(text) > piece_chars else []
    tok.piece_chars = type(tok).piece_chars
    return whole, pieces, cuts


@pytest.mark.parametrize("kind", list(TOKENIZERS))
def test_pieces_equal_the_whole_document(kind):
    tok, rule = TOKENIZERS[kind]
    assert tok._cut_rule == rule
    rng = random.Random(kind)
    total_cuts = 0
    for _ in range(150):
        text = random_text(rng)
        (w_pair, w_ids), (p_pair, p_ids), cuts = _whole_and_pieces(tok, text, rng.randint(1, 12))
        total_cuts += len(cuts)
        assert w_pair[0].tolist() == w_ids.tolist() == p_pair[0].tolist() == p_ids.tolist(), text
        assert w_pair[1].tolist() == p_pair[1].tolist(), text
        assert p_pair[0].dtype == np.int32 and p_pair[1].dtype == np.int32
        if kind.startswith(("bytelevel", "llama_metaspace")) or kind == "sentencepiece_bpe":
            assert int(w_pair[1].sum()) == len(text.encode("utf-8"))  # every byte counted
    assert (total_cuts > 200) == (rule is not None)  # the cuts really happen


def test_a_wrong_rule_is_caught():
    """The test above can fail: keeping the leading space of a piece of a Llama 2 tokenizer (whose
    normalizer prepends "▁" to every text) changes the ids."""
    tok, _ = tokenizers()["llama_prepend_replace"]
    tok._cut_rule = "keep"
    (w_pair, _), (p_pair, _), cuts = _whole_and_pieces(tok, "ab cd ef gh", 2)
    assert cuts == [2, 5, 8] and w_pair[0].tolist() != p_pair[0].tolist()


def test_many_documents_batched_and_long_ones_cut():
    tok, _ = TOKENIZERS["bytelevel"]
    rng = random.Random(3)
    texts = [random_text(rng) for _ in range(60)]
    expected = [tok._tok.encode(t, add_special_tokens=False).ids for t in texts]
    tok.piece_chars = 20  # batches of short texts and pieces of long ones
    try:
        got = tok.encode(texts)
        with_bytes = tok.encode_with_bytes(texts)
    finally:
        tok.piece_chars = type(tok).piece_chars
    assert [g.tolist() for g in got] == expected
    assert [ids.tolist() for ids, _ in with_bytes] == expected
    assert [int(n.sum()) for _, n in with_bytes] == [len(t.encode("utf-8")) for t in texts]


@pytest.mark.parametrize("kind", ["bytelevel", "llama_metaspace", "sentencepiece_bpe"])
def test_flat_encoding_is_the_texts_encodings_end_to_end(kind):
    """`encode_flat_with_bytes` (the token cache's batch encoding) gives `encode_with_bytes`'s
    ids and byte lengths laid end to end, with each text's token count: short texts in several
    batches (HF byte-level: measured a batch at once), empty texts, and a long text (cut)."""
    tok, _ = TOKENIZERS[kind]
    rng = random.Random(5)
    texts = ["", *(random_text(rng) for _ in range(40)), "", "x"]
    tok.piece_chars = 30
    try:
        for case in (texts, [*texts, "word " * 40], [], [""]):
            want = tok.encode_with_bytes(case)
            ids, lengths, sizes = tok.encode_flat_with_bytes(case)
            assert ids.dtype == lengths.dtype == np.int32 and sizes.dtype == np.int64
            assert sizes.tolist() == [i.size for i, _ in want]
            assert ids.tolist() == [t for i, _ in want for t in i.tolist()]
            assert lengths.tolist() == [n for _, b in want for n in b.tolist()]
    finally:
        tok.piece_chars = type(tok).piece_chars


def test_byte_tokenizer_lengths():
    ids, lengths = ByteTokenizer().encode_with_bytes(["aé😀"])[0]
    assert ids.tolist() == list("aé😀".encode()) and lengths.tolist() == [1] * 7
    assert ids.dtype == lengths.dtype == np.int32


# ------------------------------------------------------------------------- measurement (script)


def _peak_rss(tokenizer_path: str, mb: int, whole: bool, plan: bool = False) -> dict:
    """Peak RSS (MiB, `ru_maxrss`) of a fresh process encoding one `mb` MB line with bytes; with
    `plan`, of reading it from a file and planning `sliding` 1024/512 windows (the whole data
    preparation of a run)."""
    import subprocess
    import sys

    code = f"""
import resource, random, sys, time
import numpy as np
from ppl_jax.tokenizer import HFTokenizer
tok = HFTokenizer.from_file({tokenizer_path!r})
rng = random.Random(0)
words = [w for w in open({os.path.abspath(__file__)!r}).read().split() if w.isascii()]
text = " ".join(rng.choice(words) for _ in range({mb} * 1_000_000 // 6))[: {mb} * 1_000_000]
if {whole}:
    tok.piece_chars = 1 << 40
if {plan}:
    import tempfile
    from ppl_jax.data import documents as data
    from ppl_jax.plans import protocols
    path = tempfile.mkstemp(suffix=".txt")[1]
    open(path, "w").write(text)
    del text
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
t = time.perf_counter()
if {plan}:
    text = data.read_documents(path, "text")[0].text
    inputs = protocols.PlanInputs(tok, tok.vocab_size, 1024, 512, False)
    p = protocols.SLIDING.plan([data.Document(text, path)], inputs)
    ids, lengths = p.windows.tokens, np.zeros(0, np.int32)
else:
    ids, lengths = tok.encode_with_bytes([text])[0]
print(before / 1024, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, ids.size,
      ids.nbytes + lengths.nbytes, time.perf_counter() - t, len(text))
"""
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.split()
    before, peak, n, kept, seconds, chars = map(float, out)
    return {
        "text_MB": chars / 1e6,
        "rss_before_MiB": round(before),
        "peak_MiB": round(peak),
        "increase_x_text": round((peak - before) * 2**20 / chars, 2),
        "tokens": int(n),
        "kept_arrays_x_text": round(kept / chars, 2),
        "seconds": round(seconds, 1),
    }


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description="peak host memory of tokenizing one long line")
    parser.add_argument("--tokenizer", default=os.path.join(FIXTURES, "bytelevel_bpe.json"))
    parser.add_argument("--mb", type=int, default=50)
    parser.add_argument("--whole", action="store_true", help="no pieces (the old behaviour)")
    parser.add_argument("--plan", action="store_true", help="read the file and plan the windows")
    args = parser.parse_args()
    print(json.dumps(_peak_rss(args.tokenizer, args.mb, args.whole, args.plan)))
