"""The command line's config checked and frozen: `from_config(ConfigDict) -> RunSpec`.

The only reader of the CLI's ConfigDict (`ppl_jax.config.defaults`): it builds the layers' specs
(`DatasetSpec`, `ProtocolSpec`, `BatchSpec`, `MeshSpec`, `RunSpec`), each of which checks its own
values; nothing downstream (and nothing under `jax.jit`) sees a ConfigDict. A bad value is a
`ConfigError` naming the key.
"""

from __future__ import annotations

import math
import os
import re
from typing import Any

from ml_collections import config_dict

from ppl_jax.config.defaults import MIN_BOOTSTRAP_SAMPLES, held_out_paths
from ppl_jax.data import preparations
from ppl_jax.data.spec import DatasetSpec, choice, corpus_name
from ppl_jax.errors import ConfigError
from ppl_jax.evaluation.spec import (
    CHECKPOINT_FORMATS,
    DTYPES,
    DiagnosticsSpec,
    LongContextSpec,
    ReferenceSpec,
    RunSpec,
    StepSpec,
    StudySpec,
)
from ppl_jax.models.layers import kernels
from ppl_jax.models.layers.rope import ANGLES
from ppl_jax.outputs import sinks
from ppl_jax.outputs.figures import FigureSpec
from ppl_jax.plans import protocols
from ppl_jax.plans.spec import BatchSpec, ProtocolSpec
from ppl_jax.runtime.mesh import MeshSpec
from ppl_jax.scoring import precision
from ppl_jax.scoring.nll import MAX_TOP_K

_choice = choice


def from_config(c: config_dict.ConfigDict) -> RunSpec:
    """Checks `c` and freezes it.

    Raises:
      ConfigError: naming the setting, for a value out of range or of the wrong kind.
    """
    steps = _steps(c.checkpoint)
    step = steps.steps[0] if steps.kind == "one" else None
    _choice("model.dtype", c.model.dtype, DTYPES)
    _choice("checkpoint.format", c.checkpoint.format, CHECKPOINT_FORMATS)
    _choice("model.attention", c.model.attention, kernels.CHOICES)
    _choice("model.rope_angles", c.model.rope_angles, ANGLES)
    _choice("model.matmul_precision", c.model.matmul_precision, precision.SETTINGS)
    data, protocol = _dataset(c.data, c.eval, c, "data", "eval")
    batch = BatchSpec(
        batch_size=int(c.eval.batch_size),
        packing=bool(c.eval.packing),
        length_buckets=int(c.eval.length_buckets),
    )
    journal_every, samples = _journal_every(c), _bootstrap_samples(c)
    options = checkpoint_options(c.checkpoint)
    return RunSpec(
        checkpoint_dir=checkpoint_dir(c.checkpoint),
        checkpoint_options=options,
        checkpoint_step=step,
        checkpoint_format=str(c.checkpoint.format),
        data=data,
        protocol=protocol,
        dtype=str(c.model.dtype),
        attention=str(c.model.attention),
        rope_angles=str(c.model.rope_angles),
        matmul_precision=str(c.model.matmul_precision),
        mesh=_mesh(c),
        output_dir=os.path.expanduser(str(c.output.dir)),
        progress=bool(c.output.progress),
        gzip_baseline=bool(c.output.gzip_baseline),
        per_document=bool(c.output.per_document),
        compilation_cache_dir=os.path.expanduser(str(c.runtime.compilation_cache_dir)),
        journal_every=journal_every,
        resume=_bool("output.resume", c.output.resume),
        bootstrap_samples=samples,
        seed=int(c.metrics.seed),
        diagnostics=_diagnostics(c, protocol.seq_len),
        steps=steps,
        batch=batch,
        suite=_suite(c),
        sinks=_sinks(c),
    )


