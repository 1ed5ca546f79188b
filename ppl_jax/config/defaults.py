"""The evaluation config: the default `ml_collections.ConfigDict`, and its frozen, checked form.

Config files in `configs/` return a `ConfigDict` from `get_config()`; this module is itself such a
file (the built-in default used when `--config` is omitted). `ProtocolSpec.from_config` turns the
ConfigDict into frozen dataclasses at the boundary, checking every value; nothing downstream (and
nothing under `jax.jit`) sees a ConfigDict.
"""

from __future__ import annotations

import json
import os
from typing import Any

from ml_collections import config_dict

from ppl_jax.data.documents import FORMATS  # noqa: F401  (the config's choices, for --help)
from ppl_jax.data.spec import DEMO_CORPUS_NAME  # noqa: F401
from ppl_jax.data.spec import corpus_name as spec_corpus_name
from ppl_jax.evaluation.spec import CHECKPOINT_FORMATS, DTYPES  # noqa: F401
from ppl_jax.plans.protocols import PROTOCOLS, SLIDING
from ppl_jax.runtime.mesh import DEFAULT_RULES  # noqa: F401
from ppl_jax.scoring.nll import MAX_TOP_K

# Modules of the CPython standard library that the demo model never saw in training
# (launch/train_demo.py leaves them out); the default run scores their CPython 3.11.7 text,
# shipped with the package (`held_out_paths`), so that its figure is the same on every Python.
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


MIN_BOOTSTRAP_SAMPLES = 100  # fewer leave a 95% interval's 2.5% tails a sample or two


def demo_checkpoint_dir() -> str:
    """The demo checkpoint shipped inside the package (see `launch/train_demo.py`)."""
    return os.path.join(
        os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "demo", "checkpoint"
    )


def held_out_paths() -> str:
    """Comma-separated paths of the demo's held-out text, shipped inside the package: the
    `HELD_OUT_MODULES` of CPython 3.11.7, unmodified, as `ppl_jax/demo/held_out/<name>.txt`
    (PSF License; `ppl_jax/demo/held_out/README.txt` says where they come from)."""
    folder = os.path.join(os.path.dirname(demo_checkpoint_dir()), "held_out")
    return ",".join(os.path.join(folder, f"{name}.txt") for name in HELD_OUT_MODULES)


def get_config() -> config_dict.ConfigDict:
    """The built-in default: the demo checkpoint on its held-out text (`held_out_paths`).

    Each key's meaning is in `KEY_MEANINGS` (shown by `ppl-jax --help`).
    """
    c = config_dict.ConfigDict()
    c.checkpoint = _checkpoint_keys()
    c.data = _data_keys()

    # Several datasets scored by one run (a config file's list of ConfigDicts, each with the
    # keys of `data` it changes and its own `name`, plus `protocol`, `seq_len`, `stride`,
    # `add_bos`, `long_documents`); empty: the one dataset of `data`. See configs/suite_example.py.
    c.suite = ()

    c.eval = _eval_keys()

    c.model = config_dict.ConfigDict()
    c.model.dtype = "float32"
    c.model.attention = "auto"
    c.model.context_attention = "all_gather"  # or ring (ppl_jax.models.layers.context)
    c.model.token_chunk = 0  # per-token layers' tokens at once per device; 0: all (NLL: bounded)
    c.model.rope_angles = "float32"  # RoPE angles: transformers' float32, or exact (long windows)
    c.model.matmul_precision = "auto"  # matrix products: auto (float32: highest), highest, ...

    c.mesh = config_dict.ConfigDict()
    c.mesh.data = -1
    c.mesh.context = 1
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

    c.study = config_dict.ConfigDict()  # the original (checkpoint.*) and its copies, one pass
    c.study.copies = ""  # "NAME=DIR,NAME=DIR"; empty: no study
    c.study.both_directions = False  # also KL(copy || original)

    c.runtime = config_dict.ConfigDict()
    c.runtime.compilation_cache_dir = ""

    c.longppl = config_dict.ConfigDict()  # LongPPL (Fang et al. 2025), with eval.short_context
    c.longppl.alpha = 2.0  # nats: a key token's loss drops by more than this with long context
    c.longppl.beta = -2.0  # ... and its long-context loss is below -beta nats
    c.longppl.evaluator = config_dict.ConfigDict()
    c.longppl.evaluator.dir = ""  # empty: the scored model finds its own key tokens
    c.longppl.evaluator.step = "latest"
    c.longppl.evaluator.format = "auto"
    c.longppl.evaluator.dtype = "float32"

    c.output = _output_keys()
    return c


