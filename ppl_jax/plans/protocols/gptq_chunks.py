"""`gptq_chunks`: the GPTQ/AWQ evaluation: documents joined with "\\n\\n", tokenized as one
string, cut into `n // seq_len` chunks (the tail dropped), each scored from its second token.
"""

from __future__ import annotations

import numpy as np

from ppl_jax.errors import DataError
from ppl_jax.plans import windows as windows_lib
from ppl_jax.plans.protocols.stream import StreamProtocol
from ppl_jax.plans.windows import Windows


class GptqChunks(StreamProtocol):
    name = "gptq_chunks"
    note = "GPTQ/AWQ: n // seq_len disjoint chunks, tail dropped"

    def check_length(self, n: int, num_docs: int, seq_len: int) -> None:
        if n < seq_len:
            raise DataError(
                f"gptq_chunks: the corpus has {n} tokens, fewer than one chunk of "
                f"eval.seq_len={seq_len}; use a shorter seq_len or more text."
            )

    def windows(self, tokens: np.ndarray, seq_len: int, stride: int | None = None) -> Windows:
        count = tokens.size // seq_len
        return windows_lib.make(
            tokens, np.arange(count) * seq_len, np.full(count, seq_len), np.ones(count), seq_len
        )


GPTQ_CHUNKS = GptqChunks()