def _mesh(c: config_dict.ConfigDict) -> MeshSpec:
    """`mesh.*`, with `model.context_attention` and `model.token_chunk` (how the context axis
    and the per-token layers run)."""
    rules = tuple((str(k), None if v is None else str(v)) for k, v in c.mesh.rules)
    return MeshSpec(
        data=int(c.mesh.data),
        model=int(c.mesh.model),
        rules=rules,
        context=int(c.mesh.context),
        context_attention=str(c.model.context_attention),
        token_chunk=int(c.model.token_chunk),
    )


def _journal_every(c: config_dict.ConfigDict) -> int:
    """`output.journal_every`, at least 1."""
    journal_every = int(c.output.journal_every)
    if journal_every < 1:
        raise ConfigError(
            f"output.journal_every={journal_every} must be at least 1 (batches between "
            f"journal flushes)."
        )
    return journal_every


def _bootstrap_samples(c: config_dict.ConfigDict) -> int:
    """`metrics.bootstrap_samples`: 0 (no intervals) or at least `MIN_BOOTSTRAP_SAMPLES`."""
    samples = int(c.metrics.bootstrap_samples)
    if samples != 0 and samples < MIN_BOOTSTRAP_SAMPLES:
        raise ConfigError(
            f"metrics.bootstrap_samples={samples} is too few for a 95% interval; use 0 "
            f"(no intervals) or at least {MIN_BOOTSTRAP_SAMPLES} (1000 is usual)."
        )
    return samples


SUITE_DATA_KEYS = (
    "name",
    "path",
    "format",
    "errors",
    "separator",
    "jsonl_field",
    "preparation",
    "tags",
    "max_documents",
    "max_tokens",
    "sample_seed",
)
SUITE_EVAL_KEYS = ("protocol", "seq_len", "stride", "add_bos", "long_documents")


def _dataset(
    data: Any, eval_: Any, c: config_dict.ConfigDict, data_key: str, eval_key: str
) -> tuple[DatasetSpec, ProtocolSpec]:
    """One dataset's specs from `data`-like and `eval`-like mappings (`c.data`/`c.eval`, or a
    suite entry's overrides laid over them); keys are named `data_key.x` / `eval_key.x`."""
    path = str(data["path"])
    ds = DatasetSpec(
        name=str(data["name"] or "") or corpus_name(path, held_out_paths()),
        path=path,
        format=str(data["format"]),
        tokenizer=str(c.data.tokenizer),
        errors=str(data["errors"]),
        separator=str(data["separator"]),
        jsonl_field=str(data["jsonl_field"]),
        allow_tokenizer_mismatch=_bool(
            "data.allow_tokenizer_mismatch", c.data.allow_tokenizer_mismatch
        ),
        preparation=str(data["preparation"] or ""),
        tags=str(data["tags"] or ""),
        max_documents=int(data["max_documents"]),
        max_tokens=int(data["max_tokens"]),
        sample_seed=int(data["sample_seed"]),
        cache_dir=str(c.data.cache_dir or ""),
        fingerprint=str(c.data.fingerprint),
        where=data_key,
    )
    protocol = ProtocolSpec(
        name=str(eval_["protocol"]),
        seq_len=int(eval_["seq_len"]),
        stride=None if eval_["stride"] is None else int(eval_["stride"]),
        add_bos=str(eval_["add_bos"]),
        long_documents=str(eval_["long_documents"] or ""),
        where=eval_key,
    )
    if ds.preparation:
        preparations.check(ds.preparation, ds.format, protocol.name)
    return ds, protocol


