"""Live comparison with transformers' `AutoTokenizer.from_pretrained(dir)` of the installed
transformers: for each directory layout of tests/golden/make_tokenizer_golden.py (byte-level BPE
tokenizer.json, Llama tokenizer.json with a BOS post-processor, SentencePiece only; each with
`add_bos_token` true / false / absent), ppl_jax's ids with its BOS policy, BOS and EOS ids equal
transformers' own. Also pins the one known difference (SentencePiece-only directories, runs of
spaces)."""

import importlib.util
import json
import os
import shutil

import pytest
import transformers

from ppl_jax.checkpoints.formats import safetensors

import helpers

GOLDEN_DIR = os.path.join(helpers.REPO, "tests", "golden")
FIXTURES = os.path.join(GOLDEN_DIR, "tokenizers")
_spec = importlib.util.spec_from_file_location(
    "make_tokenizer_golden", os.path.join(GOLDEN_DIR, "make_tokenizer_golden.py")
)
golden = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(golden)


@pytest.mark.parametrize("case", golden.cases(), ids=lambda c: c["name"])
def test_ids_and_specials_match_autotokenizer(tmp_path, case):
    golden.write_directory(case, str(tmp_path))
    theirs = transformers.AutoTokenizer.from_pretrained(str(tmp_path))
    ours = safetensors.read_tokenizer(str(tmp_path))
    bos = [ours.bos_id] if ours.add_bos_default else []
    for text in case["texts"]:
        assert bos + ours.encode([text])[0].tolist() == theirs(text)["input_ids"], text
    assert (ours.bos_id, ours.eos_id) == (theirs.bos_token_id, theirs.eos_token_id)


def test_sentencepiece_only_runs_of_spaces_differ(tmp_path):
    """transformers 5 turns a SentencePiece-only Llama directory into a `tokenizers` BPE that
    splits runs of spaces differently from the sentencepiece library, which ppl_jax follows. If
    this fails, transformers changed: compare again and update the README."""
    import sentencepiece

    case = next(c for c in golden.cases() if c["name"].startswith("sentencepiece_only"))
    golden.write_directory(case, str(tmp_path))
    theirs = transformers.AutoTokenizer.from_pretrained(str(tmp_path))
    sp = sentencepiece.SentencePieceProcessor(model_file=os.path.join(FIXTURES, "sp_bpe.model"))
    ours = safetensors.read_tokenizer(str(tmp_path))
    text = "   naïve be"
    assert ours.encode([text])[0].tolist() == sp.encode(text)
    assert theirs(text, add_special_tokens=False)["input_ids"] != sp.encode(text)


def test_golden_ids_are_current(tmp_path):
    """The committed golden ids are what this transformers gives (else rerun the script)."""
    with open(os.path.join(FIXTURES, "golden_ids.json"), encoding="utf-8") as f:
        recorded = json.load(f)
    for case in recorded["cases"]:
        fresh = golden.transformers_ids({k: v for k, v in case.items() if k != "transformers"})
        assert fresh == case["transformers"], (case["name"], transformers.__version__)
    shutil.rmtree(tmp_path)
