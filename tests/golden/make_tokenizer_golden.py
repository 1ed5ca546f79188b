"""Writes the tokenizer fixtures and golden ids of tests/golden/tokenizers/ by running the real
libraries: `tokenizers` and `sentencepiece` train the fixtures (with `--train`), and transformers'
`AutoTokenizer.from_pretrained(dir)` gives the ids that tests/unit/tokenizer/test_tokenizer_hf.py compares with
ppl_jax's, without needing transformers itself.

    python tests/golden/make_tokenizer_golden.py [--train]

Fixtures (committed; vocabularies of a few hundred, trained on generated text):
  bytelevel_bpe.json  byte-level BPE tokenizer.json, GPT-2 style (no BOS post-processor).
  llama_bpe.json      tokenizer.json converted by transformers from sp_bpe.model, Llama 2 style
                      (Metaspace, byte fallback, a `<s>` TemplateProcessing post-processor).
  sp_bpe.model        SentencePiece BPE with byte fallback, no extra-whitespace removal (Llama 2's
                      settings).
  sp_unigram.model    SentencePiece unigram with the default nmt_nfkc normalization.
Golden: golden_ids.json, one record per case (directory layout + the ids transformers gives).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import tempfile

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tokenizers")

WORDS = (
    "the of and to in is that for it as was with be by on not he this are or his from at which "
    "but have an they you were her she there been one all we their has would when if so no "
    "café naïve résumé über straße Ελλάδα Москва 日本語 中文 한국어 emoji 😀 🎉 don't it's we'll "
    "perplexity token window stride 1234 3.14 -42 (x) [y] {z} <tag> a_b foo.bar x+y=z"
).split()


SYLLABLES = "ka ri to ne su mo la pe di gu zo chi wa ya be fo hu ji lu mi na".split()


def _pseudo_word(rng: random.Random) -> str:
    return "".join(rng.choice(SYLLABLES) for _ in range(rng.randint(1, 4)))


def corpus(n_lines: int = 4000, seed: int = 0) -> list[str]:
    """Deterministic training text: words, digits, punctuation, multibyte UTF-8, space runs."""
    rng = random.Random(seed)
    lines = []
    for _ in range(n_lines):
        words = [
            rng.choice(WORDS) if rng.random() < 0.6 else _pseudo_word(rng)
            for _ in range(rng.randint(1, 14))
        ]
        seps = [rng.choice([" ", " ", " ", "  ", "\t", ", ", ". "]) for _ in words[1:]]
        line = words[0] + "".join(s + w for s, w in zip(seps, words[1:], strict=True))
        lines.append(rng.choice(["", " ", "   "]) + line)
    return lines


def train(out: str = HERE) -> None:
    import sentencepiece as spm
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    os.makedirs(out, exist_ok=True)
    lines = corpus()
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(lines, trainer)
    tok.save(os.path.join(out, "bytelevel_bpe.json"))

    with tempfile.TemporaryDirectory() as tmp:
        text = os.path.join(tmp, "corpus.txt")
        with open(text, "w", encoding="utf-8") as f:
            f.write("\n".join(lines) + "\n")
        common = dict(
            input=text,
            vocab_size=400,
            character_coverage=0.98,
            bos_id=1,
            eos_id=2,
            unk_id=0,
            num_threads=1,
            minloglevel=2,
        )
        spm.SentencePieceTrainer.train(
            model_prefix=os.path.join(out, "sp_bpe"),
            model_type="bpe",
            byte_fallback=True,
            remove_extra_whitespaces=False,
            allow_whitespace_only_pieces=True,
            split_digits=True,
            normalization_rule_name="identity",
            **common,
        )
        spm.SentencePieceTrainer.train(
            model_prefix=os.path.join(out, "sp_unigram"), model_type="unigram", **common
        )
    for name in ("sp_bpe.vocab", "sp_unigram.vocab"):
        os.remove(os.path.join(out, name))
    # Llama 2's tokenizer.json is transformers' conversion of its SentencePiece BPE model.
    from transformers import LlamaTokenizer

    with tempfile.TemporaryDirectory() as tmp:
        shutil.copy(os.path.join(out, "sp_bpe.model"), os.path.join(tmp, "tokenizer.model"))
        with open(os.path.join(tmp, "tokenizer_config.json"), "w") as f:
            json.dump({"tokenizer_class": "LlamaTokenizer", "add_bos_token": True}, f)
        LlamaTokenizer.from_pretrained(tmp).backend_tokenizer.save(
            os.path.join(out, "llama_bpe.json")
        )


TEXTS = [
    "Hello world.",
    "the perplexity of a window, with a stride",
    "café naïve résumé 😀 日本語 Ελλάδα",
    "x+y=z (x) [y] {z} 3.14 -42 don't",
    "",
]
# Whitespace runs, tabs and newlines: transformers 5 converts a SentencePiece-only directory
# into a `tokenizers` BPE that splits runs of spaces differently from the sentencepiece library,
# so these are compared for tokenizer.json directories only.
TEXTS_WHITESPACE = ["  two leading,  two inner\tand\nnewlines\n\n ", " a  b   c    d "]

GPT2_SPECIALS = {"bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>"}
LLAMA_SPECIALS = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}
LLAMA_CONFIG = {"model_type": "llama", "architectures": ["LlamaForCausalLM"]}


def cases() -> list[dict]:
    """Directory layouts: (tokenizer kind) x (tokenizer_config add_bos_token true/false/absent)."""
    out = []
    kinds = [
        # The reported case: a Llama-architecture directory with a GPT-2 style tokenizer.json.
        ("bytelevel_json", {"tokenizer.json": "bytelevel_bpe.json"}, GPT2_SPECIALS, True),
        (
            "llama_json",
            {"tokenizer.json": "llama_bpe.json"},
            {"tokenizer_class": "LlamaTokenizer", **LLAMA_SPECIALS},
            True,
        ),
        (
            "sentencepiece_only",
            {"tokenizer.model": "sp_bpe.model"},
            {"tokenizer_class": "LlamaTokenizer", **LLAMA_SPECIALS},
            False,
        ),
    ]
    for kind, files, specials, has_json in kinds:
        for add_bos in (True, False, None):
            config = dict(specials)
            if add_bos is not None:
                config["add_bos_token"] = add_bos
            out.append(
                {
                    "name": f"{kind}-add_bos_token_{'absent' if add_bos is None else add_bos}",
                    "files": files,
                    "tokenizer_config": config,
                    "config": LLAMA_CONFIG,
                    "texts": TEXTS + (TEXTS_WHITESPACE if has_json else []),
                }
            )
    return out


def write_directory(case: dict, path: str, fixtures: str = HERE) -> None:
    """Lays out `case` (fixture files, tokenizer_config.json, config.json) in directory `path`."""
    for dst, src in case["files"].items():
        shutil.copy(os.path.join(fixtures, src), os.path.join(path, dst))
    with open(os.path.join(path, "tokenizer_config.json"), "w") as f:
        json.dump(case["tokenizer_config"], f)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(case["config"], f)


def transformers_ids(case: dict) -> dict:
    """What transformers' AutoTokenizer gives for `case`: ids with the tokenizer's own special
    tokens, and its BOS/EOS ids."""
    import transformers

    with tempfile.TemporaryDirectory() as tmp:
        write_directory(case, tmp)
        tok = transformers.AutoTokenizer.from_pretrained(tmp)
        return {
            "tokenizer_class": type(tok).__name__,
            "input_ids": [tok(t)["input_ids"] for t in case["texts"]],
            "bos_token_id": tok.bos_token_id,
            "eos_token_id": tok.eos_token_id,
        }


def main() -> None:
    import transformers

    records = [{**case, "transformers": transformers_ids(case)} for case in cases()]
    with open(os.path.join(HERE, "golden_ids.json"), "w", encoding="utf-8") as f:
        json.dump(
            {"transformers_version": transformers.__version__, "cases": records},
            f,
            ensure_ascii=False,
            indent=1,
        )
        f.write("\n")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--train", action="store_true", help="retrain the fixture tokenizers")
    args = parser.parse_args()
    if args.train:
        train()
    main()
