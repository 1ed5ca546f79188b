"""Helpers shared by the tests: tiny random checkpoints, text from the Python installation, a
byte-level BPE trained at test time, and a NumPy reference model."""

from __future__ import annotations

import dataclasses
import os
import socket

import numpy as np

from ppl_jax.checkpoints import architecture, open_checkpoint
from ppl_jax.models.decoders.llama import LlamaConfig
from ppl_jax.models.layers import kernels, packed
from ppl_jax.runtime import mesh as mesh_lib
from ppl_jax.testing import (  # noqa: F401  (the tests' names for the shared pieces)
    TEXT_MODULES,
    TINY,
    random_params,
    save_random_checkpoint,
    stdlib_text,
)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GOLDEN = os.path.join(REPO, "tests", "golden")
# Data the project may not ship (WikiText-2, the GPT-2 tokenizer): only tests/shared_data/ reads
# it, from the folder this environment variable names (.ci/run sets it).
TEST_DATA_ENV = "PPL_JAX_TEST_DATA"

EOT = "<|endoftext|>"

# The llama3 rope scaling of the tiny Llama references (transformers `rope_parameters`).
LLAMA3_ROPE = {
    "rope_type": "llama3",
    "rope_theta": 5000.0,
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 64,
}  # head_dim 8: all three frequency bands


def corpus_files(tmp_path, texts: list[str], name: str = "doc") -> str:
    """Writes each text to its own file; returns a comma-separated list of the paths."""
    paths = []
    for i, text in enumerate(texts):
        p = tmp_path / f"{name}{i}.txt"
        p.write_text(text, encoding="utf-8")
        paths.append(str(p))
    return ",".join(paths)


