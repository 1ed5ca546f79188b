"""Writes tests/golden/longppl/: LongPPL as its reference implementation computes it, on two tiny
random Llama models with their own tokenizers, for tests/unit/evaluation/test_longppl_golden.py.

    /work/sidevenv/longppl/bin/python tests/golden/make_longppl_golden.py

The reference is the `longppl` package 0.3.0 from PyPI, whose `longppl/longppl.py` is the file of
the repository PKU-ML/LongPPL at commit 1decd2a (identical, byte for byte); it runs in a virtual
environment of its own, never in ppl_jax's, made with

    python3.11 -m venv /work/sidevenv/longppl
    /work/sidevenv/longppl/bin/pip install torch==2.13.0+cpu transformers==4.46.3 numpy
    /work/sidevenv/longppl/bin/pip install --no-deps longppl==0.3.0

Nothing of the reference's code is in this repository: this script imports it, runs it, and
writes its numbers. What is written:

- `model/` and `evaluator/`: Hugging Face directories (config.json, model.safetensors,
  tokenizer.json, tokenizer_config.json) of two tiny `LlamaForCausalLM`s with random weights
  (seeds 0 and 1), each with its own BPE tokenizer trained here: the model's byte-level (no BOS,
  offsets trimmed of their spaces, as GPT-2's processor can), the evaluator's Metaspace with a
  `<s>` its post-processor adds (as Llama 2's), so that key tokens cross tokenizers by
  character offsets, and the evaluator reads each document after a BOS.
- `documents.jsonl`: the documents (Python standard library sources, and one with non-ASCII).
- `golden.json`: per scenario (`self`: the model is its own evaluator; `evaluator`: the other
  model finds the key tokens) the reference's `compute_longppl` output for each document
  (`longppl`, `n_key_token`, `ppl`, `n_token`), its key spans (`find_key_token`'s merged
  character intervals) and key tokens (`cal_overlap`'s loss indices), and the aggregate of
  `perplexity/perplexity.py` (`exp(sum log(LongPPL_d) n_d / sum n_d)`); with the thresholds
  alpha and beta chosen in gaps of the tokens' values (the smallest distance of a token's
  long-short difference from alpha, and of its long loss from -beta, is recorded: the float32
  noise between two implementations, about 1e-6, cannot move a token across).

The models are random with larger weights than an initialisation (`initializer_range` 0.2), so
that their predictions depend on the context enough for some tokens to pass the thresholds.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import sysconfig

import longppl
import numpy as np
import torch
import transformers
from longppl import longppl as reference
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "longppl")
TRUNC_LEN, SLIDING_WINDOW = 32, 16  # the reference's trunc_len and sliding_window, scaled down
SOURCES = ["textwrap.py", "heapq.py", "bisect.py", "colorsys.py"]
UNICODE = (
    "Ünïcode café — naïve façade: “quotes” and 🎉 emoji, ß, ø, 日本語 text. "
    "Les élèves étudient; die Größe ändert sich. "
) * 4


def documents() -> list[str]:
    lib = sysconfig.get_paths()["stdlib"]
    texts = []
    for i, name in enumerate(SOURCES):
        with open(os.path.join(lib, name), encoding="utf-8") as f:
            text = f.read()
        texts.append(text[200 * i : 200 * i + 500 + 150 * i])
    texts.insert(2, UNICODE)
    return texts


def byte_level_tokenizer(corpus: list[str]) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=True)
    trainer = trainers.BpeTrainer(
        vocab_size=320,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(corpus, trainer)
    return tok


def metaspace_tokenizer(corpus: list[str]) -> Tokenizer:
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<unk>", "<s>", "</s>"])
    tok.train_from_iterator(corpus, trainer)
    bos = tok.token_to_id("<s>")
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", bos)]
    )
    return tok


def save(folder: str, tok: Tokenizer, specials: dict[str, str], seed: int) -> None:
    os.makedirs(folder)
    tok.save(os.path.join(folder, "tokenizer.json"))
    with open(os.path.join(folder, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "PreTrainedTokenizerFast", **specials}, f, indent=1)
    torch.manual_seed(seed)
    config = transformers.LlamaConfig(
        vocab_size=tok.get_vocab_size(),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        rope_theta=10000.0,
        initializer_range=0.2,
        tie_word_embeddings=False,
        attn_implementation="eager",
        torch_dtype="float32",
    )
    model = transformers.LlamaForCausalLM(config).eval()
    model.save_pretrained(folder, safe_serialization=True)


def load(folder: str):
    model = transformers.AutoModelForCausalLM.from_pretrained(
        folder, torch_dtype=torch.float32, attn_implementation="eager"
    ).eval()
    return model, transformers.AutoTokenizer.from_pretrained(folder)


def differences(text: str, model, tok) -> tuple[np.ndarray, np.ndarray]:
    """The evaluator's (loss_short - loss_full, loss_full) of every token `find_key_token`
    compares, by the same windows (restated here only to choose thresholds away from them)."""
    ids = tok(text, return_tensors="pt")["input_ids"]
    n = ids.shape[1]
    loss = torch.nn.CrossEntropyLoss(reduction="none")
    with torch.no_grad():
        full = model(ids).logits[0]
        diff, long = [], []
        for s in range(0, n - TRUNC_LEN, SLIDING_WINDOW):
            e = min(s + TRUNC_LEN + SLIDING_WINDOW, n)
            short = model(ids[:, s:e]).logits[0]
            lf = loss(full[s + TRUNC_LEN - 1 : e - 1], ids[0, s + TRUNC_LEN : e])
            ls = loss(short[TRUNC_LEN - 1 : e - s - 1], ids[0, s + TRUNC_LEN : e])
            diff.append((ls - lf).numpy())
            long.append(lf.numpy())
    return np.concatenate(diff), np.concatenate(long)


def in_gap(values: np.ndarray, quantile: float) -> tuple[float, float]:
    """A threshold in the widest gap between sorted values near `quantile`, and its margin."""
    v = np.sort(values.astype(np.float64))
    lo = int(len(v) * (quantile - 0.05))
    hi = int(len(v) * (quantile + 0.05))
    gaps = np.diff(v[lo : hi + 1])
    j = lo + int(np.argmax(gaps))
    return float(round((v[j] + v[j + 1]) / 2, 6)), float(gaps.max() / 2)


def scenario(texts: list[str], model, tok, evaluator, etok) -> dict:
    diff, long = zip(*(differences(t, evaluator, etok) for t in texts), strict=True)
    diff, long = np.concatenate(diff), np.concatenate(long)
    alpha, alpha_margin = in_gap(diff, 0.9)
    negative_beta, beta_margin = in_gap(long, 0.75)
    beta = -negative_beta
    docs, longppls, counts, ppls, tokens = [], [], [], [], []
    for text in texts:
        with torch.no_grad():
            out = reference.compute_longppl(
                text, model, evaluator, tok, etok, None, TRUNC_LEN, SLIDING_WINDOW, alpha, beta
            )
            spans = reference.find_key_token(
                text, evaluator, etok, TRUNC_LEN, SLIDING_WINDOW, None, alpha, beta
            )
        offsets = tok(text, add_special_tokens=False, return_offsets_mapping=True)
        keys = reference.cal_overlap(offsets["offset_mapping"], spans)
        docs.append(
            {
                "longppl": None if out["longppl"] is None else float(out["longppl"]),
                "n_key_token": out["n_key_token"],
                "ppl": float(out["ppl"]),
                "n_token": int(out["n_token"]),
                "key_spans": np.asarray(spans).tolist(),
                "key_loss_indices": [int(k) for k in keys],
            }
        )
        if out["longppl"] is not None:
            longppls.append(out["longppl"])
            counts.append(out["n_key_token"])
        ppls.append(out["ppl"])
        tokens.append(out["n_token"])
    # perplexity/perplexity.py's aggregation, as written there
    agg = np.exp((np.log(np.stack(longppls)) * np.stack(counts)).sum() / np.stack(counts).sum())
    ppl = np.exp((np.log(np.stack(ppls)) * np.stack(tokens)).sum() / np.stack(tokens).sum())
    return {
        "alpha": alpha,
        "beta": beta,
        "alpha_margin": alpha_margin,
        "beta_margin": beta_margin,
        "longppl": float(agg),
        "ppl": float(ppl),
        "num_key_tokens": int(sum(counts)),
        "documents": docs,
    }


def avoid_one_target_windows(texts: list[str], tokenizers: list[Tokenizer]) -> list[str]:
    """Each text shortened (by its last characters) until no tokenizer gives it a length n with
    `(n - trunc_len) % sliding_window == 1`: the reference's last short window then holds one
    target, whose `.squeeze()`d comparison is a 0-d tensor that `find_key_token` cannot iterate
    (a TypeError; ppl_jax scores such a document)."""
    out = []
    for text in texts:
        while any((len(t.encode(text).ids) - TRUNC_LEN) % SLIDING_WINDOW == 1 for t in tokenizers):
            text = text[:-1]
        out.append(text)
    return out


def main() -> None:
    texts = documents()
    corpus = texts + [t[:4000] for t in documents()] * 3
    if os.path.isdir(OUT):
        shutil.rmtree(OUT)
    os.makedirs(OUT)
    tok_model, tok_evaluator = byte_level_tokenizer(corpus), metaspace_tokenizer(corpus)
    texts = avoid_one_target_windows(texts, [tok_model, tok_evaluator])
    save(os.path.join(OUT, "model"), tok_model, {"eos_token": "<|endoftext|>"}, 0)
    specials = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}
    save(os.path.join(OUT, "evaluator"), tok_evaluator, specials, 1)
    with open(os.path.join(OUT, "documents.jsonl"), "w", encoding="utf-8") as f:
        f.writelines(json.dumps({"text": t}, ensure_ascii=False) + "\n" for t in texts)
    model, tok = load(os.path.join(OUT, "model"))
    evaluator, etok = load(os.path.join(OUT, "evaluator"))
    golden = {
        "generated_with": {
            "longppl": getattr(longppl, "__version__", "0.3.0 (PyPI; PKU-ML/LongPPL 1decd2a)"),
            "transformers": transformers.__version__,
            "torch": torch.__version__,
            "python": sys.version.split()[0],
        },
        "trunc_len": TRUNC_LEN,
        "sliding_window": SLIDING_WINDOW,
        "scenarios": {
            "self": scenario(texts, model, tok, model, tok),
            "evaluator": scenario(texts, model, tok, evaluator, etok),
        },
    }
    with open(os.path.join(OUT, "golden.json"), "w", encoding="utf-8") as f:
        json.dump(golden, f, indent=1)
    for name, s in golden["scenarios"].items():
        print(
            f"{name}: LongPPL {s['longppl']:.6f} over {s['num_key_tokens']} key tokens, "
            f"alpha {s['alpha']} (margin {s['alpha_margin']:.2e}), beta {s['beta']} "
            f"(margin {s['beta_margin']:.2e})"
        )


if __name__ == "__main__":
    main()
