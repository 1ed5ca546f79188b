"""The evaluation config: the default `ml_collections.ConfigDict`, and its frozen, checked form.

Config files in `configs/` return a `ConfigDict` from `get_config()`; this module is itself such a
file (the built-in default used when `--config` is omitted). `EvalSettings.from_config` turns the
ConfigDict into frozen dataclasses at the boundary, checking every value; nothing downstream (and
nothing under `jax.jit`) sees a ConfigDict.
"""

from __future__ import annotations

import dataclasses
import glob
import json
import os
import sysconfig
from typing import Any

from ml_collections import config_dict

from ppl_jax.errors import ConfigError

# Modules of the CPython standard library that the demo model never saw in training; the default
# run scores them. Each exists in every CPython from 3.9 on.
HELD_OUT_MODULES = (
    "textwrap.py",
    "heapq.py",
    "bisect.py",
    "colorsys.py",
    "fnmatch.py",
    "shlex.py",
    "calendar.py",
    "difflib.py",
)

# Logical axis name -> mesh axis (or None: replicated). Weights name their dims logically
# (see `ppl_jax.models.llama`); the batch dim is `batch`.
DEFAULT_RULES = (
    ("batch", "data"),
    ("vocab", "model"),
    ("embed", None),
    ("heads", "model"),
    ("kv_heads", "model"),
    ("head_dim", None),
    ("mlp", "model"),
)

PROTOCOLS = ("sliding", "hf_strided", "lm_eval_rolling", "gptq_chunks")
STRIDED_PROTOCOLS = ("sliding", "hf_strided")  # the protocols that use eval.stride
# One line per protocol: the convention each reproduces (`--help`, and results.json's reference).
PROTOCOL_NOTES = {
    "sliding": "ppl_jax native: every token after the first scored once, stride windows",
    "hf_strided": "Hugging Face 'Perplexity of fixed-length models' strided recipe",
    "lm_eval_rolling": "lm-evaluation-harness loglikelihood_rolling, per document",
    "gptq_chunks": "GPTQ/AWQ: n // seq_len disjoint chunks, tail dropped",
}
DEMO_CORPUS_NAME = "cpython-stdlib-held-out"  # data.name of the default data.path
FORMATS = ("text", "lines", "jsonl", "wikitext")
CHECKPOINT_FORMATS = ("auto", "orbax", "hf")
DTYPES = ("float32", "bfloat16")
MIN_BOOTSTRAP_SAMPLES = 100  # fewer leave a 95% interval's 2.5% tails a sample or two


def demo_checkpoint_dir() -> str:
    """The demo checkpoint shipped inside the package (see `launch/train_demo.py`)."""
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "demo", "checkpoint")


def held_out_paths() -> str:
    """Comma-separated paths of the held-out standard-library modules on this machine."""
    stdlib = sysconfig.get_paths()["stdlib"]
    return ",".join(os.path.join(stdlib, name) for name in HELD_OUT_MODULES)


def get_config() -> config_dict.ConfigDict:
    """The built-in default: the demo checkpoint on the held-out standard-library modules.

    Each key's meaning is in `KEY_MEANINGS` (shown by `ppl-jax --help`).
    """
    c = config_dict.ConfigDict()
    c.checkpoint = config_dict.ConfigDict()
    c.checkpoint.dir = demo_checkpoint_dir()
    c.checkpoint.step = "latest"
    c.checkpoint.format = "auto"

    c.data = config_dict.ConfigDict()
    c.data.name = ""  # derived from data.path (see `corpus_name`)
    c.data.path = held_out_paths()
    c.data.format = "text"
    c.data.tokenizer = "auto"
    c.data.errors = "strict"
    c.data.separator = "\n\n"
    c.data.jsonl_field = "text"
    c.data.allow_tokenizer_mismatch = False

    c.eval = config_dict.ConfigDict()
    c.eval.protocol = "sliding"
    c.eval.seq_len = 256
    c.eval.stride = config_dict.placeholder(int)  # unset: seq_len // 2 where a protocol uses it
    c.eval.batch_size = 8
    c.eval.add_bos = "auto"
    c.eval.packing = True
    c.eval.length_buckets = 1
    c.eval.context_lengths = ""  # e.g. "64,128,256": the context-length sweep (off when empty)
    c.eval.context_targets = 0  # targets per window of the sweep; 0: min(L, positions - L + 1)

    c.model = config_dict.ConfigDict()
    c.model.dtype = "float32"
    c.model.attention = "auto"

    c.mesh = config_dict.ConfigDict()
    c.mesh.data = -1
    c.mesh.model = 1
    c.mesh.rules = DEFAULT_RULES

    c.metrics = config_dict.ConfigDict()
    c.metrics.bootstrap_samples = 1000
    c.metrics.seed = 0

    c.reference = config_dict.ConfigDict()
    c.reference.checkpoint = config_dict.ConfigDict()
    c.reference.checkpoint.dir = ""  # empty: no reference model
    c.reference.checkpoint.step = "latest"
    c.reference.checkpoint.format = "auto"
    c.reference.dtype = "float32"

    c.runtime = config_dict.ConfigDict()
    c.runtime.compilation_cache_dir = ""

    c.output = config_dict.ConfigDict()
    c.output.dir = "results"
    c.output.progress = True
    c.output.gzip_baseline = True
    c.output.per_document = False
    c.output.journal_every = 50
    c.output.resume = True
    c.output.tokens = False
    c.output.top_k = 0
    c.output.position_curve = False
    return c


