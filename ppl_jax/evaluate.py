"""The main job as a library call: checkpoint + corpus + settings -> metrics.

`evaluate(settings)` wires the stages together (data -> tokenizer -> windows -> scoring step ->
sums -> metrics); `score_stream` is the entry for a training loop that already holds a model and
its params on a mesh.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import Mesh

from ppl_jax import checkpoint, data, metrics, tokenizer
from ppl_jax import mesh as mesh_lib
from ppl_jax import model as model_lib
from ppl_jax.config import Settings
from ppl_jax.errors import ConfigError
from ppl_jax.model import LanguageModel
from ppl_jax.scoring import Scorer, ScoreTotals
from ppl_jax.windows import SlidingWindows, Stream, build_stream

DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}


@dataclasses.dataclass
class Evaluation:
    """The outcome of a run.

    Attributes:
      sums: the merged sufficient statistics.
      metrics: `metrics.derive(sums)`.
      totals: timings and counts from the scoring loop.
      step: the checkpoint step scored.
      stream: the token stream scored.
      mesh_shape: `{"data": ..., "model": ...}`.
      gzip_bits_per_byte: gzip -9 on the same text, or None if not asked for.
      wall_seconds: the whole run, from reading the checkpoint to the last sum.
    """

    sums: metrics.Sums
    metrics: dict[str, float]
    totals: ScoreTotals
    step: int
    stream: Stream
    mesh_shape: dict[str, int]
    model_description: dict[str, Any]
    tokenizer_name: str
    gzip_bits_per_byte: float | None
    wall_seconds: float


def check_window(seq_len: int, model: LanguageModel) -> None:
    """Raises ConfigError if `seq_len` exceeds the model's positions."""
    if seq_len > model.max_positions:
        raise ConfigError(
            f"eval.seq_len={seq_len} is beyond the model's {model.max_positions} positions; "
            f"set --config.eval.seq_len={model.max_positions} or less."
        )


def score_stream(model: LanguageModel, params: Any, mesh: Mesh, param_shardings: Any,
                 stream: Stream, seq_len: int, stride: int, batch_size: int,
                 progress: Callable[[int, int], None] | None = None,
                 scorer: Scorer | None = None) -> tuple[metrics.Sums, ScoreTotals]:
    """Scores a token stream under the `sliding` protocol.

    Args:
      model: the model interface; params must already be placed with `param_shardings`.
      stream: from `windows.build_stream`.
      seq_len, stride: window length and stride, in tokens (see `ppl_jax.windows`).
      batch_size: global windows per step, divisible by the mesh's `data` size.
      scorer: a `Scorer` to reuse (its compiled steps are cached), or None for a new one.

    Returns:
      (the sufficient statistics, the loop's totals and timings).

    Raises:
      ConfigError: bad seq_len, stride or batch size. NumericsError: NaN or infinity scored.
    """
    check_window(seq_len, model)
    data_size = mesh.shape["data"]
    if batch_size % data_size:
        raise ConfigError(
            f"eval.batch_size={batch_size} is not divisible by the mesh's data axis "
            f"({data_size}); use a multiple of {data_size}."
        )
    windows = SlidingWindows(stream.tokens, seq_len, stride)
    scorer = scorer or Scorer(model, mesh, param_shardings)
    totals = scorer.score(
        params, windows, batch_size, progress=progress,
        describe_window=lambda k: f"window {k}, "
        + stream.describe_offset(windows.window_start(k)),
    )
    sums = metrics.Sums(
        nll_sum=totals.nll_sum,
        num_tokens=totals.num_tokens,
        num_bytes=stream.num_bytes,
        num_words=stream.num_words,
        num_documents=stream.num_documents,
        num_windows=totals.num_windows,
    )
    return sums, totals


def evaluate(settings: Settings, progress_factory: Callable[[int], Any] | None = None
             ) -> Evaluation:
    """Runs the main job: restore, read, tokenize, score, reduce.

    Args:
      settings: the checked config.
      progress_factory: given the number of windows, returns a `(tokens, windows)` callback.

    Raises:
      PplJaxError subclasses for every user mistake (see `ppl_jax.errors`).
    """
    t0 = time.perf_counter()
    mesh = mesh_lib.make_mesh(settings.mesh.data, settings.mesh.model)
    step, meta = checkpoint.read_metadata(settings.checkpoint_dir, settings.checkpoint_step)
    dtype = DTYPES[settings.dtype]
    model = model_lib.build(meta["model"], dtype)
    check_window(settings.eval.seq_len, model)
    tok = tokenizer.load(settings.data.tokenizer, meta.get("tokenizer"))
    docs = data.read_documents(
        settings.data.path, settings.data.format, settings.data.errors, settings.data.jsonl_field
    )
    stream = build_stream(docs, tok, settings.data.separator, model.vocab_size)
    shardings = mesh_lib.param_shardings(
        model.abstract_params, model.logical_axes, mesh, settings.mesh.rules
    )
    target = jax.tree.map(
        lambda a, s: jax.ShapeDtypeStruct(a.shape, dtype, sharding=s),
        model.abstract_params, shardings,
    )
    params = checkpoint.restore_params(settings.checkpoint_dir, step, target)
    windows = SlidingWindows(stream.tokens, settings.eval.seq_len, settings.eval.stride)
    progress = progress_factory(windows.num_windows) if progress_factory else None
    sums, totals = score_stream(
        model, params, mesh, shardings, stream, settings.eval.seq_len, settings.eval.stride,
        settings.eval.batch_size, progress=progress,
    )
    gzip_bpb = None
    if settings.gzip_baseline:
        text = settings.data.separator.join(d.text for d in docs).encode("utf-8")
        gzip_bpb = metrics.gzip_bits_per_byte(text)
    return Evaluation(
        sums=sums,
        metrics=metrics.derive(sums),
        totals=totals,
        step=step,
        stream=stream,
        mesh_shape=dict(mesh.shape),
        model_description=model.description,
        tokenizer_name=tok.name,
        gzip_bits_per_byte=gzip_bpb,
        wall_seconds=time.perf_counter() - t0,
    )
