"""The quantization papers' perplexity (GPTQ, AWQ, ...) on one corpus: `gptq_chunks` at 2,048
tokens, 95% bootstrap intervals. The corpus file is the config argument; give the original model
and its copies (`study.copies`) to score them all in one pass, with each copy's KL to the
original, the top-1 agreement and the paired differences:

    ppl-jax --config=configs/quantization.py:/data/wikitext-2-raw/wiki.test.raw \\
        --config.checkpoint.dir=/models/llama --config.study.copies=gptq4=/models/llama-gptq

- a text file (WikiText-2's `wiki.test.raw`): its lines are the documents, joined with
  `"\\n\\n"` (GPTQ's `"\\n\\n".join(testdata["text"])` over the dataset's rows);
- a JSONL file (C4's `c4-validation.00000-of-00008.json`, or any `{"text": ...}` per line): its
  first 1,100 documents joined with `" "` (GPTQ's C4 evaluation, `" ".join(valdata[:1100]["text"])`;
  GPTQ then keeps the first 256 chunks, ppl_jax all of the joined text's).

docs/diagnostics.md (Comparing quantized copies) runs it over an original and its quantized
copies (`examples/compare_quantized.py`). ppl_jax ships neither corpus.
"""

import os

from ppl_jax.config.defaults import get_config as _default

JSONL = (".jsonl", ".json")


def get_config(path: str | None = None):
    """The default config on the corpus at `path` with GPTQ's protocol.

    Raises FileNotFoundError (printed as one paragraph) when `path` is not given or names no file.
    """
    if not path or not os.path.isfile(path):
        given = f"no such file '{path}'" if path else "no corpus file given"
        raise FileNotFoundError(
            f"configs/quantization.py: {given}; pass a text file (WikiText-2's wiki.test.raw) or "
            f"a JSONL file (C4 validation) as --config=configs/quantization.py:/path/to/file"
        )
    c = _default()
    c.data.path = path
    if path.endswith(JSONL):
        c.data.name = "c4"
        c.data.format = "jsonl"
        c.data.separator = " "
        c.data.max_documents = 1100
    else:
        c.data.name = "wikitext-2"
        c.data.format = "lines"
    c.eval.protocol = "gptq_chunks"
    c.eval.seq_len = 2048
    c.metrics.bootstrap_samples = 1000
    return c
