"""Writes the golden files of the default test suite by running the real references.

    pip install torch==2.13.0 '.[reference]'   # the CPU build of PyTorch first
    python tests/golden/make_golden.py          # rebuilds the models, then the reference numbers
    python tests/golden/make_golden.py --numbers-only   # keeps the committed models

What it writes under tests/golden/ (all of it committed, about 1 MB):

- `hf/{llama,mistral,qwen2,gpt2}/`: tiny random transformers models (seed 0) as `save_pretrained`
  writes them: Llama with llama3 rope scaling in sharded safetensors, Mistral with a sliding window
  of 8, Qwen2 with tied embeddings and q/k/v biases, GPT-2 with `scale_attn_by_inverse_layer_idx`.
  `hf/log_probs.json`: 41 random token ids and PyTorch's log-probabilities of the last 40 under
  each model (tests/unit/checkpoints/test_hf.py).
- `references/{gpt2,llama}/`: a tiny GPT-2 (no BOS; EOT is the harness's prefix) and a tiny Llama
  (BOS `<s>` prepended by the tokenizer), each with its tokenizer: a byte-level BPE of 512 ids
  trained with `tokenizers` on standard-library source (`helpers.train_bpe`).
  `references/references.json`: the documents, and per case the token ids, per-window NLL sums and
  target counts of the Hugging Face guide's strided loop, the GPTQ loop and the plain sliding
  loop, and lm-evaluation-harness's `loglikelihood_rolling` with the wikitext task's counts and
  aggregations (tests/unit/evaluation/test_references.py).
- `lm_eval_windows.json`: lm-evaluation-harness's rolling windows of the byte documents of
  tests/unit/plans/test_protocols.py.

`tests/reference/test_golden_current.py` recomputes the numbers from the committed models with
the installed references and compares them with these files.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
TESTS = os.path.dirname(HERE)
sys.path[:0] = [TESTS, os.path.join(TESTS, "reference")]

import helpers  # noqa: E402
import recipes  # noqa: E402

HF_DIR = os.path.join(HERE, "hf")
REF_DIR = os.path.join(HERE, "references")
REF_FAMILIES = ("gpt2", "llama")
TOKENIZER_VOCAB = 512


def write_models(golden: str = HERE) -> None:
    """The tiny models and the tokenizer (random: run once, then commit)."""
    hf_dir, ref_dir = os.path.join(golden, "hf"), os.path.join(golden, "references")
    for root in (hf_dir, ref_dir):
        shutil.rmtree(root, ignore_errors=True)
        os.makedirs(root)
    for name in recipes.HF_FAMILIES:
        recipes.save_hf_family(name, os.path.join(hf_dir, name))
    with tempfile.TemporaryDirectory() as tmp:
        tokenizer_json = os.path.join(tmp, "tokenizer.json")
        helpers.train_bpe(
            [helpers.stdlib_text(200_000), recipes.PARAGRAPH, *recipes.STREAM_TEXTS],
            TOKENIZER_VOCAB,
        ).save(tokenizer_json)
        for name in REF_FAMILIES:
            recipes.save_reference_family(name, os.path.join(ref_dir, name), tokenizer_json)


def hf_numbers(hf_dir: str = HF_DIR) -> dict:
    """PyTorch's log-probabilities of `recipes.hf_tokens()` under each committed HF model."""
    tokens = recipes.hf_tokens()
    return {
        "generated_with": recipes.versions(),
        "tokens": tokens.tolist(),
        "log_probs": {
            name: recipes.torch_log_probs(
                recipes.load_model(os.path.join(hf_dir, name)), tokens
            ).tolist()
            for name in recipes.HF_FAMILIES
        },
    }


def reference_numbers(ref_dir: str = REF_DIR) -> dict:
    """Every protocol's reference run on the committed protocol families."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny forwards: a thread pool only slows them down
    try:
        fams = {n: recipes.Family(n, os.path.join(ref_dir, n)) for n in REF_FAMILIES}
        stream, lines = recipes.STREAM_TEXTS, recipes.lines_texts()
        rolling = recipes.rolling_texts(fams["gpt2"].encode)
        out = {
            "generated_with": recipes.versions(),
            "stream_texts": stream,
            "lines_texts": lines,
            "rolling_texts": rolling,
            "bos": {n: f.bos for n, f in fams.items()},
            "eot": fams["gpt2"].tokenizer.convert_tokens_to_ids(helpers.EOT),
            "hf_strided": [
                {"family": f, "max_length": m, "stride": s}
                | recipes.hf_guide(fams[f], stream, m, s).to_json()
                for f, m, s in recipes.HF_STRIDED_CASES
            ],
            "gptq_chunks": [
                {"family": f, "seqlen": n} | recipes.gptq_recipe(fams[f], stream, n).to_json()
                for f, n in recipes.GPTQ_CASES
            ],
            "sliding": [
                {"family": f, "format": fmt, "seq_len": n, "stride": s, "separator": sep}
                | recipes.sliding_reference(
                    fams[f], stream if fmt == "jsonl" else lines, sep, n, s
                ).to_json()
                for f, fmt, n, s, sep in recipes.SLIDING_CASES
            ],
            "lm_eval_rolling": {
                n: recipes.harness(fam, rolling, recipes.L) for n, fam in fams.items()
            },
        }
    finally:
        torch.set_num_threads(threads)
    return out


def window_numbers() -> dict:
    """lm-evaluation-harness's rolling windows of tests/unit/plans/test_protocols.py's byte documents (BOS
    256, the prefix with or without it), per `{seq_len}-{add_bos}`."""
    from test_protocols import DOC_LENGTHS, SEQ_LENS, docs_of

    docs = [d.text for d in docs_of(DOC_LENGTHS)]
    cases = {}
    for seq_len in SEQ_LENS:
        for add_bos in (False, True):
            cases[f"{seq_len}-{add_bos}"] = [
                recipes.rolling_windows(([256] if add_bos else []) + list(t.encode()), 256, seq_len)
                for t in docs
            ]
    return {"generated_with": recipes.versions(), "documents": docs, "windows": cases}


def numbers() -> dict[str, dict]:
    """File name under tests/golden/ -> its contents, computed from the committed models."""
    return {
        "hf/log_probs.json": hf_numbers(),
        "references/references.json": reference_numbers(),
        "lm_eval_windows.json": window_numbers(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--numbers-only", action="store_true", help="keep the committed models and tokenizer"
    )
    args = parser.parse_args()
    if not args.numbers_only:
        write_models()
    for name, contents in numbers().items():
        with open(os.path.join(HERE, name), "w", encoding="utf-8") as f:
            json.dump(contents, f, indent=1, ensure_ascii=False)
            f.write("\n")
    total = 0
    for root, _, files in os.walk(HERE):
        total += sum(os.path.getsize(os.path.join(root, f)) for f in files)
    print(f"tests/golden: {total / 1e6:.2f} MB")


if __name__ == "__main__":
    main()