def _checkpoint_keys() -> config_dict.ConfigDict:
    """`checkpoint.*`: which checkpoint, which steps, and how another trainer's is read."""
    s = config_dict.ConfigDict()
    s.dir = demo_checkpoint_dir()
    s.step = "latest"
    s.format = "auto"
    s.watch = False
    s.watch_until = -1  # watch: stop once this step is evaluated (-1: idle timeout only)
    s.watch_timeout = 600.0  # watch: seconds without a new step before it ends
    s.watch_interval = 10.0  # watch: seconds between two looks at checkpoint.dir
    s.architecture = ""  # another trainer's checkpoint: where the architecture comes from
    s.mapping = ""  # another trainer's checkpoint: a preset or a YAML mapping file
    s.item = ""  # the Orbax item holding the params ("": found)
    s.params = ""  # the params subtree inside the item ("": found)
    s.allow_download = False  # a hub id may be downloaded (default: local cache only)
    s.dequantize = "auto"  # quantized weights: packed on the device where exact, or on the host
    return s


def _data_keys() -> config_dict.ConfigDict:
    """`data.*`: the corpus, how it is read, prepared, cut to a budget and cached."""
    s = config_dict.ConfigDict()
    s.name = ""  # derived from data.path (see `corpus_name`)
    s.path = held_out_paths()
    s.format = "auto"
    s.tokenizer = "auto"
    s.errors = "strict"
    s.separator = "\n\n"
    s.jsonl_field = "text"
    s.allow_tokenizer_mismatch = False
    s.preparation = ""  # a standard preparation of the text (ppl_jax.data.preparations)
    s.tags = ""  # e.g. "domain=web,split=val": groups of the macro averages
    s.max_documents = 0  # budget: at most this many documents (0: all)
    s.max_tokens = 0  # budget: the documents' first this many tokens, the last cut (0: all)
    s.sample_seed = -1  # budgets take the first documents (-1) or a sample with this seed
    s.cache_dir = ""  # token and plan caches (ppl_jax.plans.token_cache, ppl_jax.plans.plan_cache)
    s.fingerprint = "stat"  # corpus files in cache keys and journals: stat or content
    return s


def _eval_keys() -> config_dict.ConfigDict:
    """`eval.*`: the protocol, windows and batches, and the context measures."""
    s = config_dict.ConfigDict()
    s.protocol = SLIDING.name
    s.seq_len = 256
    s.stride = config_dict.placeholder(int)  # unset: seq_len // 2 where a protocol uses it
    s.batch_size = 8
    s.add_bos = "auto"
    s.long_documents = ""  # whole_documents: sliding or truncate a longer one ("": refuse)
    s.packing = True
    s.length_buckets = 1
    s.context_lengths = ""  # e.g. "64,128,256": the context-length sweep (off when empty)
    s.context_targets = 0  # targets per window of the sweep; 0: min(L, positions - L + 1)
    s.short_context = 0  # whole_documents: context gains and LongPPL's short context (0: off)
    s.short_targets = 1024  # targets per short-context window (contexts C..C+S-1)
    return s


def _output_keys() -> config_dict.ConfigDict:
    """`output.*`: the output folder, journal, per-token output, curves, figures and sinks."""
    s = config_dict.ConfigDict()
    s.dir = "results"
    s.progress = True
    s.gzip_baseline = True
    s.per_document = False
    s.journal_every = 50
    s.resume = True
    s.tokens = False
    s.top_k = 0
    s.position_curve = False
    s.figures = "png"  # the curves' figure files: png, pdf, svg, or several ("pdf,png")
    s.figure_size = ""  # WIDTHxHEIGHT in inches; "": each figure's own
    s.figure_dpi = 100  # pixels per inch of a PNG
    s.sinks = ""  # record sinks beyond results.json and results.jsonl: "tensorboard"
    s.tensorboard = False  # shorthand for output.sinks=tensorboard
    return s


