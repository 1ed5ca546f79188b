"""Everything a run builds before any weight is read (`set_up(spec, out) -> RunSetup`), in the
order that reports a user's mistake soonest: settings, mesh, the corpora's files, the
architecture, the tokenizer, the plans, the diagnostics, the reference model, the processes'
agreement on the plans; and what decides each pair's numbers (`RunSetup.fingerprint`)."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import jax
from jax.experimental.compilation_cache import compilation_cache

from ppl_jax import tokenizer
from ppl_jax.checkpoints import DTYPES, Checkpoint, architecture, open_checkpoint
from ppl_jax.data import documents as data
from ppl_jax.errors import ConfigError, settings_named
from ppl_jax.evaluation.checks import check_batch_size, check_context, check_window
from ppl_jax.evaluation.evaluator import Evaluator
from ppl_jax.evaluation.passes import diagnostics
from ppl_jax.evaluation.spec import RunSpec
from ppl_jax.models import registry
from ppl_jax.models.interface import LanguageModel
from ppl_jax.outputs import sinks
from ppl_jax.outputs.folder import OutputDir
from ppl_jax.plans import planner, protocols
from ppl_jax.plans.planner import Dataset
from ppl_jax.runtime import distributed
from ppl_jax.runtime import fingerprint as fingerprint_lib
from ppl_jax.runtime import mesh as mesh_lib


@dataclasses.dataclass(frozen=True)
class Reference:
    """The reference model of `reference.*` (KL(reference || model)), opened and checked, no
    weights read: its `checkpoint` and `step`, its `model`, and the `target` tree of
    `jax.ShapeDtypeStruct`s (with `shardings`) its params are restored into."""

    checkpoint: Checkpoint
    step: int | None
    model: LanguageModel
    target: Any
    shardings: Any
    setting: str = "reference.checkpoint"  # the settings an error names

    def restore(self) -> Any:
        """The reference's params, on the mesh."""
        with settings_named(self.setting):
            return self.checkpoint.restore(self.step, self.target)


@dataclasses.dataclass
class RunSetup:
    """What a run builds before any weight is read (`set_up`).

    Attributes:
      attention: the attention implementation the model runs (recorded in the fingerprint and
        the results; the model's `honours_segments` already says what it means for packing).
      evaluator: the run's `Evaluator` over `datasets` (not compiled yet), which scores every
        step (`ppl_jax.evaluation.run`).
    """

    spec: RunSpec
    mesh: Any
    ckpt: Checkpoint
    first_step: int | None
    model: LanguageModel
    attention: str
    tok: tokenizer.Tokenizer
    tokenizer_note: str | None
    datasets: list[Dataset]
    documents: dict[str, Any]  # dataset name -> documents read while planning (gzip baseline)
    target: Any
    shardings: Any
    reference: Reference | None
    evaluator: Evaluator
    long_context: Any = None  # LongPPL's evaluator (`long_context.KeyEvaluator`), if named
    copies: dict[str, Reference] = dataclasses.field(default_factory=dict)  # a study's, by name

    def fingerprint(self, d: Dataset, step: int | None) -> dict[str, Any]:
        """What decides the numbers of dataset `d` scored at `step`: the evaluator's
        (`Evaluator.fingerprint`), with the long-context measures' part."""
        return self.evaluator.fingerprint(d, step, self.long_context_part())

    def long_context_part(self) -> dict[str, Any]:
        """The long-context measures' settings (`LongContextSpec.fingerprint_part`) and their
        LongPPL evaluator's identity (its checkpoint, model, tokenizer), under `long_context`;
        empty without them (the fingerprints of other runs as before)."""
        lc = self.spec.diagnostics.long_context
        if lc is None:
            return {}
        part = lc.fingerprint_part()
        e = self.long_context
        if e is not None:
            part["evaluator"] = {
                **part["evaluator"],
                "checkpoint": e.ckpt.identity(e.step),
                "model": fingerprint_lib.text_digest(e.model.description),
                "tokenizer": fingerprint_lib.text_digest(e.tokenizer.describe()),
            }
        return {"long_context": part}


