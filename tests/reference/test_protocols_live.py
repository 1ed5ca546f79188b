"""tests/unit/plans/test_protocols.py's lm_eval_rolling windows against lm-evaluation-harness itself, live."""

import pytest

from ppl_jax.plans.protocols import PlanInputs, get

import recipes
from test_protocols import DOC_LENGTHS, SEQ_LENS, FakeTokenizer, docs_of, rows_as_lists


@pytest.mark.parametrize("seq_len", SEQ_LENS)
@pytest.mark.parametrize("add_bos", [False, True])
def test_lm_eval_rolling_matches_the_harness_windows_live(seq_len, add_bos):
    tok = FakeTokenizer(add_bos_default=add_bos)
    docs = docs_of(DOC_LENGTHS)
    p = get("lm_eval_rolling").plan(docs, PlanInputs(tok, 258, seq_len, seq_len, add_bos))
    expected = [
        tuple(window)
        for d in docs
        for window in recipes.rolling_windows(
            ([256] if add_bos else []) + list(d.text.encode()), 256, seq_len
        )
    ]
    # HFLM scores the last len(continuation) logits of (context + continuation)[:-1].
    assert rows_as_lists(p.windows) == expected
    assert p.prefix_id == 256