# One line per key of `get_config()` (a test checks that the two name the same keys); `--help`
# prints them with the defaults.
KEY_MEANINGS = {
    "checkpoint.dir": "an Orbax CheckpointManager directory of numbered steps (ppl_jax's, MaxText's, "
    "a Linen or NNX loop's), a bare Orbax directory (gemma), a Hugging Face directory, or a hub "
    "id 'hf://org/name[@revision]' (or a bare 'org/name' that is not a path)",
    "checkpoint.step": "'latest' (the newest finalized step), a step number, 'all', a list "
    "'1000,2000' or a range 'first:last:every' (last included); for a hub id, revisions "
    "'step1000,step2000'",
    "checkpoint.architecture": "the architecture of a checkpoint that carries none (it wins over "
    "one that does): a config.json, a ppl_jax description JSON, 'maxtext:<model> key=value ...', "
    "or a Python entry point 'module:function' returning a LanguageModel",
    "checkpoint.mapping": "stored names to model weights: '' (ppl_jax's own layout, else "
    "detected), a preset ('maxtext', 'gemma', 'identity') or a YAML/JSON mapping file",
    "checkpoint.item": "the Orbax item holding the params ('': state, items, default, model, "
    "pytree, or a bare directory)",
    "checkpoint.params": "the params subtree inside the item ('': params/params, params, or the "
    "whole item)",
    "checkpoint.allow_download": "a hub id may be downloaded from the hub (default: resolved "
    "from the local hub cache only; HF_HUB_OFFLINE=1 forbids downloads)",
    "checkpoint.watch": "keep evaluating steps as they are finalized, until checkpoint."
    "watch_until or checkpoint.watch_timeout",
    "checkpoint.watch_until": "watch: the last step to evaluate (-1: none)",
    "checkpoint.watch_timeout": "watch: seconds without a new finalized step before the run ends",
    "checkpoint.watch_interval": "watch: seconds between two looks at checkpoint.dir",
    "checkpoint.dequantize": "where a quantized checkpoint's weights are dequantized: 'auto' "
    "(kept packed on the device and dequantized inside each layer, where the format has a device "
    "path: GGUF's Q4_0 to Q8_0, K-quants and MXFP4; Hugging Face's GPTQ, AWQ, "
    "compressed-tensors, FP8 and MXFP4; else on the host as they are read), "
    "'device' (as auto, refusing a checkpoint with no weight it can pack), or 'host' (every "
    "weight dequantized as it is read)",
    "checkpoint.format": "'auto' (the reader its markers choose; ppl-jax inspect says which), or "
    "'orbax' / 'hf' / 'levanter' / 'easydel' / 't5x' / 'gguf' (only that layout's readers)",
    "data.name": "the corpus's name in the results; empty: derived from data.path",
    "data.path": "a file, a glob, or a comma-separated list of either",
    "data.format": "'auto' (jsonl for .jsonl/.ndjson files, a .json or .parquet file refused, "
    "else text), 'text' (a file is a document), 'lines' (each non-empty line), 'jsonl', "
    "'wikitext' (articles at ' = Title = ' headings)",
    "data.tokenizer": "'auto' (the checkpoint's own), 'byte', a tokenizer.json, a SentencePiece "
    ".model, or an HF directory",
    "data.errors": "'strict' fails on bytes that are not UTF-8 (file and offset); 'replace'",
    "data.separator": "text placed between documents in the stream (sliding)",
    "data.jsonl_field": "the field of a jsonl record that holds the text",
    "data.allow_tokenizer_mismatch": "score with a tokenizer whose vocabulary does not fit the "
    "model's (refused when false)",
    "data.preparation": "a standard preparation of the text: 'lm_eval_wikitext', "
    "'hf_guide_wikitext', or '' (none)",
    "data.tags": "tags of the dataset, 'key=value,...', grouping the macro averages",
    "data.max_documents": "at most this many documents (0: all)",
    "data.max_tokens": "the documents' first this many tokens (no BOS or separator), the last "
    "document cut at a token boundary (0: all)",
    "data.sample_seed": "the budgets take the first documents in file order (-1) or a sample "
    "drawn with this seed",
    "data.cache_dir": "a folder (shared by every host) where each corpus is tokenized once, in "
    "shares across processes, and each plan cached (memory-mapped by later runs; matched to the "
    "files by data.fingerprint); '': no cache",
    "data.fingerprint": "how corpus files are identified in the cache keys and the journal: "
    "'stat' (path, size, modification time and 16 sampled 4 KiB blocks: an edit between them "
    "that keeps the size and time is missed) or 'content' (SHA-256 of every byte, 2.4-3.5 s per GiB)",
    "suite": "several datasets in one run (config files: a list of ConfigDicts); empty: data.*",
    "eval.protocol": "which tokens are scored, and how: " + ", ".join(PROTOCOLS),
    "eval.seq_len": "tokens the model reads per window (at most its positions)",
    "eval.stride": "tokens a window advances by, 1..seq_len, for sliding and hf_strided (and "
    "eval.long_documents=sliding); unset: seq_len // 2; ignored by the other protocols",
    "eval.batch_size": "rows per step at most, global over all processes; a multiple of "
    "mesh.data (the batches share the rows evenly: 18 rows in batches of 8 run as 3 of 6)",
    "eval.add_bos": "BOS before the text: 'auto' (the tokenizer's own policy), 'true', 'false'",
    "eval.long_documents": "whole_documents: the rule for a document longer than a window, "
    "'sliding' (windows every eval.stride tokens within it) or 'truncate' (its first window); "
    "empty: such a document is refused",
    "eval.packing": "several short windows per row (segments, no attention across them)",
    "eval.length_buckets": "row widths a run may compile, 1..8 (1: every row is seq_len + 1; "
    "packed rows use two at most: the last batch, of the shortest windows, narrower)",
    "eval.context_lengths": "context lengths of a sweep that scores the same targets with each, "
    "e.g. '64,128,256' (empty: no sweep)",
    "eval.context_targets": "targets per window of the context-length sweep (0: L at length L, "
    "so each target sees L..2L-1 tokens)",
    "model.dtype": "parameter dtype, 'float32' or 'bfloat16' (log-softmax is always float32)",
    "model.rope_angles": "rotary angles: 'float32' (transformers' arithmetic, equal to it) or "
    "'exact' (reduced in float64 on the host; float32 drifts by up to 0.06 rad at 1M positions)",
    "model.attention": "'xla', 'cudnn' (GPU, 16-bit), 'tokamax' (GPU, the gpu extra: "
    "soft-caps), 'splash' (TPU), or 'auto' (the fastest "
    "kernel that can do each layer's attention on the platform; results.json's "
    "attention_layers names it per kind of layer)",
    "model.matmul_precision": "precision of the matrix products: 'auto' ('highest' for a "
    "float32 model or reference, else 'default'), 'highest' (float32 on every backend), "
    "'default' (the backend's: TF32 on NVIDIA GPUs, one bfloat16 pass on TPUs), "
    "'tensorfloat32' (JAX's HIGH) or 'bf16_3x' (three bfloat16 products)",
    "model.context_attention": "how attention crosses mesh.context: 'all_gather' (each device "
    "gathers a layer's keys and values) or 'ring' (they go round the devices: less memory)",
    "model.token_chunk": "tokens the MLP and the NLL take at once on each device, and on one "
    "device the queries of each layer of a longer window (0: the MLP and the queries all at "
    "once, the NLL as many as keep its float32 logits of 4096 ids within 128 MiB per device, "
    "shared by a host's CPU devices; e.g. 16384 for windows of 1M tokens)",
    "mesh.data": "devices along the data axis; -1: the devices left over",
    "mesh.context": "devices along the context axis, over which each window's tokens are split "
    "(long windows); -1: the devices left over",
    "mesh.model": "devices along the model axis (weights sharded)",
    "mesh.rules": "logical axis name -> mesh axis, for sharding weights",
    "metrics.bootstrap_samples": "resamples of the 95% bootstrap intervals of perplexity and "
    "bits per byte (0: no intervals; else at least 100)",
    "metrics.seed": "seed of the bootstrap's resampling (the intervals are reproducible)",
    "eval.short_context": "whole_documents: tokens of a short context C; every target with more "
    "context is scored again with C..C+S-1 tokens, for its context gain (short NLL - full NLL) "
    "and LongPPL's key tokens (0: off)",
    "eval.short_targets": "S, targets per short-context window (each sees C..C+S-1 tokens; the "
    "LongPPL reference's sliding_window)",
    "longppl.alpha": "LongPPL: a key token's NLL with the short context exceeds its full-context "
    "NLL by more than alpha nats",
    "longppl.beta": "LongPPL: and its full-context NLL is below -beta nats",
    "longppl.evaluator.dir": "the model that finds LongPPL's key tokens (its own tokenizer; "
    "tokens matched by characters); empty: the scored model, on its own tokens",
    "longppl.evaluator.step": "the evaluator's step: 'latest' or a step number",
    "longppl.evaluator.format": "the evaluator's format: 'orbax', 'hf', or 'auto'",
    "longppl.evaluator.dtype": "the evaluator's parameter dtype, 'float32' or 'bfloat16'",
    "reference.checkpoint.dir": "a reference model (same tokenizer) scored beside the model "
    "for KL(reference || model); empty: none",
    "reference.checkpoint.step": "the reference's step: 'latest' or a step number",
    "reference.checkpoint.format": "the reference's format: 'orbax', 'hf', or 'auto'",
    "reference.dtype": "the reference's parameter dtype, 'float32' or 'bfloat16'",
    "study.copies": "copies of the model (quantized, ...) scored against it in the same pass, "
    "'NAME=DIR,NAME=DIR' (read in model.dtype); empty: none",
    "study.both_directions": "a study also reports KL(copy || original)",
    "runtime.compilation_cache_dir": "JAX's persistent compilation cache ('': off)",
    "output.dir": "where process 0 writes results.json",
    "output.progress": "a progress bar on stderr",
    "output.gzip_baseline": "also report the bits per byte of gzip -9 on the same text (its "
    "first 64 MiB, on process 0)",
    "output.per_document": "also write documents.jsonl (document-level protocols)",
    "output.journal_every": "batches between journal flushes (the journal lets an interrupted "
    "run resume)",
    "output.resume": "resume from a matching journal in output.dir",
    "output.tokens": "also write tokens.parquet: every scored token's NLL, surprisal, entropy",
    "output.top_k": f"with output.tokens, the k most probable tokens at each position, "
    f"0..{MAX_TOP_K}",
    "output.position_curve": "also write position_curve.json and its figure: perplexity by "
    "position in the window, with 95% bands",
    "output.figures": "the file formats of the curves' figures, by extension: png (raster), pdf, "
    "svg (vector), or several, comma-separated (pdf,png)",
    "output.figure_size": "the curves' figures' WIDTHxHEIGHT in inches (e.g. 3.5x2.5); empty: "
    "7x4.5",
    "output.figure_dpi": "pixels per inch of a PNG figure (1..1200)",
    "output.sinks": "where records go beyond results.json and results.jsonl, comma-separated: "
    "'tensorboard' (scalars eval/<dataset>/<metric> in output.dir/tensorboard)",
    "output.tensorboard": "also write TensorBoard scalars eval/<dataset>/<metric> in "
    "output.dir/tensorboard (the same as output.sinks=tensorboard)",
}

# Defaults too long to print whole in `--help`.
_DEFAULT_LABELS = {
    "checkpoint.dir": "the demo checkpoint",
    "data.path": "the demo's held-out text",
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
    """The corpus name of `data.path` (`ppl_jax.data.spec.corpus_name`; the demo's default path
    is `DEMO_CORPUS_NAME`)."""
    return spec_corpus_name(path, held_out_paths())