def check(spec: RunSpec, ckpt: Checkpoint) -> None:
    """Refuses what a training run does not do (before anything is read).

    Raises:
      ConfigError: diagnostics, per-document output or a reference model with a sweep or a
        suite; a sweep over a checkpoint of one set of weights;
        per-document output of a protocol whose windows span documents.
      CheckpointError: as `Checkpoint.resolve_step` (a sweep over a checkpoint without steps).
    """
    d = spec.diagnostics
    if spec.is_training_run and (
        d.tokens
        or d.position_curve
        or d.context_lengths
        or d.reference
        or d.long_context
        or d.study
        or spec.per_document
    ):
        raise ConfigError(
            "output.tokens, output.position_curve, eval.context_lengths, eval.short_context, "
            "reference.*, study.copies and output.per_document score one checkpoint step on one "
            "dataset; run them without suite, a step sweep or checkpoint.watch."
        )
    if spec.steps.is_sweep and not ckpt.steps() and ckpt.resolve_step(None) is None:
        raise ConfigError(
            f"checkpoint.step={spec.steps.kind} needs a checkpoint of several steps; "
            f"{ckpt.path!r} is {ckpt.layout_name} (one set of weights)."
        )
    if spec.per_document and not spec.protocol.convention.document_level:
        levels = [name for name, p in protocols.PROTOCOLS.items() if p.document_level]
        raise ConfigError(
            f"output.per_document=true needs a document-level protocol ({', '.join(levels)}); "
            f"the windows of {spec.protocol.name} span documents."
        )


def set_up(spec: RunSpec, out: OutputDir | None) -> RunSetup:
    """Every step of a run that needs no weights, in the order that reports a user's mistake
    soonest: settings, mesh, the corpora's files, the architecture, the tokenizer, the plans,
    the diagnostics, the reference model, the processes' agreement on the plans."""
    _use_compilation_cache(spec.compilation_cache_dir)
    ckpt = open_checkpoint(
        spec.checkpoint_dir, spec.checkpoint_format, **dict(spec.checkpoint_options)
    )
    check(spec, ckpt)
    sinks.check(spec.sinks, out)
    mesh = mesh_lib.make_mesh(spec.mesh.data, spec.mesh.model, context=spec.mesh.context)
    check_batch_size(spec.batch.batch_size, mesh)
    raw = _read_corpora(spec)
    first_step = _first_step(spec, ckpt)
    model, attention = _model(spec, ckpt, first_step, mesh)
    tok, note = ckpt.tokenizer_for(
        spec.data.tokenizer, spec.data.allow_tokenizer_mismatch, step=first_step, model=model
    )
    datasets, documents = _plan(spec, raw, tok, model, mesh)
    key_eval = None
    if not spec.is_training_run:
        first = datasets[0]
        key_eval = diagnostics.check(spec, first.plan, model, mesh, documents[first.name], tok)
    reference = None
    if spec.diagnostics.reference is not None:
        reference = _reference(spec, model, mesh, tok)
    copies = {}
    for name, path in spec.diagnostics.study.copies if spec.diagnostics.study else ():
        copies[name] = _copy(spec, name, path, model, mesh, tok)
    for d in datasets:
        distributed.check_same_plan(
            protocols.plan_digest(d.plan, spec.batch.batch_size),
            f"dataset {d.name!r}" if spec.suite else f"data {d.name!r}",
        )
    target, shardings = mesh_lib.param_targets(
        model.abstract_params, model.logical_axes, mesh, spec.mesh.rules, DTYPES[spec.dtype]
    )
    evaluator = _evaluator(
        spec, ckpt, model, attention, mesh, datasets, tok, shardings, reference, copies
    )
    return RunSetup(
        spec=spec,
        mesh=mesh,
        ckpt=ckpt,
        first_step=first_step,
        model=model,
        attention=attention,
        tok=tok,
        tokenizer_note=note,
        datasets=datasets,
        documents=documents,
        target=target,
        shardings=shardings,
        reference=reference,
        evaluator=evaluator,
        long_context=key_eval,
        copies=copies,
    )


def _evaluator(
    spec: RunSpec,
    ckpt: Checkpoint,
    model: LanguageModel,
    attention: str,
    mesh: Any,
    datasets: list[Dataset],
    tok: tokenizer.Tokenizer,
    shardings: Any,
    reference: Reference | None,
    copies: dict[str, Reference],
) -> Evaluator:
    """The run's `Evaluator` over its planned datasets (compiled at its first step), with the
    step's diagnostics and what its records and fingerprints name: the checkpoint, dtype,
    attention, sharding rules and intervals of the settings."""
    return Evaluator(
        model,
        mesh,
        datasets,
        tok,
        param_shardings=shardings,
        batch=spec.batch,
        options=spec.step_options(),
        reference=None if reference is None else (reference.model, reference.shardings),
        copies={name: (c.model, c.shardings) for name, c in copies.items()},
        compile=False,
        rules=spec.mesh.rules,
        checkpoint=ckpt,
        dtype=spec.dtype,
        attention=attention,
        bootstrap_samples=spec.bootstrap_samples,
        seed=spec.seed,
    )


