"""whole_documents: each document one window from its first token to its last; a longer one
refused in one sentence, or cut by the rule the user names (no model needed)."""

import numpy as np
import pytest

from ppl_jax.data.documents import Document
from ppl_jax.errors import ConfigError, DataError
from ppl_jax.plans import protocols
from ppl_jax.plans import windows as windows_lib
from ppl_jax.plans.spec import ProtocolSpec

from test_protocols import FakeTokenizer, docs_of, rows_as_lists

LENGTHS = [1, 5, 15, 16, 17, 40, 55, 0]


def whole(docs, seq_len, add_bos, rule="", stride=None):
    tok = FakeTokenizer()
    options = {"long_documents": rule} if rule else {}
    inputs = protocols.PlanInputs(tok, tok.vocab_size, seq_len, stride, add_bos, options=options)
    return protocols.WHOLE_DOCUMENTS.plan(docs, inputs)


@pytest.mark.parametrize("add_bos", [False, True])
def test_each_document_is_one_window_from_its_first_token(add_bos):
    docs = docs_of(LENGTHS)
    p = whole(docs, 64, add_bos)
    bos = [256] if add_bos else []
    want = [
        (bos + list(d.text.encode()), list(d.text.encode())[0 if add_bos else 1 :])
        for d in docs
        if len(bos) + len(d.text) >= 2
    ]
    assert rows_as_lists(p.windows) == want
    kept = [i for i, d in enumerate(docs) if len(bos) + len(d.text) >= 2]
    assert p.windows.document.tolist() == kept
    # Every token scored, but the first of each document without BOS; bytes are the scored ones.
    first = 0 if add_bos else sum(1 for d in docs if d.text)
    assert p.unscored_tokens == first and p.text_tokens == sum(LENGTHS)
    assert p.doc_bytes.tolist() == [max(0, len(d.text) - (0 if add_bos else 1)) for d in docs]
    assert p.num_bytes == int(p.doc_bytes.sum()) and p.per_document
    # the words of the scored text: without BOS, those after the first token (its first letter)
    words = [len(d.text[0 if add_bos else 1 :].split()) for d in docs]
    assert p.doc_words.tolist() == words and p.num_words == sum(words)
    # A token's position in its window is its index in the document (plus one with BOS).
    assert (p.windows.starts == p.doc_starts[p.windows.document]).all()


def test_without_bos_the_words_after_each_first_token_are_counted():
    """English text without BOS (issue 39, item 14): word perplexity was undefined (no words);
    the words are those of the text after each document's context-only first token (a byte
    here; "Ü" is two bytes, and the half left is dropped as str.split of a decode does)."""
    docs = [Document(t, f"d{i}") for i, t in enumerate(TEXTS)]
    p = whole(docs, 64, False)
    assert p.doc_words.tolist() == [3, 2, 0, 0, 1, 4] and p.num_words == 10
    assert whole(docs, 64, True).doc_words.tolist() == [len(t.split()) for t in TEXTS]


TEXTS = ["The cat sat.", " leading space", "x", "", "a b", "Ünïcode is two bytes"]


def test_a_document_longer_than_a_window_is_refused_naming_it():
    docs = docs_of(LENGTHS)
    with pytest.raises(DataError) as e:
        whole(docs, 16, True)
    message = str(e.value)
    # document 3 holds 16 letters, 17 tokens with BOS: it fits; document 4 (17 letters) does not
    assert message.startswith("document 4 (d4) has 18 tokens, more than one window")
    assert "3 document(s)" in message and "eval.long_documents=sliding" in message
    assert "truncate" in message and "eval.seq_len" in message


@pytest.mark.parametrize("seq_len, stride", [(16, 8), (16, 16), (7, 3), (1, 1)])
def test_sliding_cuts_a_long_document_as_windows_sliding_does(seq_len, stride):
    docs = docs_of(LENGTHS)
    p = whole(docs, seq_len, True, "sliding", stride)
    for d, doc in enumerate(docs):
        ids = np.asarray([256, *doc.text.encode()], np.int32)
        mine = p.windows.document == d
        if ids.size < 2:
            assert not mine.any()
            continue
        if ids.size <= seq_len + 1:
            want = windows_lib.make(ids, [0], [ids.size], [1], seq_len)
        else:
            want = windows_lib.sliding(ids, seq_len, stride)
        np.testing.assert_array_equal(p.windows.starts[mine] - p.doc_starts[d], want.starts)
        np.testing.assert_array_equal(p.windows.lengths[mine], want.lengths)
        np.testing.assert_array_equal(p.windows.first_scored[mine], want.first_scored)
    # every token after BOS is scored exactly once
    assert p.unscored_tokens == 0
    assert p.num_bytes == sum(LENGTHS)