def _suite(c: config_dict.ConfigDict) -> tuple[tuple[DatasetSpec, ProtocolSpec], ...]:
    """The datasets of `c.suite`, each entry's keys laid over `c.data` and `c.eval`."""
    entries = list(c.suite or ())
    out, names = [], set()
    for i, entry in enumerate(entries):
        key = f"suite[{i}]"
        if not hasattr(entry, "keys"):
            raise ConfigError(f"{key} is not a mapping of dataset keys (name, path, format, ...).")
        unknown = sorted(set(entry.keys()) - set(SUITE_DATA_KEYS) - set(SUITE_EVAL_KEYS))
        if unknown:
            raise ConfigError(
                f"{key} has the unknown key {unknown[0]!r}; a dataset takes "
                f"{', '.join(SUITE_DATA_KEYS + SUITE_EVAL_KEYS)}."
            )
        if not entry.get("name") or not entry.get("path"):
            raise ConfigError(f"{key} needs a name and a path.")
        data = {k: entry.get(k, c.data[k]) for k in SUITE_DATA_KEYS if k != "name"}
        data["name"] = entry["name"]
        eval_ = {k: entry.get(k, c.eval[k]) for k in SUITE_EVAL_KEYS}
        if "seq_len" in entry and "stride" not in entry:
            eval_["stride"] = None  # the default stride follows the dataset's own seq_len
        d, e = _dataset(data, eval_, c, key, key)
        if d.name in names:
            raise ConfigError(f"{key}: the name {d.name!r} is used twice; names must be unique.")
        names.add(d.name)
        out.append((d, e))
    return tuple(out)


def checkpoint_options(ckpt: Any) -> tuple[tuple[str, Any], ...]:
    """`checkpoint.architecture`, `mapping`, `item`, `params`, `allow_download`, `dequantize`
    as `open_checkpoint`'s keyword options (empty or default ones left out); ConfigError for a
    `checkpoint.dequantize` other than `auto`, `device` or `host`."""
    out = [
        (k, str(getattr(ckpt, k)).strip()) for k in ("architecture", "mapping", "item", "params")
    ]
    out = [(k, os.path.expanduser(v) if k == "mapping" else v) for k, v in out if v]
    if _bool("checkpoint.allow_download", ckpt.allow_download):
        out.append(("allow_download", True))
    if (dequantize := str(ckpt.get("dequantize", "auto"))) != "auto":
        _choice("checkpoint.dequantize", dequantize, ("auto", "device", "host"))
        out.append(("dequantize", dequantize))
    return tuple(out)


def checkpoint_dir(ckpt: Any) -> str:
    """`checkpoint.dir` as given, `~` expanded: a local or remote folder, or a hub id
    (`hf://org/name[@revision]`), which its reader resolves when the run opens it
    (`ppl_jax.checkpoints.readers.huggingface.HubRepo`: the revision's snapshot, its step revisions
    for a sweep). Reads nothing."""
    return os.path.expanduser(str(ckpt.dir).strip())


_REVISION = re.compile(r"^(?:[a-z][a-z_-]*)?(\d+)$")  # `1000`, or a hub revision `step1000`


def _step_number(raw: Any, part: str) -> int:
    """One step of `checkpoint.step` (`1000`, or the hub revision `step1000`), in one sentence
    when it is not one."""
    m = _REVISION.match(part.strip())
    if not m:
        raise ConfigError(
            f"checkpoint.step={raw!r}: {part.strip()!r} is not a step number (0 or more) or a "
            f"hub step revision such as step1000; give 'latest', 'all', a step, a list "
            f"'1000,2000' or a range 'first:last:every'."
        )
    return int(m.group(1))