# One line per key of `get_config()` (a test checks that the two name the same keys); `--help`
# prints them with the defaults.
KEY_MEANINGS = {
    "checkpoint.dir": "an Orbax CheckpointManager directory of numbered steps, or a Hugging Face "
    "directory",
    "checkpoint.step": "'latest' (the newest finalized step) or a step number",
    "checkpoint.format": "'orbax', 'hf' (a Hugging Face directory), or 'auto' (by config.json)",
    "data.name": "the corpus's name in the results; empty: derived from data.path",
    "data.path": "a file, a glob, or a comma-separated list of either",
    "data.format": "'text' (a file is a document), 'lines' (each non-empty line), 'jsonl', "
    "'wikitext' (articles at ' = Title = ' headings)",
    "data.tokenizer": "'auto' (the checkpoint's own), 'byte', a tokenizer.json, a SentencePiece "
    ".model, or an HF directory",
    "data.errors": "'strict' fails on bytes that are not UTF-8 (file and offset); 'replace'",
    "data.separator": "text placed between documents in the stream (sliding)",
    "data.jsonl_field": "the field of a jsonl record that holds the text",
    "data.allow_tokenizer_mismatch": "score with a tokenizer whose vocabulary does not fit the "
    "model's (refused when false)",
    "eval.protocol": "which tokens are scored, and how: " + ", ".join(PROTOCOLS),
    "eval.seq_len": "tokens the model reads per window (at most its positions)",
    "eval.stride": "tokens a window advances by, 1..seq_len, for sliding and hf_strided; unset: "
    "seq_len // 2; ignored by the other protocols",
    "eval.batch_size": "windows per step, global over all processes; a multiple of mesh.data",
    "eval.add_bos": "BOS before the text: 'auto' (the tokenizer's own policy), 'true', 'false'",
    "eval.packing": "several short windows per row (segments, no attention across them)",
    "eval.length_buckets": "row widths a run may compile, 1..8 (1: every row is seq_len + 1)",
    "eval.context_lengths": "context lengths of a sweep that scores the same targets with each, "
    "e.g. '64,128,256' (empty: no sweep)",
    "eval.context_targets": "targets per window of the context-length sweep (0: L at length L, "
    "so each target sees L..2L-1 tokens)",
    "model.dtype": "parameter dtype, 'float32' or 'bfloat16' (log-softmax is always float32)",
    "model.attention": "'xla', 'cudnn' (GPU, 16-bit), 'splash' (TPU), or 'auto' (by platform)",
    "mesh.data": "devices along the data axis; -1: the devices left over",
    "mesh.model": "devices along the model axis (weights sharded)",
    "mesh.rules": "logical axis name -> mesh axis, for sharding weights",
    "metrics.bootstrap_samples": "resamples of the 95% bootstrap intervals of perplexity and "
    "bits per byte (0: no intervals; else at least 100)",
    "metrics.seed": "seed of the bootstrap's resampling (the intervals are reproducible)",
    "reference.checkpoint.dir": "a reference model (same tokenizer) scored beside the model "
    "for KL(reference || model); empty: none",
    "reference.checkpoint.step": "the reference's step: 'latest' or a step number",
    "reference.checkpoint.format": "the reference's format: 'orbax', 'hf', or 'auto'",
    "reference.dtype": "the reference's parameter dtype, 'float32' or 'bfloat16'",
    "runtime.compilation_cache_dir": "JAX's persistent compilation cache ('': off)",
    "output.dir": "where process 0 writes results.json",
    "output.progress": "a progress bar on stderr",
    "output.gzip_baseline": "also report the bits per byte of gzip -9 on the same text",
    "output.per_document": "also write documents.jsonl (document-level protocols)",
    "output.journal_every": "batches between journal flushes (the journal lets an interrupted "
    "run resume)",
    "output.resume": "resume from a matching journal in output.dir",
    "output.tokens": "also write tokens.parquet: every scored token's NLL, surprisal, entropy",
    "output.top_k": "with output.tokens, the k most probable tokens at each position, 0..20",
    "output.position_curve": "also write position_curve.json and .png: perplexity by position "
    "in the window",
}

