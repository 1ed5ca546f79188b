"""Each protocol's windows against its reference recipe, token for token (no model needed)."""

import json
import os

import numpy as np
import pytest

from ppl_jax.data.documents import Document
from ppl_jax.errors import ConfigError, DataError
from ppl_jax.plans.protocols import PlanInputs, get, resolve_add_bos
from ppl_jax.plans.windows import NO_PREFIX
from ppl_jax.tokenizer import ByteTokenizer

import helpers


class FakeTokenizer(ByteTokenizer):
    """Bytes, plus BOS 256 / EOS 257 (vocabulary 258), with a configurable BOS policy."""

    vocab_size = 258
    bos_id = 256
    eos_id = 257

    def __init__(self, add_bos_default=False, bos=True):
        self.add_bos_default = add_bos_default
        if not bos:
            self.bos_id = None


def rows_as_lists(windows):
    """(row tokens, scored targets) per window, read back from the batch rows."""
    rows = windows.rows(np.arange(windows.num_windows))
    out = []
    for k in range(windows.num_windows):
        n = int(rows["segment_ids"][k].sum())
        tokens = rows["tokens"][k, :n].tolist()
        scored = rows["tokens"][k][rows["target_mask"][k]].tolist()
        out.append((tokens, scored))
    return out


DOC_LENGTHS = [1, 5, 15, 16, 17, 40, 55]


def docs_of(lengths, seed=0):
    rng = np.random.default_rng(seed)
    return [
        Document("".join(chr(c) for c in rng.integers(97, 123, size=n)), f"d{i}")
        for i, n in enumerate(lengths)
    ]


SEQ_LENS = [1, 4, 16]


@pytest.mark.parametrize("seq_len", SEQ_LENS)
@pytest.mark.parametrize("add_bos", [False, True])
def test_lm_eval_rolling_matches_the_harness_windows(seq_len, add_bos):
    """Against lm-evaluation-harness's `get_rolling_token_windows` + `make_disjoint_window`,
    stored by tests/golden/make_golden.py (tests/reference/ runs the harness live)."""
    with open(os.path.join(helpers.GOLDEN, "lm_eval_windows.json"), encoding="utf-8") as f:
        golden = json.load(f)
    tok = FakeTokenizer(add_bos_default=add_bos)
    docs = docs_of(DOC_LENGTHS)
    assert [d.text for d in docs] == golden["documents"]
    p = get("lm_eval_rolling").plan(docs, PlanInputs(tok, 258, seq_len, seq_len, add_bos))
    # HFLM scores the last len(continuation) logits of (context + continuation)[:-1].
    expected = [tuple(w) for doc in golden["windows"][f"{seq_len}-{add_bos}"] for w in doc]
    assert rows_as_lists(p.windows) == expected
    assert p.prefix_id == 256
    assert p.windows.num_scored().sum() == sum(DOC_LENGTHS) + add_bos * len(DOC_LENGTHS)
    # Documents of different lengths share batches; each window knows its document.
    assert sorted(set(p.windows.document.tolist())) == list(range(len(docs)))
    # Counts as the harness's wikitext task makes them.
    assert p.doc_bytes.tolist() == DOC_LENGTHS
    assert p.doc_words.tolist() == [1] * len(DOC_LENGTHS)


def test_lm_eval_rolling_prefix_is_eos_without_bos():
    p = get("lm_eval_rolling").plan(
        docs_of([3]), PlanInputs(FakeTokenizer(bos=False), 258, 8, 8, False)
    )
    assert p.prefix_id == 257 and p.windows.prefix[0] == 257


def test_lm_eval_rolling_needs_bos_or_eos():
    with pytest.raises(ConfigError, match="needs a BOS or EOS token"):
        get("lm_eval_rolling").plan(docs_of([3]), PlanInputs(ByteTokenizer(), 256, 8, 8, False))


def test_lm_eval_words_follow_re_split():
    docs = [Document("  two words \n", "a"), Document("one", "b")]
    p = get("lm_eval_rolling").plan(docs, PlanInputs(FakeTokenizer(), 258, 8, 8, False))
    assert p.doc_words.tolist() == [4, 1]  # ['', 'two', 'words', ''] as re.split gives
    assert p.num_bytes == len("  two words \n") + 3


