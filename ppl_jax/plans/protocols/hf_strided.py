"""`hf_strided`: the Hugging Face transformers guide "Perplexity of fixed-length models".

Documents joined with "\\n\\n" and tokenized as one string; windows of `seq_len` tokens begin
every `stride` tokens; inside each window the labels of tokens already scored are -100. Counted
tokens are the labels actually scored (not the guide's `trg_len` approximation).
"""

from __future__ import annotations

import numpy as np

from ppl_jax.errors import DataError
from ppl_jax.plans import windows as windows_lib
from ppl_jax.plans.protocols.stream import StreamProtocol
from ppl_jax.plans.windows import Windows


class HfStrided(StreamProtocol):
    name = "hf_strided"
    note = "Hugging Face 'Perplexity of fixed-length models' strided recipe"
    strided = True
    published_loop = True

    def check_length(self, n: int, num_docs: int, seq_len: int) -> None:
        if n < 2:
            raise DataError(f"the corpus tokenizes to {n} token(s); nothing to score.")

    def windows(self, tokens: np.ndarray, seq_len: int, stride: int | None) -> Windows:
        """The loop of the Hugging Face guide, recording each window instead of running it."""
        n = tokens.size
        starts, lengths, first = [], [], []
        prev_end = 0
        for begin in range(0, n, stride):
            end = min(begin + seq_len, n)
            trg_len = end - prev_end  # may differ from stride on the last loop
            width = end - begin
            f = max(1, width - trg_len)  # labels[:, :-trg_len] = -100, and the model shifts by one
            if f < width:
                starts.append(begin)
                lengths.append(width)
                first.append(f)
            prev_end = end
            if end == n:
                break
        return windows_lib.make(tokens, starts, lengths, first, seq_len)


HF_STRIDED = HfStrided()
