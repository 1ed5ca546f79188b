"""`lm_eval_rolling`: lm-evaluation-harness `loglikelihood_rolling`, per document.

`get_rolling_token_windows` with `context_len=1`, then `make_disjoint_window`: the prefix token
(BOS if the tokenizer has one, else EOS) predicts the first token; disjoint windows of `seq_len`
predictions with one token of context; the last window extended to the left to a full window.
Words are `len(re.split(r"\\s+", doc))` and bytes the document's UTF-8 length, as the harness's
wikitext task counts them.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ppl_jax.data.documents import Document
from ppl_jax.data.words import count_harness_words
from ppl_jax.errors import ConfigError, DataError
from ppl_jax.plans import stream_plans
from ppl_jax.plans import windows as windows_lib
from ppl_jax.plans.plan import Plan, check_ids
from ppl_jax.plans.protocols.base import PlanInputs, Protocol
from ppl_jax.plans.windows import Windows
from ppl_jax.tokenizer import Tokenizer


class LmEvalRolling(Protocol):
    name = "lm_eval_rolling"
    note = "lm-evaluation-harness loglikelihood_rolling, per document"
    document_level = True

    def plan(
        self,
        docs: list[Document],
        inputs: PlanInputs,
        doc_counts: tuple[np.ndarray, np.ndarray] | None = None,
    ) -> Plan:
        """`Protocol.plan`; `inputs.add_bos` places BOS before each document's tokens, as the
        harness's `tok_encode` does when the tokenizer adds BOS (the prefix token comes before
        that).

        Raises:
          ConfigError: a tokenizer that has neither BOS nor EOS.
          ValueError: `doc_counts` without one count per document.
        """
        tokenizer, vocab_size, add_bos = inputs.tokenizer, inputs.vocab_size, inputs.add_bos
        prefix = rolling_prefix(tokenizer, vocab_size)
        encoded = tokenizer.encode([d.text for d in docs])
        if add_bos:  # the harness encodes with the tokenizer's own special tokens (HFLM.tok_encode)
            encoded = [
                np.concatenate([[tokenizer.bos_id], ids]).astype(np.int32) for ids in encoded
            ]
        for d, (doc, ids) in enumerate(zip(docs, encoded, strict=True)):
            check_ids(ids, vocab_size, f"document {d} ({doc.source})", tokenizer)
        offsets = np.cumsum([0] + [ids.size for ids in encoded]).astype(np.int64)
        tokens = np.concatenate(encoded).astype(np.int32) if encoded else np.zeros(0, np.int32)
        windows = rolling_windows(tokens, offsets, inputs.seq_len, prefix)
        if doc_counts is None:
            doc_bytes = np.asarray([len(d.text.encode("utf-8")) for d in docs], np.int64)
            doc_words = np.asarray([count_harness_words(d.text) for d in docs], np.int64)
        else:
            doc_bytes, doc_words = (np.asarray(c, np.int64) for c in doc_counts)
            if doc_bytes.shape != (len(docs),) or doc_words.shape != (len(docs),):
                raise ValueError(f"doc_counts must have one count per document ({len(docs)})")
        if not windows.num_windows:
            raise DataError(f"the corpus ({len(docs)} documents) tokenizes to no tokens.")
        return Plan(
            protocol=self.name,
            windows=windows,
            num_bytes=int(doc_bytes.sum()),
            num_words=int(doc_words.sum()),
            num_documents=len(docs),
            text_tokens=int(tokens.size),
            unscored_tokens=0,
            add_bos=add_bos,
            prefix_id=int(prefix),
            doc_bytes=doc_bytes,
            doc_words=doc_words,
            sources=tuple(d.source for d in docs),
            doc_starts=offsets[:-1].astype(np.int64),
        )

    def stream_plan(self, entry: Any, inputs: PlanInputs, stream_path: str) -> Plan:
        """`Protocol.stream_plan`: the plan from the token cache's entry (`stream_plans`)."""
        tok, vocab_size, seq_len, add_bos = (
            inputs.tokenizer,
            inputs.vocab_size,
            inputs.seq_len,
            inputs.add_bos,
        )
        prefix = rolling_prefix(tok, vocab_size)
        doc_tokens = entry.doc_array("doc_tokens") + (1 if add_bos else 0)
        num_docs = doc_tokens.size
        offsets = np.concatenate([[0], np.cumsum(doc_tokens)]).astype(np.int64)
        n = int(offsets[-1])
        stream = stream_plans.Stream(stream_path, n)
        # With BOS, before every document (a separator before the first too); else the parts' ids.
        bos = (np.asarray([tok.bos_id], np.int32), np.zeros(1, np.int32)) if add_bos else None
        for ids, _ in stream_plans.segments(entry, bos, (vocab_size, tok), before_first=True):
            stream.write(ids)
        digest = stream.close()
        tokens = np.load(stream_path, mmap_mode="r")
        windows = rolling_windows(tokens, offsets, seq_len, prefix)
        if not windows.num_windows:
            raise DataError(f"the corpus ({num_docs} documents) tokenizes to no tokens.")
        doc_bytes = entry.doc_array("doc_bytes")
        doc_words = entry.doc_array("doc_harness_words")
        return Plan(
            protocol=self.name,
            windows=windows,
            num_bytes=int(doc_bytes.sum()),
            num_words=int(doc_words.sum()),
            num_documents=num_docs,
            text_tokens=n,
            unscored_tokens=0,
            add_bos=add_bos,
            prefix_id=int(prefix),
            doc_bytes=doc_bytes,
            doc_words=doc_words,
            sources=entry.sources,
            doc_starts=offsets[:-1],
            tokens_digest=digest,
        )