def test_truncate_scores_the_first_window_and_counts_the_rest():
    docs = docs_of(LENGTHS)
    p = whole(docs, 16, False, "truncate")
    assert p.windows.lengths.max() == 17
    cut = sum(max(0, n - 17) for n in LENGTHS)
    assert p.unscored_tokens == cut + sum(1 for n in LENGTHS if n)
    assert p.doc_bytes.tolist() == [max(0, min(n, 17) - 1) for n in LENGTHS]
    assert p.num_words == 0  # the words of a cut text are not counted
    assert whole(docs, 16, True, "sliding", 8).num_words == sum(len(d.text.split()) for d in docs)


def test_nothing_to_score_is_one_sentence():
    with pytest.raises(DataError, match="no document of two tokens or more"):
        whole([Document("a", "x"), Document("", "y")], 16, False)


def test_the_rule_is_checked_with_the_protocol():
    assert ProtocolSpec("whole_documents", 16).stride is None  # no stride used
    assert ProtocolSpec("whole_documents", 16, long_documents="sliding").stride == 8
    assert ProtocolSpec("whole_documents", 16, 4, long_documents="sliding").stride == 4
    assert ProtocolSpec("whole_documents", 16, long_documents="truncate").options == {
        "long_documents": "truncate"
    }
    assert ProtocolSpec("sliding", 16).options == {}
    with pytest.raises(ConfigError, match="long_documents='cut' is not one of sliding, truncate"):
        ProtocolSpec("whole_documents", 16, long_documents="cut")
    with pytest.raises(ConfigError, match="sliding cuts its own windows"):
        ProtocolSpec("sliding", 16, long_documents="sliding")
    rules = protocols.get("whole_documents")
    assert rules.document_level and rules.splits_documents and not rules.strided


def reference_short_windows(ids: list[int], trunc_len: int, sliding_window: int):
    """The LongPPL reference's short windows (`find_key_token`), restated: (row, targets)."""
    out, max_len = [], len(ids)
    for start in range(0, max_len - trunc_len, sliding_window):
        if start + trunc_len + sliding_window > max_len:
            sliding_window = max_len - start - trunc_len
        row = ids[start : start + trunc_len + sliding_window]
        out.append((row, row[trunc_len:]))
    return out


@pytest.mark.parametrize("add_bos", [False, True])
@pytest.mark.parametrize("c, s", [(4, 3), (8, 8), (1, 1), (15, 100)])
def test_short_windows_are_the_longppl_references(add_bos, c, s):
    docs = docs_of(LENGTHS)
    p = whole(docs, 64, add_bos)
    got = rows_as_lists(windows_lib.short_windows(p.windows, c, s))
    bos = [256] if add_bos else []
    want = []
    for d in docs:
        ids = bos + list(d.text.encode())
        if len(ids) >= 2:
            want += reference_short_windows(ids, c, s)
    assert got == want
    # every target at position >= C is scored again, once
    short = windows_lib.short_windows(p.windows, c, s)
    assert int(short.num_scored().sum()) == sum(max(0, n + len(bos) - max(c, 1)) for n in LENGTHS)


def test_short_windows_of_split_documents_stay_in_their_window():
    docs = docs_of([55])
    p = whole(docs, 16, True, "sliding", 8)  # windows read from 8 tokens before their targets
    short = windows_lib.short_windows(p.windows, 4, 3)
    scored = short.scored_token_mask()
    assert (scored == p.windows.scored_token_mask() & (np.arange(56) >= 4)).all()
    for k in range(short.num_windows):  # a short window lies inside a window of the run
        lo, hi = short.starts[k], short.starts[k] + short.lengths[k]
        assert ((p.windows.starts <= lo) & (hi <= p.windows.starts + p.windows.lengths)).any()