def hf_guide(ids, max_length, stride):
    """The Hugging Face guide's loop, transcribed: (input_ids, scored labels) per window."""
    out = []
    seq_len = len(ids)
    prev_end_loc = 0
    for begin_loc in range(0, seq_len, stride):
        end_loc = min(begin_loc + max_length, seq_len)
        trg_len = end_loc - prev_end_loc
        input_ids = ids[begin_loc:end_loc]
        target_ids = list(input_ids)
        for i in range(len(target_ids) - trg_len):
            target_ids[i] = -100
        labels = [t for t in target_ids[1:] if t != -100]  # the model shifts labels by one
        if labels:
            out.append((input_ids, labels))
        prev_end_loc = end_loc
        if end_loc == seq_len:
            break
    return out


@pytest.mark.parametrize("seq_len,stride", [(16, 16), (16, 8), (16, 5), (16, 1), (7, 3)])
@pytest.mark.parametrize("add_bos", [False, True])
def test_hf_strided_matches_the_guide(seq_len, stride, add_bos):
    docs = docs_of([30, 0, 41, 9])
    p = get("hf_strided").plan(docs, PlanInputs(FakeTokenizer(), 258, seq_len, stride, add_bos))
    ids = ([256] if add_bos else []) + list("\n\n".join(d.text for d in docs).encode())
    expected = hf_guide(ids, seq_len, stride)
    assert rows_as_lists(p.windows) == expected
    scored = sum(len(labels) for _, labels in expected)
    assert p.windows.num_scored().sum() == scored
    assert p.unscored_tokens == len(ids) - add_bos - scored
    if stride == seq_len:  # the guide leaves each window's first token unscored
        assert p.unscored_tokens == p.windows.num_windows - add_bos


@pytest.mark.parametrize("seq_len", [4, 16, 32])
def test_gptq_chunks_match_the_recipe(seq_len):
    docs = docs_of([30, 12, 41])
    p = get("gptq_chunks").plan(docs, PlanInputs(FakeTokenizer(), 258, seq_len, seq_len, False))
    ids = list("\n\n".join(d.text for d in docs).encode())
    nsamples = len(ids) // seq_len
    expected = [
        (ids[i * seq_len : (i + 1) * seq_len], ids[i * seq_len + 1 : (i + 1) * seq_len])
        for i in range(nsamples)
    ]
    assert rows_as_lists(p.windows) == expected
    assert p.unscored_tokens == len(ids) - nsamples * (seq_len - 1)
    assert (p.windows.prefix == NO_PREFIX).all()


def test_gptq_needs_one_chunk():
    with pytest.raises(DataError, match="fewer than one chunk"):
        get("gptq_chunks").plan(docs_of([5]), PlanInputs(FakeTokenizer(), 258, 16, 16, False))


def test_sliding_with_bos_scores_every_text_token():
    docs = docs_of([10, 20])
    p = get("sliding").plan(docs, PlanInputs(FakeTokenizer(), 258, 8, 4, True))
    text = "\n\n".join(d.text for d in docs).encode()
    assert p.windows.tokens[0] == 256
    assert p.windows.num_scored().sum() == len(text)
    assert p.unscored_tokens == 0
    assert p.num_bytes == len(text)  # BOS has no bytes, every text byte is scored


def test_stream_protocol_bytes_are_those_of_scored_tokens():
    docs = docs_of([33, 20])
    p = get("gptq_chunks").plan(docs, PlanInputs(FakeTokenizer(), 258, 8, 8, False))
    n = len("\n\n".join(d.text for d in docs))  # 55 bytes -> 6 chunks, 7 scored each
    assert p.num_bytes == (n // 8) * 7


def test_resolve_add_bos():
    assert resolve_add_bos("auto", FakeTokenizer(add_bos_default=True)) is True
    assert resolve_add_bos("auto", FakeTokenizer(add_bos_default=False)) is False
    assert resolve_add_bos("true", FakeTokenizer()) is True
    assert resolve_add_bos("false", FakeTokenizer(add_bos_default=True)) is False
    with pytest.raises(ConfigError, match="has no BOS token"):
        resolve_add_bos("true", ByteTokenizer())


def test_unknown_protocol():
    with pytest.raises(ConfigError, match="not one of sliding, hf_strided"):
        get("nope")
