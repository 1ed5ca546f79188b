"""The evaluation config: the default `ml_collections.ConfigDict`, and its frozen, checked form.

Config files in `configs/` return a `ConfigDict` from `get_config()`; this module is itself such a
file (the built-in default used when `--config` is omitted). `EvalSettings.from_config` turns the
ConfigDict into frozen dataclasses at the boundary, checking every value; nothing downstream (and
nothing under `jax.jit`) sees a ConfigDict.
"""

from __future__ import annotations

import dataclasses
import os
import sysconfig

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
FORMATS = ("text", "lines", "jsonl", "wikitext")
CHECKPOINT_FORMATS = ("auto", "orbax", "hf")
DTYPES = ("float32", "bfloat16")


def demo_checkpoint_dir() -> str:
    """The demo checkpoint shipped inside the package (see `launch/train_demo.py`)."""
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "demo", "checkpoint")


def held_out_paths() -> str:
    """Comma-separated paths of the held-out standard-library modules on this machine."""
    stdlib = sysconfig.get_paths()["stdlib"]
    return ",".join(os.path.join(stdlib, name) for name in HELD_OUT_MODULES)


def get_config() -> config_dict.ConfigDict:
    """The built-in default: the demo checkpoint on the held-out standard-library modules."""
    c = config_dict.ConfigDict()
    c.checkpoint = config_dict.ConfigDict()
    c.checkpoint.dir = demo_checkpoint_dir()
    c.checkpoint.step = "latest"  # "latest" or an integer step
    c.checkpoint.format = "auto"  # "auto", "orbax", or "hf" (a Hugging Face directory)

    c.data = config_dict.ConfigDict()
    c.data.name = "cpython-stdlib-held-out"
    c.data.path = held_out_paths()
    c.data.format = "text"
    c.data.tokenizer = "auto"  # "auto" (the checkpoint's), "byte", or a tokenizer.json path
    c.data.errors = "strict"  # "strict" or "replace" for text that is not UTF-8
    c.data.separator = "\n\n"  # text joining documents into one stream
    c.data.jsonl_field = "text"
    c.data.allow_tokenizer_mismatch = False

    c.eval = config_dict.ConfigDict()
    c.eval.protocol = "sliding"
    c.eval.seq_len = 256
    # None: equal to seq_len (disjoint windows). The demo scores with half-overlapping windows.
    c.eval.stride = config_dict.placeholder(int)
    c.eval.stride = 128
    c.eval.batch_size = 8  # global, over all processes
    c.eval.add_bos = "auto"  # "auto" (the tokenizer's own policy), "true", "false"
    c.eval.packing = True  # several short windows per row (segments), where they fit
    c.eval.length_buckets = 1  # row widths a run may compile (1: every row is seq_len + 1)

    c.model = config_dict.ConfigDict()
    c.model.dtype = "float32"
    c.model.attention = "auto"  # "auto", "xla", "cudnn" (GPU, 16-bit), "splash" (TPU)

    c.mesh = config_dict.ConfigDict()
    c.mesh.data = -1  # -1: the devices left over
    c.mesh.model = 1
    c.mesh.rules = DEFAULT_RULES

    c.runtime = config_dict.ConfigDict()
    c.runtime.compilation_cache_dir = ""  # JAX's persistent compilation cache ("" = off)

    c.output = config_dict.ConfigDict()
    c.output.dir = "results"
    c.output.progress = True
    c.output.gzip_baseline = True
    c.output.per_document = False  # documents.jsonl, for document-level protocols
    c.output.journal_every = 50
    c.output.resume = True
    return c


@dataclasses.dataclass(frozen=True)
class DataSettings:
    name: str
    path: str
    format: str
    tokenizer: str
    errors: str
    separator: str
    jsonl_field: str
    allow_tokenizer_mismatch: bool = False


@dataclasses.dataclass(frozen=True)
class EvalSettings:
    protocol: str
    seq_len: int
    stride: int
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
    journal_every: int = 50
    resume: bool = True

    @staticmethod
    def from_config(c: config_dict.ConfigDict) -> Settings:
        """Checks `c` and freezes it.

        Raises:
          ConfigError: naming the setting, for a value out of range or of the wrong kind.
        """
        step = c.checkpoint.step
        if isinstance(step, str) and step.strip().lower() == "latest":
            step = None
        else:
            try:
                step = int(step)
            except (TypeError, ValueError):
                raise ConfigError(
                    f"checkpoint.step={step!r} is neither 'latest' nor an integer step number."
                ) from None
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
        stride = seq_len if c.eval.stride is None else int(c.eval.stride)
        if not 1 <= stride <= seq_len:
            raise ConfigError(
                f"eval.stride={stride} is outside 1..eval.seq_len ({seq_len}); a stride of "
                f"seq_len scores disjoint windows, a smaller one gives each token more context."
            )
        batch_size = int(c.eval.batch_size)
        if batch_size < 1:
            raise ConfigError(f"eval.batch_size={batch_size} must be at least 1.")
        buckets = int(c.eval.length_buckets)
        if not 1 <= buckets <= 8:
            raise ConfigError(f"eval.length_buckets={buckets} must be between 1 and 8.")
        rules = tuple((str(k), None if v is None else str(v)) for k, v in c.mesh.rules)
        return Settings(
            checkpoint_dir=os.path.expanduser(str(c.checkpoint.dir)),
            checkpoint_step=step,
            checkpoint_format=str(c.checkpoint.format),
            data=DataSettings(
                name=str(c.data.name),
                path=str(c.data.path),
                format=str(c.data.format),
                tokenizer=str(c.data.tokenizer),
                errors=str(c.data.errors),
                separator=str(c.data.separator),
                jsonl_field=str(c.data.jsonl_field),
                allow_tokenizer_mismatch=bool(c.data.allow_tokenizer_mismatch),
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
            journal_every=int(c.output.journal_every),
            resume=bool(c.output.resume),
        )


def _choice(name: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ConfigError(f"{name}={value!r} is not one of {', '.join(allowed)}.")