def _steps(ckpt: Any) -> StepSpec:
    """`checkpoint.step` and `checkpoint.watch*` (see `StepSpec`).

    Raises:
      ConfigError: a step that is not a number >= 0 (or a hub revision `step1000`), naming it:
        `100,abc` and `-5` are refused, never read as `100` and `5`.
    """
    raw = ckpt.step
    text = str(raw).strip().lower()
    timeout, interval = float(ckpt.watch_timeout), float(ckpt.watch_interval)
    until = int(ckpt.watch_until)
    watch = _bool("checkpoint.watch", ckpt.watch)
    if timeout <= 0 or interval <= 0:
        raise ConfigError("checkpoint.watch_timeout and checkpoint.watch_interval must be > 0.")
    common = {
        "watch": watch,
        "watch_until": until if until >= 0 else None,
        "watch_timeout": timeout,
        "watch_interval": interval,
    }
    if text in ("latest", "all"):
        return StepSpec(kind=text, **common)
    if ":" in text:
        parts = text.split(":")
        if len(parts) not in (2, 3):
            raise ConfigError(
                f"checkpoint.step={raw!r} is not a range 'first:last' or 'first:last:every'."
            )
        first, last, every = [_step_number(raw, p) for p in parts] + [1] * (3 - len(parts))
        if every < 1 or last < first:
            raise ConfigError(
                f"checkpoint.step={raw!r}: a range needs first <= last and every >= 1."
            )
        return StepSpec(kind="range", steps=(first, last, every), **common)
    if "," in text:
        steps = tuple(sorted({_step_number(raw, x) for x in text.split(",")}))
        return StepSpec(kind="list", steps=steps, **common)
    return StepSpec(kind="one", steps=(_step_number(raw, text),), **common)


def _step(name: str, step: Any) -> int | None:
    """A checkpoint step setting: None for 'latest', else the step number."""
    if isinstance(step, str) and step.strip().lower() == "latest":
        return None
    try:
        return int(step)
    except (TypeError, ValueError):
        raise ConfigError(
            f"{name}={step!r} is neither 'latest' nor an integer step number."
        ) from None


def _diagnostics(c: config_dict.ConfigDict, seq_len: int) -> DiagnosticsSpec:
    top_k = int(c.output.top_k)
    if not 0 <= top_k <= MAX_TOP_K:
        raise ConfigError(f"output.top_k={top_k} is outside 0..{MAX_TOP_K}.")
    tokens = _bool("output.tokens", c.output.tokens)
    if top_k and not tokens:
        raise ConfigError(
            f"output.top_k={top_k} lists alternatives in tokens.parquet; set "
            f"--config.output.tokens=true too."
        )
    lengths = _int_list("eval.context_lengths", c.eval.context_lengths)
    convention = protocols.PROTOCOLS.get(str(c.eval.protocol))
    if lengths and convention is not None and convention.document_level:
        streams = [name for name, p in protocols.PROTOCOLS.items() if not p.document_level]
        raise ConfigError(
            f"eval.context_lengths needs a stream protocol ({', '.join(streams)}); "
            f"{convention.name} scores documents one by one."
        )
    targets = int(c.eval.context_targets)
    if targets < 0:
        raise ConfigError(f"eval.context_targets={targets} must be 0 (auto) or more.")
    reference = None
    if str(c.reference.checkpoint.dir):
        _choice("reference.checkpoint.format", c.reference.checkpoint.format, CHECKPOINT_FORMATS)
        _choice("reference.dtype", c.reference.dtype, DTYPES)
        reference = ReferenceSpec(
            checkpoint_dir=os.path.expanduser(str(c.reference.checkpoint.dir)),
            checkpoint_step=_step("reference.checkpoint.step", c.reference.checkpoint.step),
            checkpoint_format=str(c.reference.checkpoint.format),
            dtype=str(c.reference.dtype),
        )
    return DiagnosticsSpec(
        tokens=tokens,
        top_k=top_k,
        position_curve=_bool("output.position_curve", c.output.position_curve),
        context_lengths=lengths,
        context_targets=targets,
        reference=reference,
        figures=FigureSpec.parse(
            c.output.figures, c.output.figure_size, c.output.figure_dpi, "output"
        ),
        long_context=_long_context(c, convention, seq_len),
        study=_study(c, reference),
    )


_COPY_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]*")


