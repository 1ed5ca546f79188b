"""The result of scoring one dataset at one checkpoint step (`Evaluation`), and its per-document
records: the unit the one job path (`ppl_jax.evaluation.run`) turns into records."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from ppl_jax.data.spec import DatasetSpec
from ppl_jax.metrics import sums as metrics
from ppl_jax.outputs import journal
from ppl_jax.plans.layout import Layout
from ppl_jax.plans.protocols import Plan
from ppl_jax.plans.spec import ProtocolSpec
from ppl_jax.scoring.scorer import ScoreTotals


@dataclasses.dataclass
class Evaluation:
    """The outcome of one dataset scored at one checkpoint step.

    Attributes:
      sums: the merged sufficient statistics.
      metrics: `metrics.derive(sums)`.
      totals: per-window sums and timings from the scoring loop.
      plan: what the protocol scored; layout: its batches.
      step: the checkpoint step scored (None for a Hugging Face directory).
      documents: per-document records (document protocols, `output.per_document`), else None.
      mesh_shape: `{"data": ..., "model": ...}`, and `"context"` where it is above 1.
      gzip_bits_per_byte: gzip -9 on the same text (process 0; on its first
        `metrics.GZIP_SAMPLE_BYTES` bytes), or None if not asked for; gzip_sample_bytes: the
        bytes it compressed.
      wall_seconds: the command line's: the run so far, from reading the checkpoint to this
        dataset's last sum; a training loop's (`ppl_jax.evaluation.hooks.DefaultPair`): this
        dataset's own, from the start of its scoring to its last sum.
      fingerprint: what decides the numbers (`RunSetup.fingerprint`).
      tokenizer_note: why a tokenizer that does not fit the model was allowed, or None.
      tokenizer_is_checkpoints: whether the tokenizer is the checkpoint's own.
      resumed_batches: batches taken from a journal rather than scored in this process.
      recorder: the dataset's journal (`discard()` it once the results are written).
      diagnostics: what `ppl_jax.evaluation.passes.diagnostics.collect` found.
      timing: the seconds of each pass of the run for this pair (`ppl_jax.evaluation.passes`:
        setup, restore, short context, LongPPL evaluator, compile, scoring, context sweep, gzip
        baseline), None for a pass that did not run.
      dataset, protocol_spec: the dataset's specs.
      attention_layers: the attention kernel each kind of attention layer ran
        (`ppl_jax.models.layers.attention.layer_kernels`: `attention`, or `chunked`, `sliding`,
        `global`), empty for a model of one's own or without attention layers.
      attention_note: which kinds of layer run the flash kernel (`xla`) on a GPU or TPU though a
        fused kernel there lacks only one thing they need, and what (`Provenance.attention_note`),
        else None.
      checkpoint_path: the checkpoint as given (`Checkpoint.path`), or None (params from a
        training loop); checkpoint_commit: a hub revision's commit, else None.
      dtype: the params' dtype; packing: `BatchSpec.packing` as set.
      bootstrap_samples, seed: the 95% intervals' resamples (0: none) and their seed.
      reference: the reference model of the divergence (`path`, `step`, `dtype`), or None.
      quantization: how the checkpoint's weights are stored quantized
        (`Checkpoint.quantization`), or None.
      matmul_precision: the precision of the step's matrix products (the scorer's resolved
        `model.matmul_precision`), or None.
    """

    sums: metrics.Sums
    metrics: metrics.Metrics
    totals: ScoreTotals
    plan: Plan
    step: int | None
    documents: list[dict[str, Any]] | None
    mesh_shape: dict[str, int]
    model_description: dict[str, Any]
    tokenizer_name: str
    checkpoint_format: str
    layout: Layout
    attention: str
    gzip_bits_per_byte: float | None
    wall_seconds: float
    dataset: DatasetSpec
    protocol_spec: ProtocolSpec
    fingerprint: dict[str, Any] = dataclasses.field(default_factory=dict)
    attention_layers: dict[str, str] = dataclasses.field(default_factory=dict)
    attention_note: str | None = None
    tokenizer_note: str | None = None
    tokenizer_is_checkpoints: bool = True
    resumed_batches: int = 0
    recorder: journal.Recorder | None = None
    diagnostics: dict[str, Any] = dataclasses.field(default_factory=dict)
    gzip_sample_bytes: int | None = None
    timing: dict[str, float | None] = dataclasses.field(default_factory=dict)
    checkpoint_path: str | None = None
    checkpoint_commit: str | None = None
    dtype: str = "float32"
    packing: bool = True
    bootstrap_samples: int = 1000
    seed: int = 0
    reference: dict[str, Any] | None = None
    quantization: dict[str, Any] | None = None
    matmul_precision: str | None = None


def per_document(plan: Plan, totals: ScoreTotals) -> list[dict[str, Any]]:
    """One record per document: `index`, `source`, `loglikelihood` (nats, summed over its scored
    tokens), `num_tokens`, `num_bytes`, `num_words`. Needs a document-level protocol."""
    doc = plan.windows.document
    n = plan.num_documents
    ll = -np.bincount(doc, weights=totals.window_nll, minlength=n)
    tokens = np.bincount(doc, weights=totals.window_tokens, minlength=n).astype(np.int64)
    return [
        {
            "index": i,
            "source": plan.sources[i],
            "loglikelihood": float(ll[i]),
            "num_tokens": int(tokens[i]),
            "num_bytes": int(plan.doc_bytes[i]),
            "num_words": int(plan.doc_words[i]),
        }
        for i in range(n)
    ]
