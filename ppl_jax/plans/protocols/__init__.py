"""Named evaluation protocols: which tokens are scored, with what context, and what is counted.

Each protocol is one object (`Protocol`, one module each) that owns its rules: its name and
note, whether it is document-level and strided, which text joins the documents (`joiner`), its
plan from documents (`plan(docs, inputs)`) and from the token cache (`stream_plan(entry, inputs,
path)`, or None), both given the dataset's `PlanInputs` (built once by the planner). `PROTOCOLS` maps
each name to its object; callers ask the object (`spec.convention.document_level`), never
compare names, so that a new protocol is one module here and one line in `PROTOCOLS`.

Every protocol turns documents into `Windows` plus the counts its convention reports, and every
protocol's windows are scored the same way (batched, padded, masked); they differ only in slicing:

- `sliding` (native default): documents tokenized one by one and joined by the tokens of
  `data.separator` into one stream, with an optional BOS first; see `windows.sliding`. Every token
  after the first (every token, with BOS) is scored once.
- `hf_strided`: the Hugging Face transformers guide "Perplexity of fixed-length models": documents
  joined with "\\n\\n" and tokenized as one string; windows of `seq_len` tokens begin every
  `stride` tokens; inside each window the labels of tokens already scored are -100. Counted tokens
  are the labels actually scored (not the guide's `trg_len` approximation).
- `lm_eval_rolling`: lm-evaluation-harness `loglikelihood_rolling` (`get_rolling_token_windows`
  with `context_len=1`, then `make_disjoint_window`), per document: the prefix token (BOS if the
  tokenizer has one, else EOS) predicts the first token; disjoint windows of `seq_len`
  predictions with one token of context; the last window extended to the left to a full window.
  Words are `len(re.split(r"\\s+", doc))` and bytes the document's UTF-8 length, as the harness's
  wikitext task counts them.
- `gptq_chunks`: the GPTQ/AWQ evaluation: documents joined with "\\n\\n", tokenized as one string,
  cut into `n // seq_len` chunks (the tail dropped), each scored from its second token.
- `whole_documents`: each document in one window from its first token to its last (long
  context); a longer document by the rule `eval.long_documents` names, never silently.

Bytes are those of the scored tokens (per-token UTF-8 lengths from the tokenizer) except for
`lm_eval_rolling`, which follows the harness. Words are those of the text from the first to the
last scored token (for `sliding` and `lm_eval_rolling` exactly the scored text).
"""

from __future__ import annotations

from ppl_jax.data.words import count_harness_words  # noqa: F401  (the harness's word count)
from ppl_jax.errors import ConfigError
from ppl_jax.plans.plan import (  # noqa: F401  (a plan's types and helpers, with the protocols)
    Plan,
    check_ids,
    plan_digest,
    resolve_add_bos,
    tokens_digest,
    window_spans,
)
from ppl_jax.plans.protocols.base import JOIN, PlanInputs, Protocol  # noqa: F401
from ppl_jax.plans.protocols.gptq_chunks import GPTQ_CHUNKS
from ppl_jax.plans.protocols.hf_strided import HF_STRIDED
from ppl_jax.plans.protocols.lm_eval_rolling import (  # noqa: F401
    LM_EVAL_ROLLING,
    rolling_prefix,
    rolling_windows,
)
from ppl_jax.plans.protocols.sliding import SLIDING
from ppl_jax.plans.protocols.whole_documents import WHOLE_DOCUMENTS

PROTOCOLS: dict[str, Protocol] = {
    p.name: p for p in (SLIDING, HF_STRIDED, LM_EVAL_ROLLING, GPTQ_CHUNKS, WHOLE_DOCUMENTS)
}


def get(name: str, where: str = "eval") -> Protocol:
    """The protocol named `name`.

    Raises:
      ConfigError: no protocol has that name (`where.protocol=...`, listing the names).
    """
    found = PROTOCOLS.get(str(name))
    if found is None:
        raise ConfigError(f"{where}.protocol={name!r} is not one of {', '.join(PROTOCOLS)}.")
    return found
