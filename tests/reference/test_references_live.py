"""tests/unit/evaluation/test_references.py's comparisons, live: the references run in PyTorch and
lm-evaluation-harness on tiny models saved by the installed transformers, with a byte-level BPE
trained at test time, then ppl_jax on the same directories."""

from __future__ import annotations

import pytest
import torch

import recipes
import test_references as golden


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread():
    """PyTorch on one thread while this module runs: its default pool fights XLA's CPU threads
    for the cores and makes each tiny forward a hundred times slower."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def families(tmp_path_factory, bpe_tokenizer) -> dict[str, recipes.Family]:
    root = tmp_path_factory.mktemp("references")
    out = {}
    for name in ("gpt2", "llama"):
        recipes.save_reference_family(name, str(root / name), bpe_tokenizer)
        out[name] = recipes.Family(name, str(root / name))
    # The BOS policies the two families are here to cover.
    eot = out["gpt2"].tokenizer.convert_tokens_to_ids("<|endoftext|>")
    assert out["gpt2"].tokenizer("a b").input_ids == out["gpt2"].encode("a b")
    assert out["llama"].bos == [len(out["llama"].tokenizer) - 1] and eot == 0
    assert out["llama"].tokenizer("a b").input_ids == out["llama"].bos + out["llama"].encode("a b")
    return out


@pytest.fixture(scope="module")
def stream_corpus(tmp_path_factory) -> dict:
    return golden.write_stream_corpus(tmp_path_factory.mktemp("stream"), recipes.STREAM_TEXTS)


@pytest.mark.parametrize("family,max_length,stride", recipes.HF_STRIDED_CASES)
def test_hf_strided_matches_the_hf_guide_live(families, stream_corpus, family, max_length, stride):
    fam = families[family]
    ref = recipes.hf_guide(fam, recipes.STREAM_TEXTS, max_length, stride).to_json()
    golden.check_hf_strided(fam.path, stream_corpus, ref, fam.bos, max_length, stride)


@pytest.mark.parametrize("family,max_length,stride", recipes.HF_STRIDED_CASES)
def test_hf_strided_reports_the_guides_loop_as_published_live(
    families, stream_corpus, family, max_length, stride
):
    fam = families[family]
    expected = recipes.hf_guide_as_published(fam, recipes.STREAM_TEXTS, max_length, stride)
    _, results = golden.run(
        fam.path, "hf_strided", stream_corpus["jsonl"], seq_len=max_length, stride=stride
    )
    found = results["protocol"]["published"]["perplexity"]
    assert golden.rel(found, expected) < 1e-5  # the loop runs in float32
    if stride < max_length:  # the exact count is another number
        assert golden.rel(results["perplexity"], expected) > 1e-7


@pytest.mark.parametrize("family,seqlen", recipes.GPTQ_CASES)
def test_gptq_chunks_match_the_gptq_recipe_live(families, stream_corpus, family, seqlen):
    fam = families[family]
    ref = recipes.gptq_recipe(fam, recipes.STREAM_TEXTS, seqlen).to_json()
    golden.check_gptq_chunks(fam.path, stream_corpus, ref, fam.bos, seqlen)


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_lm_eval_rolling_matches_the_harness_live(families, tmp_path, family):
    fam = families[family]
    texts = recipes.rolling_texts(families["gpt2"].encode)
    path = golden.write_jsonl(tmp_path / "docs.jsonl", texts)
    ref = recipes.harness(fam, texts, recipes.L)
    eot = fam.tokenizer.convert_tokens_to_ids("<|endoftext|>")
    golden.check_lm_eval_rolling(fam.path, path, texts, ref, fam.bos, eot, tmp_path)


@pytest.mark.parametrize("family,fmt,seq_len,stride,separator", recipes.SLIDING_CASES)
def test_sliding_matches_its_reference_live(
    families, stream_corpus, family, fmt, seq_len, stride, separator
):
    fam = families[family]
    texts = stream_corpus[f"{fmt}_texts"]
    ref = recipes.sliding_reference(fam, texts, separator, seq_len, stride).to_json()
    golden.check_sliding(fam.path, stream_corpus, ref, fam.bos, fmt, seq_len, stride, separator)