# Defaults too long to print whole in `--help`.
_DEFAULT_LABELS = {
    "checkpoint.dir": "the demo checkpoint",
    "data.path": "the held-out stdlib modules",
}


def flat_keys(c: config_dict.ConfigDict, prefix: str = "") -> dict[str, Any]:
    """Every leaf of `c` as `{"section.key": value}`, in ConfigDict order (sorted by name)."""
    out: dict[str, Any] = {}
    for name, value in c.items():
        if isinstance(value, config_dict.ConfigDict):
            out.update(flat_keys(value, f"{prefix}{name}."))
        else:
            out[f"{prefix}{name}"] = value
    return out


def describe_keys() -> list[tuple[str, str, str]]:
    """`(key, default as text, meaning)` for every key of `get_config()`, in its order."""
    rows = []
    for key, value in flat_keys(get_config()).items():
        if key in _DEFAULT_LABELS:
            shown = _DEFAULT_LABELS[key]
        elif value is None:
            shown = "unset"
        elif isinstance(value, bool):
            shown = str(value).lower()
        elif key == "mesh.rules":
            shown = " ".join(f"{k}:{v or '-'}" for k, v in value)
        elif isinstance(value, str):
            shown = json.dumps(value)
        else:
            shown = str(value)
        rows.append((key, shown, KEY_MEANINGS.get(key, "")))
    return rows


def corpus_name(path: str) -> str:
    """The corpus's name derived from `data.path` (a file, a glob, or a comma-separated list).

    The default path is the demo corpus, `DEMO_CORPUS_NAME`; one file is its name without the
    extension (`/data/wiki.test.raw` -> `wiki.test`); one glob is its folder's name and the
    pattern (`/data/val/*.jsonl` -> `val/*.jsonl`); several entries are their common folder's
    name (`/data/c4/a.json,/data/c4/b.json` -> `c4`), or the files' names joined by `+` where
    they share no folder but the root.
    """
    if path == held_out_paths():
        return DEMO_CORPUS_NAME
    entries = [os.path.expanduser(e.strip()) for e in path.split(",") if e.strip()]
    if not entries:
        return ""
    if len(entries) == 1:
        entry = entries[0].rstrip(os.sep)
        if not glob.has_magic(entry):
            return os.path.splitext(os.path.basename(entry))[0]
        folder = os.path.basename(os.path.dirname(os.path.abspath(entry)))
        return f"{folder}/{os.path.basename(entry)}" if folder else os.path.basename(entry)
    folders = [os.path.dirname(os.path.abspath(e)) for e in entries]
    common = os.path.basename(os.path.commonpath(folders))
    if common:
        return common
    return "+".join(os.path.splitext(os.path.basename(e))[0] for e in entries)


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
class MeshSettings:
    data: int
    model: int
    rules: tuple[tuple[str, str | None], ...]


@dataclasses.dataclass(frozen=True)
class ReferenceSettings:
    """The reference model of `reference.*` (KL(reference || model), `ppl_jax.divergence`)."""

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

    @staticmethod
    def from_config(c: config_dict.ConfigDict) -> Settings:
        """Checks `c` and freezes it.

        Raises:
          ConfigError: naming the setting, for a value out of range or of the wrong kind.
        """
        step = _step("checkpoint.step", c.checkpoint.step)
        _choice("data.format", c.data.format, FORMATS)
        _choice("data.errors", c.data.errors, ("strict", "replace"))
        _choice("eval.protocol", c.eval.protocol, PROTOCOLS)
        _choice("model.dtype", c.model.dtype, DTYPES)
        _choice("checkpoint.format", c.checkpoint.format, CHECKPOINT_FORMATS)
        _choice("model.attention", c.model.attention, ("auto", "xla", "cudnn", "splash"))
        add_bos = str(c.eval.add_bos).lower()
        _choice("eval.add_bos", add_bos, ("auto", "true", "false"))
        seq_len = int(c.eval.seq_len)
        if seq_len < 1:
            raise ConfigError(f"eval.seq_len={seq_len} must be at least 1.")
        stride = _stride(c.eval.stride, seq_len, str(c.eval.protocol))
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
            data=DataSettings(
                name=str(c.data.name or "") or corpus_name(str(c.data.path)),
                path=str(c.data.path),
                format=str(c.data.format),
                tokenizer=str(c.data.tokenizer),
                errors=str(c.data.errors),
                separator=str(c.data.separator),
                jsonl_field=str(c.data.jsonl_field),
                allow_tokenizer_mismatch=_bool(
                    "data.allow_tokenizer_mismatch", c.data.allow_tokenizer_mismatch
                ),
            ),
            eval=EvalSettings(
                protocol=str(c.eval.protocol),
                seq_len=seq_len,
                stride=stride,
                batch_size=batch_size,
                add_bos=add_bos,
                packing=bool(c.eval.packing),
                length_buckets=buckets,
            ),
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
        )


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