LM_EVAL_ROLLING = LmEvalRolling()


def rolling_prefix(tokenizer: Tokenizer, vocab_size: int) -> int:
    """lm_eval_rolling's prefix token: BOS if the tokenizer has one, else EOS.

    Raises:
      ConfigError: the tokenizer has neither; DataError: it is outside the vocabulary.
    """
    prefix = tokenizer.bos_id if tokenizer.bos_id is not None else tokenizer.eos_id
    if prefix is None:
        raise ConfigError(
            f"eval.protocol=lm_eval_rolling needs a BOS or EOS token to predict each document's "
            f"first token, and the tokenizer ({tokenizer.name}) has neither."
        )
    check_ids(np.asarray([prefix]), vocab_size, "the prefix (BOS/EOS) token", tokenizer)
    return int(prefix)


def rolling_windows(tokens: np.ndarray, offsets: np.ndarray, seq_len: int, prefix: int) -> Windows:
    """lm_eval_rolling's windows over documents `tokens[offsets[d]:offsets[d + 1]]`, from their
    lengths alone (see the module docstring)."""
    starts, lengths, first, pre, document = [], [], [], [], []
    for d in range(offsets.size - 1):
        n, base = int(offsets[d + 1] - offsets[d]), int(offsets[d])
        if n == 0:
            continue
        # First window: [prefix] + t[:m-1] predicts t[:m], m = min(seq_len, n).
        m = min(seq_len, n)
        starts.append(base)
        lengths.append(m)
        first.append(1)
        pre.append(prefix)
        document.append(d)
        predicted = m
        while predicted < n:
            k = min(n - predicted, seq_len)  # predictions of this window
            end = predicted + k
            # context t[end-seq_len-1 : end-k] (disjoint part), continuation t[end-k : end]
            lo = end - seq_len - 1
            starts.append(base + lo)
            lengths.append(end - lo)
            first.append(end - k - lo)
            pre.append(windows_lib.NO_PREFIX)
            document.append(d)
            predicted = end
    return windows_lib.make(tokens, starts, lengths, first, seq_len, prefix=pre, document=document)