def train_bpe(texts: list[str], vocab_size: int = 512, specials: tuple[str, ...] = (EOT,)):
    """A GPT-2-style byte-level BPE (`tokenizers.Tokenizer`) trained on `texts`: all 256 bytes in
    its alphabet, so that any text encodes; `specials` take the first ids (EOT is 0)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(specials),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer)
    return tok


def bpe_file(path: str, vocab_size: int = 512) -> str:
    """Trains `train_bpe` on stdlib text and saves it as a tokenizer.json at `path`."""
    train_bpe([stdlib_text(200_000)], vocab_size).save(path)
    return path


# ---------------------------------------------------------------- NumPy float64 reference model


def _rms(x, w, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def _rope(x, pos, theta):
    half = x.shape[-1] // 2
    inv = 1.0 / theta ** (np.arange(half, dtype=np.float64) / half)
    ang = pos[:, None] * inv[None, :]  # [T, half]
    cos, sin = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
    x1, x2 = x[..., :half], x[..., half:]
    return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)


def reference_token_nll(params: dict, cfg: LlamaConfig, tokens: np.ndarray) -> np.ndarray:
    """Per-token NLL (nats) of `tokens[1:]` given the prefix, in NumPy float64, for one sequence.

    An independent implementation of the Llama forward pass (HF `modeling_llama` semantics).
    """
    logits = reference_logits(params, cfg, tokens[:-1])
    m = logits.max(-1, keepdims=True)
    lse = (m + np.log(np.exp(logits - m).sum(-1, keepdims=True)))[:, 0]
    return lse - logits[np.arange(logits.shape[0]), tokens[1:]]


def reference_logits(params: dict, cfg: LlamaConfig, inputs: np.ndarray) -> np.ndarray:
    """`[T, vocab]` float64 logits of the Llama forward pass over `inputs` (one sequence), in
    NumPy (HF `modeling_llama` semantics)."""
    p = {k: v for k, v in params.items()}
    f = lambda a: np.asarray(a, np.float64)  # noqa: E731
    t = inputs.size
    pos = np.arange(t, dtype=np.float64)
    x = f(p["embedding"])[inputs]
    g = cfg.num_heads // cfg.num_kv_heads
    causal = np.tril(np.ones((t, t), bool))
    for i in range(cfg.num_layers):
        lp = p["layers"][str(i)]
        h = _rms(x, f(lp["attn_norm"]), cfg.norm_eps)
        q = _rope(np.einsum("td,dhk->thk", h, f(lp["attn"]["q"])), pos, cfg.rope_theta)
        k = _rope(np.einsum("td,dhk->thk", h, f(lp["attn"]["k"])), pos, cfg.rope_theta)
        v = np.einsum("td,dhk->thk", h, f(lp["attn"]["v"]))
        k = np.repeat(k, g, axis=1)
        v = np.repeat(v, g, axis=1)
        s = np.einsum("qhk,shk->hqs", q, k) / np.sqrt(cfg.head_dim)
        s = np.where(causal[None], s, -np.inf)
        s = np.exp(s - s.max(-1, keepdims=True))
        a = s / s.sum(-1, keepdims=True)
        o = np.einsum("hqs,shk->qhk", a, v)
        x = x + np.einsum("thk,hkd->td", o, f(lp["attn"]["o"]))
        h = _rms(x, f(lp["mlp_norm"]), cfg.norm_eps)
        gate = h @ f(lp["mlp"]["gate"])
        x = x + ((gate / (1 + np.exp(-gate))) * (h @ f(lp["mlp"]["up"]))) @ f(lp["mlp"]["down"])
    x = _rms(x, f(p["final_norm"]), cfg.norm_eps)
    w = f(p["embedding"]).T if cfg.tie_embeddings else f(p["lm_head"])
    return x @ w


MULTIPROCESS_FOLDER = "tests/multiprocess/"


def free_port() -> int:
    """A free TCP port on localhost (the coordinator of a run on several processes)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def process_env(process_id: int = 0, num_processes: int = 1, port: int = 0) -> dict[str, str]:
    """The environment of one command-line process of a CPU run over 8 fake devices in all: on
    several processes, each gets `8 // num_processes` and joins through `jax.distributed` on
    localhost (`ppl_jax.runtime.distributed.initialize_from_env`).

    A test that starts several processes lives in tests/multiprocess/ (its tier, by folder:
    tests/conftest.py); one elsewhere fails here, whatever its name or markers.
    """
    running = os.environ.get("PYTEST_CURRENT_TEST", "")
    if num_processes > 1 and running and not running.startswith(MULTIPROCESS_FOLDER):
        raise AssertionError(
            f"{running.split(' ')[0]} starts {num_processes} processes: move it to "
            f"{MULTIPROCESS_FOLDER} (the multiprocess tier is the folder)"
        )
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    env["XLA_FLAGS"] = xla_flags(8 // num_processes)
    if num_processes > 1:
        env.update(
            PPL_JAX_COORDINATOR=f"127.0.0.1:{port}",
            PPL_JAX_NUM_PROCESSES=str(num_processes),
            PPL_JAX_PROCESS_ID=str(process_id),
        )
    return env


def xla_flags(devices: int | None = None, *, optimized: bool = False) -> str:
    """XLA_FLAGS for a process a test starts: this process's flags (tests/conftest.py: the
    compiler's optimisation level) with `devices` fake CPU devices, or none named (`None`: one
    device, as on a user's machine). `optimized=True` drops the suite's optimisation level and
    classic emitters, for a process whose run costs more than its compiles (the demo's whole
    run)."""
    dropped = ["--xla_force_host_platform_device_count"]
    if optimized:
        dropped += ["--xla_backend_optimization_level", "--xla_cpu_use_fusion_emitters"]
    flags = [
        flag
        for flag in os.environ.get("XLA_FLAGS", "").split()
        if not flag.startswith(tuple(dropped))
    ]
    if devices is not None:
        flags.append(f"--xla_force_host_platform_device_count={devices}")
    return " ".join(flags)


def token_rows(path: str, document: int):
    """One document's rows of a `tokens.parquet` (`path`), sorted by offset, as NumPy columns
    (attributes named as the file's columns); pyarrow alone, no pandas."""
    import types

    import pyarrow.parquet as pq

    table = pq.read_table(path)
    cols = {n: table.column(n).to_numpy() for n in table.column_names}
    keep = np.flatnonzero(cols["document"] == document)
    keep = keep[np.argsort(cols["offset"][keep], kind="stable")]
    return types.SimpleNamespace(**{n: c[keep] for n, c in cols.items()})


def chunked_scan(scan_fn, args, segments, chunk=8, initial_state=None, starts=None):
    """One of the chunked scans of `ppl_jax.models.layers` (`gated_delta.chunk_gated_delta_rule`,
    `ssd.ssd_scan`: `scan_fn(*args, starts, chunk=..., initial_state=...)`), jitted, on the NumPy
    float32 `args`; the segment starts are those of the segment ids `segments [B, T]` unless
    `starts [B, T] bool` is given. Returns its output and final state as float64 NumPy arrays."""
    import jax
    import jax.numpy as jnp

    from ppl_jax.models.layers import recurrence

    starts = recurrence.segment_starts(jnp.asarray(segments)) if starts is None else starts
    out, state = jax.jit(scan_fn, static_argnames="chunk")(
        *map(jnp.asarray, args), starts, chunk=chunk, initial_state=initial_state
    )
    return np.asarray(out, np.float64), np.asarray(state, np.float64)


def chunk_size_spread(scan, args, chunks=(3, 5, 8, 13, 29, 32)) -> tuple[float, float]:
    """How far `scan(args, chunk=c)`'s output moves from that of chunks of 64 over `chunks` (the
    largest absolute difference), and the largest absolute output: `scan` is a test's
    `chunked_scan` with its layer and segments bound."""
    base, _ = scan(args, chunk=64)
    spread = max(float(np.abs(scan(args, chunk=c)[0] - base).max()) for c in chunks)
    return spread, float(np.abs(base).max())


def restored_packed(path, mesh, setting, dtype="float32"):
    """(the model of the checkpoint `path` with `checkpoint.dequantize=setting`, its params
    restored onto `mesh`, its `architecture.Dequantization`): the packed-weight tests' model."""
    ckpt = open_checkpoint(path, dequantize=setting)
    model = architecture.resolve(ckpt).model(dtype, "xla")
    model, dequantization = architecture.packed(ckpt, None, model, setting)
    target, _ = mesh_lib.param_targets(
        model.abstract_params, model.logical_axes, mesh, mesh_lib.DEFAULT_RULES
    )
    return model, ckpt.restore(None, target), dequantization


def bits(x) -> np.ndarray:
    """A float weight (a packed one dequantized) as its bits, for bit-for-bit comparisons."""
    x = np.asarray(x[...] if packed.is_packed(x) else x)
    return x.view({2: np.uint16, 4: np.uint32}[x.dtype.itemsize])


def tokamax_installed(monkeypatch, installed: bool) -> None:
    """The attention kernels' table as if tokamax (the `gpu` extra) were installed here or not,
    whatever this Python has: the `tokamax` record's `installed`, and its `present` (a GPU)."""
    record = dataclasses.replace(
        kernels.KERNELS["tokamax"],
        installed=lambda: installed,
        present=lambda platform: installed and platform == "gpu",
    )
    monkeypatch.setitem(kernels.KERNELS, "tokamax", record)


def host_and_packed_runs(tmp_path, checkpoint_dir: str, configure=None) -> dict[str, dict]:
    """`results.json` of a run of the checkpoint at `checkpoint_dir` with its quantized weights
    dequantized on the host and one with them packed (`checkpoint.dequantize=host`, `auto`), by
    setting: a small corpus of bytes in windows of 32; `configure(c)`, if given, changes the
    config of both further (a mesh, a dtype)."""
    import json

    from ppl_jax.config.defaults import get_config
    from ppl_jax.config.settings import from_config
    from ppl_jax.evaluation.run import evaluate
    from ppl_jax.outputs.folder import OutputDir

    corpus = tmp_path / "c.txt"
    corpus.write_text("a small corpus of bytes to score, twice over. " * 8)
    results = {}
    for setting in ("host", "auto"):
        c = get_config()
        c.checkpoint.dir, c.checkpoint.dequantize = str(checkpoint_dir), setting
        c.data.path, c.data.tokenizer, c.data.allow_tokenizer_mismatch = str(corpus), "byte", True
        c.eval.seq_len = 32
        c.output.dir, c.output.progress = str(tmp_path / setting), False
        if configure is not None:
            configure(c)
        spec = from_config(c)
        with OutputDir.open(spec.output_dir) as out:
            evaluate(spec, out=out)
        results[setting] = json.loads((tmp_path / setting / "results.json").read_text())
    return results
