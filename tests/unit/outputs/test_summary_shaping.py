"""The summary names what shaped the numbers: a preparation and a document budget (issue 19)."""

from __future__ import annotations

from test_diagnostics import run, settings

from ppl_jax.evaluation import summary
from ppl_jax.outputs import console

import helpers


def test_the_budget_is_in_results_and_in_the_table(tiny_checkpoint, tmp_path):
    texts = [helpers.stdlib_text(400)[i * 100 : (i + 1) * 100] for i in range(4)]
    corpus = helpers.corpus_files(tmp_path, texts)
    s = settings(
        tiny_checkpoint, corpus, tmp_path / "out", data__max_documents=2, data__sample_seed=7
    )
    ev = run(s)
    results = summary.results_dict(ev, {})
    assert results["num_documents"] == 2
    assert results["data"]["budget"] == {"max_documents": 2, "max_tokens": 0, "sample_seed": 7}
    assert results["data"]["preparation"] is None
    table = console.summary_table(results)
    assert "budget" in table and "at most 2 documents, a sample drawn with seed 7" in table
    assert "preparation" not in table


def test_no_budget_no_row(tiny_checkpoint, tmp_path):
    corpus = helpers.corpus_files(tmp_path, [helpers.stdlib_text(300)])
    s = settings(tiny_checkpoint, corpus, tmp_path / "out")
    results = summary.results_dict(run(s), {})
    assert results["data"]["budget"] is None
    assert "budget" not in console.summary_table(results)
    assert ", xla attention" in console.summary_table(results)
    # `auto` with different kernels on different kinds of layer (Llama 4 on a TPU): each named.
    results.update(attention="auto", attention_layers={"chunked": "xla", "global": "splash"})
    assert ", auto (chunked: xla, global: splash) attention" in console.summary_table(results)
    assert results["attention_note"] is None and "attention note" not in console.summary_table(
        results
    )
    results["attention_note"] = "chunked layers run the flash kernel (xla), slower: splash ..."
    assert "attention note" in console.summary_table(results)
    assert "chunked layers run the flash kernel (xla), slower" in console.summary_table(results)


def test_budget_text():
    assert console.budget_text({"max_documents": 0, "max_tokens": 5000, "sample_seed": -1}) == (
        "5,000 tokens, the last document cut to fit, the first in file order"
    )
    assert console.budget_text({"max_documents": 1, "max_tokens": 0, "sample_seed": -1}) == (
        "at most 1 document, the first in file order"
    )