def _use_compilation_cache(folder: str) -> None:
    """JAX's persistent compilation cache in `folder` (`runtime.compilation_cache_dir`; "": as
    it is)."""
    if folder and jax.config.jax_compilation_cache_dir != folder:
        # A process that compiled before (a training loop, a test run) has its cache set up
        # already: reset it, or the folder asked for would be ignored.
        jax.config.update("jax_compilation_cache_dir", folder)
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
        compilation_cache.reset_cache()


def _read_corpora(spec: RunSpec) -> list[Any]:
    """The corpora, read before the checkpoint (a user's mistake in them is reported first);
    with a cache, only their file list (a hit reads none): None for those."""
    raw = []
    for ds, _ in spec.datasets:
        raw.append(None if ds.cache_dir else planner.read(ds))
        if ds.cache_dir:
            data.resolve_paths(ds.path)
    return raw


def _model(
    spec: RunSpec, ckpt: Checkpoint, step: int | None, mesh: Any
) -> tuple[LanguageModel, str]:
    """The model of the step's architecture (resolved once) and the attention it runs, checked
    against the mesh's context axis and `eval.seq_len`."""
    arch = architecture.resolve(ckpt, step)
    attention = arch.attention(spec.attention, spec.dtype, mesh, spec.mesh.context_attention)
    model = arch.model(spec.dtype, attention)
    if spec.rope_angles != "float32":
        model = _rope_angles(model, spec, attention)
    # Quantized weights packed on the device where the format can (checkpoint.dequantize).
    model, _ = architecture.packed(ckpt, step, model, ckpt.options.dequantize)
    check_context(model, mesh)
    check_window(spec.protocol.seq_len, model)
    return model, attention


def _plan(
    spec: RunSpec, raw: list[Any], tok: tokenizer.Tokenizer, model: LanguageModel, mesh: Any
) -> tuple[list[Dataset], dict[str, Any]]:
    """Each dataset planned (`planner.planned`) and laid out in batches, and the documents read
    while planning (by name: the gzip baseline's)."""
    datasets, documents = [], {}
    for (ds, protocol), read_first in zip(spec.datasets, raw, strict=True):
        where = f"dataset {ds.name!r}: seq_len" if spec.suite else "eval.seq_len"
        check_window(protocol.seq_len, model, where)
        plan, docs, _ = planner.planned(ds, protocol, tok, model.vocab_size, read_first)
        layout = planner.batches(plan, spec.batch, model.honours_segments, mesh.shape["data"])
        datasets.append(Dataset(ds, protocol, plan, layout))
        documents[ds.name] = docs
    return datasets, documents


def _first_step(spec: RunSpec, ckpt: Checkpoint) -> int | None:
    """The step whose architecture and tokenizer the run reads: `checkpoint.step`'s, else the
    latest finalized one; for a sweep the latest of `ckpt.steps()` (a hub repository's latest
    step revision, not its main branch).

    Raises:
      CheckpointError: as `Checkpoint.resolve_step`.
    """
    if spec.steps.is_sweep and spec.checkpoint_step is None:
        listed = ckpt.steps()
        if listed:
            return ckpt.resolve_step(listed[-1])
    return ckpt.resolve_step(spec.checkpoint_step)


def _rope_angles(model: LanguageModel, spec: RunSpec, attention: str) -> LanguageModel:
    """The model with `model.rope_angles` (`ppl_jax.models.layers.rope.cos_sin`).

    Raises:
      ConfigError: a model without rotary embeddings, or not of ppl_jax's own families.
    """
    description = dict(model.description or {})
    if description.get("family") not in registry.families() or "rope_theta" not in description:
        raise ConfigError(
            f"model.rope_angles={spec.rope_angles} sets how ppl_jax's own rotary families form "
            f"their angles; this model ({description.get('family') or 'a model of your own'}) "
            f"has no such rotary embeddings. Unset it."
        )
    description["rope_angles"] = spec.rope_angles
    return registry.build(description, DTYPES[spec.dtype], attention)


