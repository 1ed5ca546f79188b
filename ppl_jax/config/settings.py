"""The run's settings: the config checked and frozen (`Settings.from_config`).

`Settings.from_config` turns the ConfigDict of `ppl_jax.config.defaults` into frozen dataclasses at the
boundary, checking every value; nothing downstream (and nothing under `jax.jit`) sees a
ConfigDict. A bad value is a `ConfigError` naming the key.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from ml_collections import config_dict

from ppl_jax.config.defaults import (
    CHECKPOINT_FORMATS,
    DTYPES,
    FORMATS,
    MIN_BOOTSTRAP_SAMPLES,
    PROTOCOLS,
    STRIDED_PROTOCOLS,
    corpus_name,
)
from ppl_jax.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class DataSettings:
    name: str
    path: str
    format: str
    tokenizer: str
    errors: str
    separator: str
    jsonl_field: str
    allow_tokenizer_mismatch: bool  # score with a tokenizer whose ids exceed the vocabulary
    preparation: str = ""  # a standard preparation of the text (`ppl_jax.data.preparations`)
    tags: tuple[tuple[str, str], ...] = ()  # (key, value) pairs grouping the macro averages
    max_documents: int = 0  # at most this many documents (0: all)
    max_tokens: int = 0  # documents until this many tokens (0: all)
    sample_seed: int = -1  # -1: the budgets take the first documents; else a seeded sample
    cache_dir: str = ""  # planned datasets are cached here (`ppl_jax.plans.plan_cache`); "": none

    @property
    def has_budget(self) -> bool:
        return bool(self.max_documents or self.max_tokens)


@dataclasses.dataclass(frozen=True)
class EvalSettings:
    protocol: str
    seq_len: int
    stride: int | None  # None for the protocols that use no stride (lm_eval_rolling, gptq_chunks)
    batch_size: int
    add_bos: str
    packing: bool
    length_buckets: int


@dataclasses.dataclass(frozen=True)
class StepSettings:
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
class MeshSettings:
    data: int
    model: int
    rules: tuple[tuple[str, str | None], ...]


@dataclasses.dataclass(frozen=True)
class ReferenceSettings:
    """The reference model of `reference.*` (KL(reference || model), `ppl_jax.metrics.divergence`)."""

    checkpoint_dir: str
    checkpoint_step: int | None  # None: the latest finalized step
    checkpoint_format: str
    dtype: str


@dataclasses.dataclass(frozen=True)
class DiagnosticsSettings:
    """What a run reports beyond its sums (issue 9's diagnostics); all off by default."""

    tokens: bool = False  # tokens.parquet
    top_k: int = 0  # alternatives per token in tokens.parquet
    position_curve: bool = False  # position_curve.json / .png
    context_lengths: tuple[int, ...] = ()  # the context-length sweep
    context_targets: int = 0  # targets per window of the sweep; 0: by length (diagnostics)
    reference: ReferenceSettings | None = None

    @property
    def any_beyond_sums(self) -> bool:
        """Whether the run gathers more than the per-window sums a journal keeps."""
        return self.tokens or self.position_curve or self.reference is not None


MAX_TOP_K = 20


@dataclasses.dataclass(frozen=True)
class Settings:
    """The whole run, checked and frozen. Built by `Settings.from_config`."""

    checkpoint_dir: str
    checkpoint_step: int | None  # None: the latest finalized step
    checkpoint_format: str
    data: DataSettings
    eval: EvalSettings
    dtype: str
    attention: str
    mesh: MeshSettings
    output_dir: str
    progress: bool
    gzip_baseline: bool
    per_document: bool
    compilation_cache_dir: str
    journal_every: int  # batches between journal flushes
    resume: bool  # resume from a matching journal in output_dir
    bootstrap_samples: int = 1000  # resamples of the bootstrap intervals (0: none)
    seed: int = 0  # seed of the bootstrap's resampling
    diagnostics: DiagnosticsSettings = DiagnosticsSettings()
    steps: StepSettings = StepSettings()
    # Every dataset of the run, (data, eval) each; the first is `data`/`eval` when no suite.
    suite: tuple[tuple[DataSettings, EvalSettings], ...] = ()
    tensorboard: bool = False

    @property
    def datasets(self) -> tuple[tuple[DataSettings, EvalSettings], ...]:
        return self.suite or ((self.data, self.eval),)

    @property
    def is_training_run(self) -> bool:
        """A run over a suite, several checkpoint steps, or with TensorBoard: `ppl_jax.evaluation.sweep`."""
        return bool(self.suite) or self.steps.is_sweep or self.tensorboard

    @staticmethod
    def from_config(c: config_dict.ConfigDict) -> Settings:
        """Checks `c` and freezes it.

        Raises:
          ConfigError: naming the setting, for a value out of range or of the wrong kind.
        """
        steps = _steps(c.checkpoint)
        step = steps.steps[0] if steps.kind == "one" else None
        _choice("model.dtype", c.model.dtype, DTYPES)
        _choice("checkpoint.format", c.checkpoint.format, CHECKPOINT_FORMATS)
        _choice("model.attention", c.model.attention, ("auto", "xla", "cudnn", "splash"))
        data, eval_ = _dataset(c.data, c.eval, c, "data", "eval")
        seq_len = eval_.seq_len
        batch_size = int(c.eval.batch_size)
        if batch_size < 1:
            raise ConfigError(f"eval.batch_size={batch_size} must be at least 1.")
        buckets = int(c.eval.length_buckets)
        if not 1 <= buckets <= 8:
            raise ConfigError(f"eval.length_buckets={buckets} must be between 1 and 8.")
        journal_every = int(c.output.journal_every)
        if journal_every < 1:
            raise ConfigError(
                f"output.journal_every={journal_every} must be at least 1 (batches between "
                f"journal flushes)."
            )
        rules = tuple((str(k), None if v is None else str(v)) for k, v in c.mesh.rules)
        samples = int(c.metrics.bootstrap_samples)
        if samples != 0 and samples < MIN_BOOTSTRAP_SAMPLES:
            raise ConfigError(
                f"metrics.bootstrap_samples={samples} is too few for a 95% interval; use 0 "
                f"(no intervals) or at least {MIN_BOOTSTRAP_SAMPLES} (1000 is usual)."
            )
        return Settings(
            checkpoint_dir=os.path.expanduser(str(c.checkpoint.dir)),
            checkpoint_step=step,
            checkpoint_format=str(c.checkpoint.format),
            data=data,
            eval=dataclasses.replace(eval_, batch_size=batch_size, length_buckets=buckets),
            dtype=str(c.model.dtype),
            attention=str(c.model.attention),
            mesh=MeshSettings(data=int(c.mesh.data), model=int(c.mesh.model), rules=rules),
            output_dir=os.path.expanduser(str(c.output.dir)),
            progress=bool(c.output.progress),
            gzip_baseline=bool(c.output.gzip_baseline),
            per_document=bool(c.output.per_document),
            compilation_cache_dir=os.path.expanduser(str(c.runtime.compilation_cache_dir)),
            journal_every=journal_every,
            resume=_bool("output.resume", c.output.resume),
            bootstrap_samples=samples,
            seed=int(c.metrics.seed),
            diagnostics=_diagnostics(c, seq_len),
            steps=steps,
            suite=_suite(c, batch_size, buckets),
            tensorboard=_bool("output.tensorboard", c.output.tensorboard),
        )


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
SUITE_EVAL_KEYS = ("protocol", "seq_len", "stride", "add_bos")


def _dataset(
    data: Any, eval_: Any, c: config_dict.ConfigDict, data_key: str, eval_key: str
) -> tuple[DataSettings, EvalSettings]:
    """One dataset's settings from `data`-like and `eval`-like mappings (`c.data`/`c.eval`, or a
    suite entry's overrides laid over them); keys are named `data_key.x` / `eval_key.x`."""
    from ppl_jax.data import preparations
    from ppl_jax.outputs import store

    fmt, protocol = str(data["format"]), str(eval_["protocol"])
    _choice(f"{data_key}.format", fmt, FORMATS)
    _choice(f"{data_key}.errors", data["errors"], ("strict", "replace"))
    _choice(f"{eval_key}.protocol", protocol, PROTOCOLS)
    add_bos = str(eval_["add_bos"]).lower()
    _choice(f"{eval_key}.add_bos", add_bos, ("auto", "true", "false"))
    seq_len = int(eval_["seq_len"])
    if seq_len < 1:
        raise ConfigError(f"{eval_key}.seq_len={seq_len} must be at least 1.")
    preparation = str(data["preparation"] or "")
    if preparation:
        preparations.check(preparation, fmt, protocol)
    budgets = {k: int(data[k]) for k in ("max_documents", "max_tokens")}
    for k, v in budgets.items():
        if v < 0:
            raise ConfigError(f"{data_key}.{k}={v} must be 0 (all) or more.")
    return (
        DataSettings(
            name=str(data["name"] or "") or corpus_name(str(data["path"])),
            path=str(data["path"]),
            format=fmt,
            tokenizer=str(c.data.tokenizer),
            errors=str(data["errors"]),
            separator=str(data["separator"]),
            jsonl_field=str(data["jsonl_field"]),
            allow_tokenizer_mismatch=_bool(
                "data.allow_tokenizer_mismatch", c.data.allow_tokenizer_mismatch
            ),
            preparation=preparation,
            tags=tuple(
                sorted(store.parse_tags(str(data["tags"] or ""), f"{data_key}.tags").items())
            ),
            max_documents=budgets["max_documents"],
            max_tokens=budgets["max_tokens"],
            sample_seed=int(data["sample_seed"]),
            cache_dir=_cache_dir(str(c.data.cache_dir or "")),
        ),
        EvalSettings(
            protocol=protocol,
            seq_len=seq_len,
            stride=_stride(eval_["stride"], seq_len, protocol),
            batch_size=int(c.eval.batch_size),
            add_bos=add_bos,
            packing=bool(c.eval.packing),
            length_buckets=int(c.eval.length_buckets),
        ),
    )


def _suite(
    c: config_dict.ConfigDict, batch_size: int, buckets: int
) -> tuple[tuple[DataSettings, EvalSettings], ...]:
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
        out.append((d, dataclasses.replace(e, batch_size=batch_size, length_buckets=buckets)))
    return tuple(out)


def _steps(ckpt: Any) -> StepSettings:
    """`checkpoint.step` and `checkpoint.watch*` (see `StepSettings`)."""
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
    bad = ConfigError(
        f"checkpoint.step={raw!r} is not 'latest', 'all', a step number, a list '1000,2000' "
        f"or a range 'first:last:every'."
    )
    try:
        if text in ("latest", "all"):
            return StepSettings(kind=text, **common)
        if ":" in text:
            parts = [int(x) for x in text.split(":")]
            if len(parts) == 2:
                parts.append(1)
            first, last, every = parts
            if len(parts) != 3 or every < 1 or last < first or first < 0:
                raise bad
            return StepSettings(kind="range", steps=(first, last, every), **common)
        if "," in text:
            steps = tuple(sorted({int(x) for x in text.split(",") if x.strip()}))
            return StepSettings(kind="list", steps=steps, **common)
        return StepSettings(kind="one", steps=(int(text),), **common)
    except ValueError:
        raise bad from None


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


def _diagnostics(c: config_dict.ConfigDict, seq_len: int) -> DiagnosticsSettings:
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
    if lengths and c.eval.protocol == "lm_eval_rolling":
        raise ConfigError(
            "eval.context_lengths needs a stream protocol (sliding, hf_strided, gptq_chunks); "
            "lm_eval_rolling scores documents one by one."
        )
    targets = int(c.eval.context_targets)
    if targets < 0:
        raise ConfigError(f"eval.context_targets={targets} must be 0 (auto) or more.")
    reference = None
    if str(c.reference.checkpoint.dir):
        _choice("reference.checkpoint.format", c.reference.checkpoint.format, CHECKPOINT_FORMATS)
        _choice("reference.dtype", c.reference.dtype, DTYPES)
        reference = ReferenceSettings(
            checkpoint_dir=os.path.expanduser(str(c.reference.checkpoint.dir)),
            checkpoint_step=_step("reference.checkpoint.step", c.reference.checkpoint.step),
            checkpoint_format=str(c.reference.checkpoint.format),
            dtype=str(c.reference.dtype),
        )
    return DiagnosticsSettings(
        tokens=tokens,
        top_k=top_k,
        position_curve=_bool("output.position_curve", c.output.position_curve),
        context_lengths=lengths,
        context_targets=targets,
        reference=reference,
    )


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


def _choice(name: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ConfigError(f"{name}={value!r} is not one of {', '.join(allowed)}.")


def _cache_dir(value: str) -> str:
    """`data.cache_dir`: a folder of the filesystem, which its entries are memory-mapped from."""
    from ppl_jax.runtime import paths

    if value and not paths.is_local(value):
        raise ConfigError(
            f"data.cache_dir={value!r}: the cache is memory-mapped, so it must be a folder of "
            f"the filesystem (on several hosts, one every process sees: NFS, Lustre, or a bucket "
            f"mounted with gcsfuse), not a {value.split(':', 1)[0]}:// path."
        )
    return os.path.expanduser(value)


def _bool(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(f"{name}={value!r} is neither true nor false.")
    return value


def _stride(value: int | None, seq_len: int, protocol: str) -> int | None:
    """eval.stride as used: unset is seq_len // 2 (at least 1); None where `protocol` has none.

    Only a stride that a protocol uses is checked; a stride never set never fails a run.
    """
    if protocol not in STRIDED_PROTOCOLS:
        return None
    if value is None:
        return max(seq_len // 2, 1)
    stride = int(value)
    if not 1 <= stride <= seq_len:
        raise ConfigError(
            f"eval.stride={stride} is outside 1..eval.seq_len ({seq_len}); a stride of "
            f"seq_len scores disjoint windows, a smaller one gives each token more context."
        )
    return stride
