"""`Protocol`: the rules of one scoring convention, asked by every caller instead of its name."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np

from ppl_jax.data.documents import Document
from ppl_jax.plans.plan import Plan
from ppl_jax.tokenizer import Tokenizer

JOIN = "\n\n"  # how hf_strided and gptq_chunks join documents (their reference recipes' choice)


@dataclasses.dataclass(frozen=True)
class PlanInputs:
    """What a protocol plans a corpus with, beyond the corpus: built once per dataset
    (`ppl_jax.plans.planner.inputs`, from its `DatasetSpec`, `ProtocolSpec`, tokenizer and the
    model's vocabulary).

    Attributes:
      tokenizer: the model's tokenizer (special tokens are never added by encoding; BOS and the
        prefix token are placed by the protocol).
      vocab_size: the model's vocabulary; every token id is checked against it.
      seq_len: the model inputs per window.
      stride: for the strided protocols (`Protocol.strided`; else None).
      add_bos: BOS before the stream, or before each document's tokens (the document-level
        protocols), resolved (`ppl_jax.plans.plan.resolve_add_bos`).
      separator: `data.separator` (only the protocols that join by it read it: `between`).
      options: the protocol's own keywords (`ProtocolSpec.options`: `long_documents`).
    """

    tokenizer: Tokenizer
    vocab_size: int
    seq_len: int
    stride: int | None = None
    add_bos: bool = False
    separator: str = JOIN
    options: Mapping[str, str] = dataclasses.field(default_factory=dict)


class Protocol:
    """A scoring convention: which tokens are scored, with what context, and what is counted.

    One instance per convention (`ppl_jax.plans.protocols.PROTOCOLS`); callers ask it rather
    than compare names.

    Attributes:
      name: its `eval.protocol` value.
      note: one line naming the convention it reproduces (`--help`, results.json's
        `protocol.reference`).
      document_level: every window lies in one document, so that sums per document exist
        (`output.per_document`, the bootstrap over documents) and no stream runs through the
        corpus (the context-length sweep needs one: it is refused with these).
      strided: it reads `eval.stride` (unset: `seq_len // 2`).
      splits_documents: it reads `eval.long_documents`, the rule for a document longer than a
        window (`PlanInputs.options["long_documents"]`; the other protocols never receive it).
      published_loop: its reference publishes its own loop, which the run reproduces beside
        the exact numbers (`hf_strided`: the Hugging Face guide's; `ppl_jax.metrics.published`,
        results.json's `protocol.published`).
      long_context: it scores documents whole from their first token, so that a target's
        position is its place in its document: the long-context measures apply (the position
        curve to the full length with bands over documents, context gains, LongPPL:
        `ppl_jax.evaluation.passes.long_context`).
      stream_plan: `stream_plan(entry, inputs, path) -> Plan` (a `PlanInputs`; the token stream
        written to the `.npy` file `path`) where the protocol can be planned from the token
        cache's document lengths in bounded memory (`ppl_jax.plans.token_cache`), identical
        array for array to `plan`; None where it cannot (its documents are not tokenized one by
        one).
    """

    name: ClassVar[str] = ""
    note: ClassVar[str] = ""
    document_level: ClassVar[bool] = False
    strided: ClassVar[bool] = False
    splits_documents: ClassVar[bool] = False
    long_context: ClassVar[bool] = False
    published_loop: ClassVar[bool] = False
    stream_plan: Any = None

    def joiner(self, ds: Any) -> str:
        """The text between two documents where the protocol joins a corpus into one text (for
        the gzip baseline and results.json's `protocol.separator`), for the dataset `ds`
        (`ppl_jax.data.spec.DatasetSpec`)."""
        return self.between(ds.separator)

    def between(self, separator: str) -> str:
        """The joining text given `data.separator`: the reference recipes' `"\\n\\n"`, unless
        the protocol joins by `data.separator` (`sliding`)."""
        return JOIN

    def plan(
        self,
        docs: list[Document],
        inputs: PlanInputs,
        doc_counts: tuple[np.ndarray, np.ndarray] | None = None,
    ) -> Plan:
        """Builds the windows and counts of the protocol for `docs`.

        Args:
          docs: the corpus.
          inputs: the tokenizer, vocabulary, window and BOS settings (`PlanInputs`).
          doc_counts: `([num_documents] int64, [num_documents] int64)`: UTF-8 bytes and words
            to report per document in place of those of its text (`lm_eval_rolling` only), for
            a preparation that scores a rewritten text and counts the original
            (`preparations.Prepared.doc_counts`).

        Raises:
          DataError: an id outside the vocabulary (naming the document), or nothing to score.
          ConfigError: a setting the protocol cannot follow with this tokenizer.
          ValueError: `doc_counts` with a protocol that does not report them (a bug of the
            caller: `preparations.check` rejects such a configuration first).
        """
        raise NotImplementedError

    def _no_counts(self, doc_counts: Any) -> None:
        if doc_counts is not None:
            raise ValueError(
                f"doc_counts are per document: only lm_eval_rolling reports them, not {self.name}"
            )

    def __repr__(self) -> str:
        return f"<protocol {self.name}>"
