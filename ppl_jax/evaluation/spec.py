"""`RunSpec`: a whole run, composed of the layers' own specs, checked and frozen.

`DatasetSpec` (data), `ProtocolSpec` and `BatchSpec` (plans), `MeshSpec` (runtime) and the
checkpoint, step, diagnostics and output settings here. The command line builds a `RunSpec` from
its ConfigDict (`ppl_jax.config.settings.from_config`); nothing below the config layer sees a
ConfigDict, and nothing under `jax.jit` sees a spec.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from ppl_jax.checkpoints import DTYPES as _DTYPES
from ppl_jax.checkpoints import FORMATS as CHECKPOINT_FORMATS  # noqa: F401  (the settings' choices)
from ppl_jax.data.spec import DatasetSpec
from ppl_jax.errors import ConfigError
from ppl_jax.outputs.figures import FigureSpec
from ppl_jax.plans.spec import BatchSpec, ProtocolSpec
from ppl_jax.runtime.mesh import MeshSpec
from ppl_jax.scoring.step import StepOptions

DTYPES = tuple(_DTYPES)  # model.dtype's choices: the checkpoints' one table


@dataclasses.dataclass(frozen=True)
class StepSpec:
    """Which checkpoint steps a run scores (`checkpoint.step`, `checkpoint.watch*`).

    Attributes:
      kind: 'latest', 'one', 'all', 'list' or 'range'.
      steps: the step of 'one', the steps of 'list'; (first, last, every) of 'range'.
      watch: keep polling `checkpoint.dir` for newly finalized steps.
      watch_until: with watch, the last step to evaluate (None: the idle timeout only).
      watch_timeout, watch_interval: seconds without a new step before watch ends; seconds
        between two looks.
    """

    kind: str = "latest"
    steps: tuple[int, ...] = ()
    watch: bool = False
    watch_until: int | None = None
    watch_timeout: float = 600.0
    watch_interval: float = 10.0

    @property
    def is_sweep(self) -> bool:
        """Whether the run may score more than one step."""
        return self.kind in ("all", "list", "range") or self.watch

    def select(self, available: list[int]) -> list[int]:
        """The steps to score among the finalized `available` ones, ascending. A listed step
        that is not there is an error unless watch mode may yet see it.

        Raises:
          ConfigError: a listed step is not finalized (and no watch).
        """
        have = sorted(set(available))
        if self.kind in ("latest", "all"):
            return have if self.kind == "all" else have[-1:]
        if self.kind == "range":
            first, last, every = self.steps
            wanted = set(range(first, last + 1, every))
        else:
            wanted = set(self.steps)
        missing = sorted(wanted - set(have))
        if missing and not self.watch and self.kind != "range":
            raise ConfigError(
                f"checkpoint.step: step {missing[0]} is not a finalized step of checkpoint.dir "
                f"(it has {have[:8]}{' ...' if len(have) > 8 else ''})."
            )
        return [x for x in have if x in wanted]


@dataclasses.dataclass(frozen=True)
class ReferenceSpec:
    """The reference model of `reference.*` (KL(reference || model), `ppl_jax.metrics.divergence`)."""

    checkpoint_dir: str
    checkpoint_step: int | None  # None: the latest finalized step
    checkpoint_format: str
    dtype: str


@dataclasses.dataclass(frozen=True)
class StudySpec:
    """A quantization study (`study.*`, `ppl_jax.metrics.study`): the model under `checkpoint.*`
    is the original, and each copy (`(name, checkpoint dir)`, read in the model's dtype) is
    scored against it in the same step; `both_directions` adds KL(copy || original)."""

    copies: tuple[tuple[str, str], ...]
    both_directions: bool = False


@dataclasses.dataclass(frozen=True)
class LongContextSpec:
    """The long-context measures of a protocol that scores documents whole (`eval.short_context`,
    `eval.short_targets`, `longppl.*`; `ppl_jax.evaluation.passes.long_context`).

    Attributes:
      short_context: C, tokens of the short context: each target at position >= C is scored
        again with C to C + S - 1 tokens of context (context gain, LongPPL's key tokens).
      short_targets: S, targets per short-context window.
      alpha, beta: LongPPL's thresholds, nats (key: short - long > alpha, long < -beta).
      evaluator: the model that finds the key tokens (another checkpoint, its own tokenizer;
        tokens matched by characters), or None: the scored model, on its own tokens.
    """

    short_context: int
    short_targets: int = 1024
    alpha: float = 2.0
    beta: float = -2.0
    evaluator: ReferenceSpec | None = None

    def fingerprint_part(self) -> dict[str, Any]:
        """The settings that decide the measures' numbers (in the run's fingerprint, with the
        evaluator's identity: `ppl_jax.evaluation.run.setup.RunSetup.fingerprint`)."""
        e = self.evaluator
        return {
            "short_context": self.short_context,
            "short_targets": self.short_targets,
            "alpha": self.alpha,
            "beta": self.beta,
            "evaluator": None if e is None else {"dtype": e.dtype, "format": e.checkpoint_format},
        }


@dataclasses.dataclass(frozen=True)
class DiagnosticsSpec:
    """What a run reports beyond its sums (docs/diagnostics.md); all off by default."""

    tokens: bool = False  # tokens.parquet
    top_k: int = 0  # alternatives per token in tokens.parquet
    position_curve: bool = False  # position_curve.json / .png
    context_lengths: tuple[int, ...] = ()  # the context-length sweep
    context_targets: int = 0  # targets per window of the sweep; 0: by length (diagnostics)
    reference: ReferenceSpec | None = None
    figures: FigureSpec = FigureSpec()  # the curves' figure files (output.figures, ...)
    long_context: LongContextSpec | None = None  # context gain and LongPPL (short_context > 0)
    study: StudySpec | None = None  # copies scored against the model (study.copies)

    @property
    def any_beyond_sums(self) -> bool:
        """Whether the run gathers more than the per-window sums a journal keeps."""
        return (
            self.tokens
            or self.position_curve
            or self.reference is not None
            or self.long_context is not None
            or self.study is not None
        )


@dataclasses.dataclass(frozen=True)
class RunSpec:
    """The whole run, checked and frozen (`ppl_jax.config.settings.from_config`).

    Attributes:
      checkpoint_dir, checkpoint_format: the checkpoint (`ppl_jax.checkpoints.open_checkpoint`).
      checkpoint_step: the step of a one-step run (None: the latest finalized); `steps` says
        which steps a run scores.
      data, protocol: the first dataset and its protocol (`data.*`, `eval.*`); `suite` every
        dataset of a suite run.
      batch: the batch layout of every dataset.
      dtype ('float32' or 'bfloat16'), attention ('auto', 'xla', 'cudnn', 'tokamax', 'splash'), mesh.
      output_dir, progress, gzip_baseline, per_document, journal_every, resume: the outputs;
        sinks: the record sinks beyond results.json and results.jsonl, by name
        (`ppl_jax.outputs.sinks.SINKS`: `tensorboard`); compilation_cache_dir: JAX's
        persistent compilation cache ("": off).
      bootstrap_samples, seed: the 95% bootstrap intervals (0 samples: none).
      diagnostics: per-token output, position curve, context lengths, a reference model.
    """

    checkpoint_dir: str
    checkpoint_step: int | None  # None: the latest finalized step
    checkpoint_format: str
    data: DatasetSpec
    protocol: ProtocolSpec
    dtype: str
    attention: str
    mesh: MeshSpec
    output_dir: str
    progress: bool
    gzip_baseline: bool
    per_document: bool
    compilation_cache_dir: str
    journal_every: int  # batches between journal flushes
    resume: bool  # resume from a matching journal in output_dir
    bootstrap_samples: int = 1000  # resamples of the bootstrap intervals (0: none)
    seed: int = 0  # seed of the bootstrap's resampling
    diagnostics: DiagnosticsSpec = DiagnosticsSpec()
    steps: StepSpec = StepSpec()
    batch: BatchSpec = BatchSpec()
    # Every dataset of the run, (data, protocol) each; the first is `data`/`protocol` when no suite.
    suite: tuple[tuple[DatasetSpec, ProtocolSpec], ...] = ()
    sinks: tuple[str, ...] = ()
    # `open_checkpoint`'s keyword options (architecture, mapping, item, params, allow_download).
    checkpoint_options: tuple[tuple[str, object], ...] = ()
    rope_angles: str = "float32"  # `model.rope_angles`: `ppl_jax.models.layers.rope.ANGLES`
    # `model.matmul_precision`: `ppl_jax.scoring.precision.SETTINGS` (auto: highest in float32).
    matmul_precision: str = "auto"

    @property
    def datasets(self) -> tuple[tuple[DatasetSpec, ProtocolSpec], ...]:
        return self.suite or ((self.data, self.protocol),)

    @property
    def is_training_run(self) -> bool:
        """A run over a suite or several checkpoint steps (no diagnostics; a pair stored with the
        same fingerprint is skipped; a journal per pair). The sinks do not change it."""
        return bool(self.suite) or self.steps.is_sweep

    @property
    def by_document(self) -> bool:
        """Whether the run gathers its per-token NLLs for the long-context measures: a protocol
        that scores documents whole, with the position curve or a short context."""
        d = self.diagnostics
        return self.protocol.convention.long_context and (
            d.position_curve or d.long_context is not None
        )

    def step_options(self) -> StepOptions:
        """The run's scoring step (`ppl_jax.scoring.step.StepOptions`), the one place it is
        built: the diagnostics' statistics (the position sums, or per-token arrays for the
        token file and the long-context measures, whose position curve is then summed on the
        host by document; top-k; the reference's KL) with the mesh's context attention and
        token chunks and the matmul precision. The side passes (the context sweep, the short
        context, LongPPL's evaluator) take it with their own statistics only
        (`ppl_jax.evaluation.passes.pass_scorer`)."""
        d = self.diagnostics
        document = self.by_document
        return StepOptions(
            positions=self.protocol.seq_len + 1 if d.position_curve and not document else 0,
            per_token=d.tokens or document,
            top_k=d.top_k,
            reference=d.reference is not None,
            copies=0 if d.study is None else len(d.study.copies),
            both_directions=d.study is not None and d.study.both_directions,
            context_attention=self.mesh.context_attention,
            token_chunk=self.mesh.token_chunk,
            matmul_precision=self.matmul_precision,
        )
