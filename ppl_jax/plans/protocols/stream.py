"""`StreamProtocol`: the protocols that join the corpus into one token stream and cut windows
from it (`sliding`, `hf_strided`, `gptq_chunks`); each says how the stream is made (`encode`)
and how windows are cut (`windows`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ppl_jax.data.documents import Document
from ppl_jax.plans.plan import Plan, check_ids, join_ids, span_words, window_spans
from ppl_jax.plans.protocols.base import PlanInputs, Protocol
from ppl_jax.plans.windows import Windows


class StreamProtocol(Protocol):
    """A protocol over one stream: the documents joined (`encode`), an optional BOS first, and
    windows cut from it (`windows`). Bytes are those of the scored tokens; words those of the
    text from the first to the last scored token."""

    def encode(
        self, docs: list[Document], inputs: PlanInputs
    ) -> tuple[str, list[np.ndarray], list[np.ndarray], list[int]]:
        """`(joined text, id parts, byte-length parts, each document's first token)`: by
        default the documents joined by `between(separator)` and tokenized as one string (the
        Hugging Face guide's and GPTQ's recipes).

        Raises:
          DataError: an id outside the vocabulary.
        """
        joiner = self.between(inputs.separator)
        texts = [d.text for d in docs]
        text = joiner.join(texts)
        tok = inputs.tokenizer
        ids, nbytes = tok.encode_with_bytes([text])[0]
        shown = joiner.encode("unicode_escape").decode()
        where = f"the corpus joined with '{shown}' ({len(docs)} documents)"
        check_ids(ids, inputs.vocab_size, where, tok)
        step = len(joiner.encode("utf-8"))
        starts_chars = np.cumsum([0] + [len(t.encode()) + step for t in texts[:-1]])
        doc_starts = list(
            np.searchsorted(np.cumsum(nbytes, dtype=np.int64), starts_chars, side="right")
        )
        return text, [ids], [nbytes], doc_starts

    def check_length(self, n: int, num_docs: int, seq_len: int) -> None:
        """Raises DataError when a stream of `n` tokens (BOS included) has nothing to score."""
        raise NotImplementedError

    def windows(self, tokens: np.ndarray, seq_len: int, stride: int | None) -> Windows:
        """The protocol's windows over the stream `tokens` (`[N] int32`)."""
        raise NotImplementedError

    def plan(self, docs: list[Document], inputs: PlanInputs, doc_counts: Any = None) -> Plan:
        self._no_counts(doc_counts)
        bos = [inputs.tokenizer.bos_id] if inputs.add_bos else []
        text, ids_parts, byte_parts, doc_starts = self.encode(docs, inputs)
        # Bounded memory for long corpora: int32 arrays, and no copy where one part suffices.
        text_ids = join_ids([np.zeros(0, np.int32), *ids_parts])
        token_bytes = join_ids([np.zeros(0, np.int32), *byte_parts])
        tokens = join_ids([np.asarray(bos, np.int32), text_ids])
        byte_lens = join_ids([np.zeros(len(bos), np.int32), token_bytes])
        self.check_length(tokens.size, len(docs), inputs.seq_len)
        windows = self.windows(tokens, inputs.seq_len, inputs.stride)
        scored = windows.scored_token_mask()
        return Plan(
            protocol=self.name,
            windows=windows,
            num_bytes=int(byte_lens[scored].sum()),
            num_words=span_words(text.encode("utf-8"), byte_lens, scored),
            num_documents=len(docs),
            text_tokens=int(text_ids.size),
            unscored_tokens=int(text_ids.size - scored[len(bos) :].sum()),
            add_bos=bool(bos),
            prefix_id=None,
            doc_bytes=None,
            doc_words=None,
            sources=tuple(d.source for d in docs),
            doc_starts=np.asarray(doc_starts, np.int64) + len(bos),
            window_bytes=window_spans(
                byte_lens, windows.starts + windows.first_scored, windows.starts + windows.lengths
            ),
        )