def _reference(
    spec: RunSpec, model: LanguageModel, mesh: Any, tok: tokenizer.Tokenizer
) -> Reference:
    """The reference model (`reference.*`): opened and checked against the model, no weights.

    Raises:
      ConfigError: another vocabulary size, or another tokenizer (`vocabulary`) than the one the
        model is scored with, where the reference stores one (an Orbax step's description, a
        Hugging Face directory's tokenizer files): the same ids would name other strings.
    """
    ref = spec.diagnostics.reference
    found = _opened(
        spec, ref.checkpoint_dir, ref.checkpoint_format, ref.checkpoint_step, ref.dtype, mesh,
        "reference.checkpoint", "the reference model",
    )  # fmt: skip
    ref_model = found.model
    if ref_model.vocab_size != model.vocab_size:
        raise ConfigError(
            f"the reference model in {ref.checkpoint_dir!r} scores {ref_model.vocab_size} token "
            f"ids and the model {model.vocab_size}; KL needs the same tokenizer and vocabulary."
        )
    ref_tok = found.checkpoint.tokenizer(found.step)
    if ref_tok is not None and vocabulary(ref_tok) != vocabulary(tok):
        raise ConfigError(
            f"the reference model in {ref.checkpoint_dir!r} has another tokenizer "
            f"({_kind(ref_tok)}) than the one the model is scored with ({_kind(tok)}), though "
            f"both have {model.vocab_size} ids; KL compares the two models on the same token ids, "
            f"so it needs the same tokenizer: choose a reference trained with the model's."
        )
    return found


def _copy(
    spec: RunSpec, name: str, path: str, model: LanguageModel, mesh: Any, tok: tokenizer.Tokenizer
) -> Reference:
    """A study's copy (`study.copies`), read in `model.dtype`: opened and checked against the
    original, no weights.

    Raises:
      ConfigError: another vocabulary size, or another tokenizer than the original's where the
        copy stores one (as `_reference`).
    """
    found = _opened(
        spec, path, "auto", None, spec.dtype, mesh, f"study.copies[{name}]", f"the copy {name!r}"
    )
    copy_model = found.model
    if copy_model.vocab_size != model.vocab_size:
        raise ConfigError(
            f"the copy {name!r} in {path!r} scores {copy_model.vocab_size} token ids and the "
            f"original {model.vocab_size}; a study compares models of one tokenizer and "
            f"vocabulary, so score that copy on its own."
        )
    copy_tok = found.checkpoint.tokenizer(found.step)
    if copy_tok is not None and vocabulary(copy_tok) != vocabulary(tok):
        raise ConfigError(
            f"the copy {name!r} in {path!r} has another tokenizer ({_kind(copy_tok)}) than the "
            f"original's ({_kind(tok)}), though both have {model.vocab_size} ids; a study "
            f"compares models on the same token ids, so score that copy on its own."
        )
    return found


def _opened(
    spec: RunSpec,
    path: str,
    format: str,
    step: int | None,
    dtype: str,
    mesh: Any,
    setting: str,
    what: str,
) -> Reference:
    """Another model scored beside the model (a reference, a study's copy): opened, its
    architecture resolved and checked against the mesh, its params' targets; no weights."""
    with settings_named(setting):  # its own keys, not the scored model's
        ckpt = open_checkpoint(path, format)
        step = ckpt.resolve_step(step)
        arch = architecture.resolve(ckpt, step)
        attention = arch.attention("auto", dtype, mesh, spec.mesh.context_attention)
        # Its quantized weights packed on the device where the format can (as the model's).
        other, _ = architecture.packed(ckpt, step, arch.model(dtype, attention))
    check_context(other, mesh, what)
    target, shardings = mesh_lib.param_targets(
        other.abstract_params, other.logical_axes, mesh, spec.mesh.rules, DTYPES[dtype]
    )
    return Reference(ckpt, step, other, target, shardings, setting)


def vocabulary(tok: tokenizer.Tokenizer) -> Any:
    """What decides which string each token id names: the tokenizer's description
    (`Tokenizer.describe()`) without its file name and BOS/EOS policy, a `tokenizer.json` parsed
    (so that its formatting does not count)."""
    desc = {
        k: v
        for k, v in tok.describe().items()
        if k not in ("name", "bos_id", "eos_id", "add_bos_default")
    }
    if isinstance(desc.get("tokenizer_json"), str):
        desc["tokenizer_json"] = json.loads(desc["tokenizer_json"])
    return desc


def _kind(tok: tokenizer.Tokenizer) -> str:
    desc = tok.describe()
    return f"{desc.get('type')}" + (f" {desc['name']}" if desc.get("name") else "")
