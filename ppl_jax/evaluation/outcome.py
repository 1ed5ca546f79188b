"""What scoring one dataset at one checkpoint step produced (`Evaluation`), and what decides it
(`run_fingerprint`): the unit the one job path (`ppl_jax.evaluation.run`) turns into records."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh

from ppl_jax.checkpoints import Checkpoint
from ppl_jax.data import documents as data
from ppl_jax.data.spec import DatasetSpec
from ppl_jax.evaluation.spec import RunSpec
from ppl_jax.metrics import sums as metrics
from ppl_jax.models.interface import LanguageModel
from ppl_jax.outputs import journal
from ppl_jax.plans.layout import Layout
from ppl_jax.plans.protocols import Plan
from ppl_jax.plans.spec import BatchSpec, ProtocolSpec
from ppl_jax.runtime import fingerprint as fingerprint_lib
from ppl_jax.scoring.scorer import ScoreTotals
from ppl_jax.tokenizer.base import Tokenizer


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
      mesh_shape: `{"data": ..., "model": ...}`.
      gzip_bits_per_byte: gzip -9 on the same text (process 0; on its first
        `metrics.GZIP_SAMPLE_BYTES` bytes), or None if not asked for; gzip_sample_bytes: the
        bytes it compressed.
      wall_seconds: the run so far, from reading the checkpoint to this dataset's last sum.
      fingerprint: what decides the numbers (`run_fingerprint`).
      tokenizer_note: why a tokenizer that does not fit the model was allowed, or None.
      tokenizer_is_checkpoints: whether the tokenizer is the checkpoint's own.
      resumed_batches: batches taken from a journal rather than scored in this process.
      recorder: the dataset's journal (`discard()` it once the results are written).
      diagnostics: what `ppl_jax.evaluation.diagnostics.collect` found.
      dataset, protocol_spec: the dataset's specs.
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
    tokenizer_note: str | None = None
    tokenizer_is_checkpoints: bool = True
    resumed_batches: int = 0
    recorder: journal.Recorder | None = None
    diagnostics: dict[str, Any] = dataclasses.field(default_factory=dict)
    gzip_sample_bytes: int | None = None


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


def run_fingerprint(
    spec: RunSpec,
    model: LanguageModel,
    tok: Tokenizer,
    plan: Plan,
    layout: Layout,
    mesh: Mesh,
    ckpt: Checkpoint,
    step: int | None,
    attention: str,
    dataset: tuple[DatasetSpec, ProtocolSpec],
    batch: BatchSpec,
) -> dict[str, Any]:
    """The fingerprint (`ppl_jax.runtime.fingerprint.of_run`) of everything that decides the
    numbers of `dataset` scored at `step`: the checkpoint's part is what its reader names the
    weights by (`Checkpoint.identity`: a hub revision's resolved commit too, as a branch such as
    step1000 may move) and the files that hold them (`Checkpoint.files`)."""
    ds, ev = dataset
    return fingerprint_lib.of_run(
        checkpoint=ckpt.identity(step),
        checkpoint_files=ckpt.files(step),
        model={"description": model.description, "dtype": spec.dtype, "attention": attention},
        data={
            "format": ds.format,
            "jsonl_field": ds.jsonl_field,
            "errors": ds.errors,
            "separator": ds.separator,
            **({"preparation": ds.preparation} if ds.preparation else {}),
            **({"fingerprint": "content"} if ds.fingerprint == "content" else {}),
            **(
                {
                    "max_documents": ds.max_documents,
                    "max_tokens": ds.max_tokens,
                    "sample_seed": ds.sample_seed,
                }
                if ds.has_budget
                else {}
            ),
        },
        data_paths=data.resolve_paths(ds.path),
        tokenizer=tok.describe(),
        protocol={
            "name": plan.protocol,
            "seq_len": ev.seq_len,
            "stride": ev.stride,
            "add_bos": plan.add_bos,
            "prefix_id": plan.prefix_id,
            "num_windows": plan.windows.num_windows,
        },
        layout={
            "batch_size": batch.batch_size,
            "packing": batch.packing,
            "length_buckets": batch.length_buckets,
            "num_batches": layout.num_batches,
        },
        mesh={**{k: int(v) for k, v in mesh.shape.items()}, "processes": jax.process_count()},
    )