def _study(c: config_dict.ConfigDict, reference: ReferenceSpec | None) -> StudySpec | None:
    """`study.copies` ("NAME=DIR,NAME=DIR") and `study.both_directions`, or None (no copies)."""
    entries = [x.strip() for x in str(c.study.copies).split(",") if x.strip()]
    if not entries:
        return None
    if reference is not None:
        raise ConfigError(
            "study.copies scores each copy against the model under checkpoint.* (the original); "
            "reference.checkpoint.dir is another comparison: unset one of them."
        )
    copies: dict[str, str] = {}
    for entry in entries:
        name, sep, path = (x.strip() for x in entry.partition("="))
        if not sep or not path or not _COPY_NAME.fullmatch(name) or name == "original":
            raise ConfigError(
                f"study.copies: {entry!r} is not NAME=DIR (a name of letters, digits, '_', '.', "
                f"'+', '-' other than 'original', then the copy's checkpoint directory)."
            )
        if name in copies:
            raise ConfigError(f"study.copies names {name!r} twice; give each copy its own name.")
        copies[name] = os.path.expanduser(path)
    return StudySpec(tuple(copies.items()), _bool("study.both_directions", c.study.both_directions))


def _long_context(
    c: config_dict.ConfigDict, convention: Any, seq_len: int
) -> LongContextSpec | None:
    """`eval.short_context`, `eval.short_targets` and `longppl.*` (None: short_context 0)."""
    short = int(c.eval.short_context)
    evaluator_dir = str(c.longppl.evaluator.dir)
    if short == 0:
        if evaluator_dir:
            raise ConfigError(
                "longppl.evaluator.dir names the model that finds LongPPL's key tokens from a "
                "short and a long context; set eval.short_context too (e.g. 4096)."
            )
        return None
    whole = [name for name, p in protocols.PROTOCOLS.items() if p.long_context]
    if convention is not None and not convention.long_context:
        raise ConfigError(
            f"eval.short_context={short} needs a protocol that scores documents whole "
            f"({', '.join(whole)}), so that a token's context is its document's; "
            f"eval.protocol is {convention.name}."
        )
    if not 1 <= short < seq_len:
        raise ConfigError(
            f"eval.short_context={short} must be between 1 and eval.seq_len - 1 ({seq_len - 1}): "
            f"the targets with more context than it are scored again with it."
        )
    targets = int(c.eval.short_targets)
    if targets < 1:
        raise ConfigError(f"eval.short_targets={targets} must be at least 1.")
    alpha, beta = float(c.longppl.alpha), float(c.longppl.beta)
    if not (math.isfinite(alpha) and math.isfinite(beta)):
        raise ConfigError(f"longppl.alpha={alpha} and longppl.beta={beta} must be finite.")
    evaluator = None
    if evaluator_dir:
        e = c.longppl.evaluator
        _choice("longppl.evaluator.format", e.format, CHECKPOINT_FORMATS)
        _choice("longppl.evaluator.dtype", e.dtype, DTYPES)
        evaluator = ReferenceSpec(
            checkpoint_dir=os.path.expanduser(evaluator_dir),
            checkpoint_step=_step("longppl.evaluator.step", e.step),
            checkpoint_format=str(e.format),
            dtype=str(e.dtype),
        )
    return LongContextSpec(short, targets, alpha, beta, evaluator)


def _sinks(c: config_dict.ConfigDict) -> tuple[str, ...]:
    """`output.sinks`, with `tensorboard` added by `output.tensorboard=true` (its shorthand)."""
    found = sinks.names(c.output.sinks)
    if _bool("output.tensorboard", c.output.tensorboard) and "tensorboard" not in found:
        found += ("tensorboard",)
    return found


def _int_list(name: str, value: Any) -> tuple[int, ...]:
    """A list of distinct positive integers, given as '64,128' or a sequence; sorted."""
    items = value.split(",") if isinstance(value, str) else list(value or ())
    try:
        numbers = sorted({int(str(v).strip()) for v in items if str(v).strip()})
    except ValueError:
        raise ConfigError(
            f"{name}={value!r} is not a comma-separated list of integers, e.g. '64,128,256'."
        ) from None
    if numbers and numbers[0] < 1:
        raise ConfigError(f"{name}={value!r} holds a length below 1.")
    return tuple(numbers)


def _bool(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(f"{name}={value!r} is neither true nor false.")
    return value
