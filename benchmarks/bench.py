"""Benchmark: ppl_jax against Hugging Face transformers (PyTorch) on the same weights and tokens.

    python -m benchmarks.bench                          # GPT-2 small (124M), seq_len 1024, CPU
    python -m benchmarks.bench --model=llama-1b --seq_len=2048 --dtype=bfloat16   # on a GPU
    python -m benchmarks.bench --vocab_sweep            # peak memory at vocabulary 32k vs 256k
    python -m benchmarks.bench --data_scale             # data preparation alone (benchmarks.bench_data)

Both sides score the same token chunks (WikiText-2 test through the GPT-2 tokenizer, ids taken
modulo the model's vocabulary; the `gptq_chunks` convention: each chunk of `seq_len` tokens scored
from its second token) with the same randomly initialised weights, saved once as a Hugging Face
safetensors directory. Each side runs in its own process, so that its peak host memory (RSS) and
whole-process time are its own. The peer is transformers' `AutoModelForCausalLM` with `sdpa`
attention, `torch.no_grad()`, log-softmax in float32, at the fastest of several batch sizes.

Reported per side: tokens/s in steady state (compilation and warm-up excluded) and over the whole
process (imports, weight loading and compilation included), peak host RSS, device peak memory on
GPU, the perplexity (the two must agree), and the ratios. On GPU, model FLOPs utilisation with
forward FLOPs per token = 2 x matmul parameters + 2 x layers x seq_len x attention width (every
query against the full window; the causal half is not discounted).
"""

from __future__ import annotations

import json
import math
import os
import resource
import subprocess
import sys
import time

from absl import app, flags

from benchmarks import bench_data

_MODEL = flags.DEFINE_enum("model", "gpt2", ["gpt2", "llama-1b", "llama-8b"], "Architecture.")
_SEQ = flags.DEFINE_integer("seq_len", 1024, "Tokens per chunk.")
_NUM = flags.DEFINE_integer("num_sequences", 16, "Chunks scored by each side.")
_DTYPE = flags.DEFINE_enum("dtype", "float32", ["float32", "bfloat16"], "Parameter dtype.")
_BATCH = flags.DEFINE_integer("batch_size", 4, "ppl_jax's batch size (chunks per step).")
_PEER_BATCHES = flags.DEFINE_list(
    "peer_batch_sizes", ["1", "2", "4"], "Batch sizes tried for the peer; the fastest is used."
)
_WORK = flags.DEFINE_string("work_dir", "/tmp/ppl_jax_bench", "Model and token cache.")
_OUT = flags.DEFINE_string("out", "bench_results.json", "Where to write the JSON results.")
_DATA = flags.DEFINE_string(
    "data", "", "Text to tokenize (default: WikiText-2 test of the data folder)."
)
_TOKENIZER = flags.DEFINE_string(
    "tokenizer", "", "tokenizer.json to tokenize it with (default: GPT-2 of the data folder)."
)
_ATTENTION = flags.DEFINE_list(
    "attention",
    ["auto"],
    "ppl_jax's attention implementations to measure, each in its own process (auto, xla, cudnn; "
    "xla@QxK: the XLA path in blocks of Q queries and K keys).",
)
_COMPARE_BF16 = flags.DEFINE_bool(
    "compare_bf16", True, "Also score with bfloat16 params and report the difference."
)
_VOCAB_SWEEP = flags.DEFINE_bool("vocab_sweep", False, "Measure memory at vocab 32k and 256k.")
_DATA_SCALE = flags.DEFINE_bool(
    "data_scale", False, "Measure data preparation alone (see benchmarks.bench_data)."
)
_SIDE = flags.DEFINE_enum("side", "", ["", "jax", "hf"], "Internal: run one side.")
_MODEL_DIR = flags.DEFINE_string("model_dir", "", "Internal: the model directory.")
_TOKENS = flags.DEFINE_string("tokens", "", "Internal: the .npy of token chunks.")

PEAK_FLOPS = {
    "H100": {"bfloat16": 989e12, "float32": 67e12},
    "H200": {"bfloat16": 989e12, "float32": 67e12},
}


def hf_config(name: str, vocab: int | None = None):
    """A transformers config of the named size (random weights; nothing is downloaded)."""
    import transformers

    if name == "gpt2":
        return transformers.GPT2Config(vocab_size=vocab or 50257)
    if name == "llama-1b":  # Llama-3.2-1B's shape
        return transformers.LlamaConfig(
            vocab_size=vocab or 128256,
            hidden_size=2048,
            intermediate_size=8192,
            num_hidden_layers=16,
            num_attention_heads=32,
            num_key_value_heads=8,
            max_position_embeddings=8192,
            tie_word_embeddings=True,
            rope_theta=500000.0,
        )
    if name == "llama-8b":  # Llama-3-8B's shape
        return transformers.LlamaConfig(
            vocab_size=vocab or 128256,
            hidden_size=4096,
            intermediate_size=14336,
            num_hidden_layers=32,
            num_attention_heads=32,
            num_key_value_heads=8,
            max_position_embeddings=8192,
            tie_word_embeddings=False,
            rope_theta=500000.0,
        )
    if name == "llama-small":  # for the vocabulary sweep
        return transformers.LlamaConfig(
            vocab_size=vocab or 32000,
            hidden_size=512,
            intermediate_size=1408,
            num_hidden_layers=4,
            num_attention_heads=8,
            num_key_value_heads=4,
            max_position_embeddings=4096,
            tie_word_embeddings=False,
        )
    raise ValueError(name)


def make_model_dir(name: str, vocab: int | None = None) -> str:
    """Saves randomly initialised weights (seed 0) as a safetensors directory, once."""
    path = os.path.join(_WORK.value, f"{name}-v{vocab or 'default'}")
    if os.path.isfile(os.path.join(path, "config.json")):
        return path
    import torch
    import transformers

    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(hf_config(name, vocab))
    model.save_pretrained(path)
    return path


def make_tokens(vocab: int, seq_len: int, num: int) -> str:
    """`[num, seq_len]` token chunks of the text, saved as .npy; returns the path."""
    import numpy as np

    from ppl_jax.tokenizer import HFTokenizer

    folder = _data_folder()
    text_path = _DATA.value or os.path.join(folder, "wikitext-2", "test.txt")
    tok = HFTokenizer.from_file(_TOKENIZER.value or os.path.join(folder, "tokenizers", "gpt2.json"))
    with open(text_path, encoding="utf-8") as f:
        ids = tok.encode([f.read()])[0]
    if ids.size < seq_len * num:
        ids = np.tile(ids, math.ceil(seq_len * num / ids.size))
    chunks = (ids[: seq_len * num] % vocab).reshape(num, seq_len).astype(np.int32)
    path = os.path.join(_WORK.value, f"tokens-{vocab}-{seq_len}-{num}.npy")
    np.save(path, chunks)
    return path


def _data_folder() -> str:
    """The data folder that PPL_JAX_TEST_DATA names (as `.ci/run` sets it); without it, the
    flags `--data` and `--tokenizer` must name the text and the tokenizer."""
    folder = os.environ.get("PPL_JAX_TEST_DATA", "")
    if not folder and not (_DATA.value and _TOKENIZER.value):
        raise SystemExit(
            "bench: set PPL_JAX_TEST_DATA to the data folder (it holds wikitext-2/test.txt and "
            "tokenizers/gpt2.json), or pass --data and --tokenizer."
        )
    return folder


def _peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def run_jax(
    model_dir: str, tokens_path: str, dtype: str, batch_size: int, attention: str = "auto"
) -> dict:
    import jax
    import jax.numpy as jnp
    import numpy as np

    from ppl_jax import plans, scoring
    from ppl_jax.checkpoints.formats import safetensors
    from ppl_jax.config.defaults import DEFAULT_RULES
    from ppl_jax.models import registry
    from ppl_jax.models.layers import attention as attention_lib
    from ppl_jax.models.layers import flash
    from ppl_jax.plans import windows
    from ppl_jax.runtime import mesh as mesh_lib
    from ppl_jax.runtime.pathways import memory_stats

    chunks = np.load(tokens_path)
    num, seq_len = chunks.shape
    jdtype = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}[dtype]
    description = safetensors.read_description(model_dir)
    attention, _, query_block = attention.partition("@")
    if query_block:
        block_q, _, block_k = query_block.partition("x")
        flash.BLOCK_Q = flash.GPU_BLOCK_Q = int(block_q)
        flash.BLOCK_K = flash.GPU_BLOCK_K = int(block_k or block_q)
    attention = attention_lib.resolve_for(attention, jdtype, description)
    model = registry.build(description, jdtype, attention)
    mesh = mesh_lib.make_mesh(-1, 1)
    target, shardings = mesh_lib.param_targets(
        model.abstract_params, model.logical_axes, mesh, DEFAULT_RULES, jdtype
    )
    params = safetensors.load_params(model_dir, target)
    # The chunks as windows of seq_len - 1 model inputs, scored from their second token.
    win = windows.make(
        chunks.ravel(), np.arange(num) * seq_len, np.full(num, seq_len), np.ones(num), seq_len - 1
    )
    batch_size = max(mesh.shape["data"], batch_size - batch_size % mesh.shape["data"])
    scorer = scoring.Scorer(model, mesh, shardings)
    warm = windows.make(
        win.tokens,
        win.starts[:batch_size],
        win.lengths[:batch_size],
        win.first_scored[:batch_size],
        win.seq_len,
    )
    t0 = time.perf_counter()
    scorer.score(params, warm, plans.plan_layout(warm, batch_size))  # compile and warm up
    compile_seconds = time.perf_counter() - t0
    totals = scorer.score(params, win, plans.plan_layout(win, batch_size))
    device = jax.devices()[0]
    stats = memory_stats(device) if device.platform == "gpu" else {}
    return {
        "nll_sum": totals.nll_sum,
        "num_tokens": totals.num_tokens,
        "steady_seconds": totals.scoring_seconds,
        "compile_and_warmup_seconds": compile_seconds,
        "batch_size": batch_size,
        "attention": attention + (f"@{query_block}" if query_block else ""),
        "host_seconds": totals.host_seconds,
        "prepare_seconds": totals.prepare_seconds,
        "peak_rss_bytes": _peak_rss_bytes(),
        "device_peak_bytes": stats.get("peak_bytes_in_use"),
        "device": device.device_kind,
        "temp_bytes": _temp_bytes(scorer),
    }


def _temp_bytes(scorer) -> int | None:
    analyses = scorer.memory_analysis().values()
    return max((a.temp_size_in_bytes for a in analyses if a is not None), default=None)


def run_hf(model_dir: str, tokens_path: str, dtype: str, batch_sizes: list[int]) -> dict:
    import numpy as np
    import torch
    import transformers

    chunks = torch.from_numpy(np.load(tokens_path)).long()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    tdtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[dtype]
    model = (
        transformers.AutoModelForCausalLM.from_pretrained(
            model_dir, dtype=tdtype, attn_implementation="sdpa"
        )
        .to(device)
        .eval()
    )

    def score(batch: torch.Tensor) -> tuple[float, int]:
        with torch.no_grad():
            logits = model(batch.to(device)).logits[:, :-1]
            logp = torch.log_softmax(logits.float(), dim=-1)
            target = batch[:, 1:].to(device)
            nll = -logp.gather(-1, target[..., None])[..., 0]
            return float(nll.double().sum()), target.numel()

    # The peer's best batch size: the fastest per token of those that fit.
    best, best_rate, t_select = batch_sizes[0], 0.0, time.perf_counter()
    for bs in batch_sizes:
        if bs > chunks.shape[0]:
            continue
        try:
            score(chunks[:bs])  # warm-up
            t = time.perf_counter()
            score(chunks[:bs])
            rate = bs / (time.perf_counter() - t)
        except torch.OutOfMemoryError:
            break
        if rate > best_rate:
            best, best_rate = bs, rate
    select_seconds = time.perf_counter() - t_select
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    nll_sum, num_tokens = 0.0, 0
    t = time.perf_counter()
    for i in range(0, chunks.shape[0], best):
        s, n = score(chunks[i : i + best])
        nll_sum += s
        num_tokens += n
    if device == "cuda":
        torch.cuda.synchronize()
    return {
        "nll_sum": nll_sum,
        "num_tokens": num_tokens,
        "steady_seconds": time.perf_counter() - t,
        "compile_and_warmup_seconds": select_seconds,
        "batch_size": best,
        "peak_rss_bytes": _peak_rss_bytes(),
        "device_peak_bytes": torch.cuda.max_memory_allocated() if device == "cuda" else None,
        "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
        "torch_threads": torch.get_num_threads(),
    }


def _side(side: str, model_dir: str, tokens: str, dtype: str, extra: list[str]) -> dict:
    """Runs one side in its own process; returns its JSON, with the whole-process seconds."""
    cmd = [
        sys.executable,
        "-m",
        "benchmarks.bench",
        f"--side={side}",
        f"--model_dir={model_dir}",
        f"--tokens={tokens}",
        f"--dtype={dtype}",
        *extra,
    ]
    t = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode:
        raise RuntimeError(f"{side} side failed:\n{proc.stderr[-3000:]}")
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    result["process_seconds"] = time.perf_counter() - t
    result["tokens_per_second"] = result["num_tokens"] / result["steady_seconds"]
    result["process_tokens_per_second"] = result["num_tokens"] / result["process_seconds"]
    result["perplexity"] = math.exp(result["nll_sum"] / result["num_tokens"])
    return result


def _matmul_params(name: str, vocab: int) -> tuple[int, int, int]:
    c = hf_config(name, vocab)
    if name == "gpt2":
        d, layers = c.n_embd, c.n_layer
        per_layer = 4 * d * d + 2 * d * 4 * d
        return per_layer * layers + vocab * d, layers, d
    d, layers = c.hidden_size, c.num_hidden_layers
    hd = d // c.num_attention_heads
    attn = d * hd * (2 * c.num_attention_heads + 2 * c.num_key_value_heads)
    per_layer = attn + 3 * d * c.intermediate_size
    return per_layer * layers + vocab * d, layers, c.num_attention_heads * hd


def compare() -> dict:
    os.makedirs(_WORK.value, exist_ok=True)
    name, seq_len = _MODEL.value, _SEQ.value
    model_dir = make_model_dir(name)
    vocab = hf_config(name).vocab_size
    tokens = make_tokens(vocab, seq_len, _NUM.value)
    runs = {
        att: _side(
            "jax",
            model_dir,
            tokens,
            _DTYPE.value,
            [f"--batch_size={_BATCH.value}", f"--attention={att}"],
        )
        for att in _ATTENTION.value
    }
    # The peer's batch size is chosen in a first process; a second, at that batch size only,
    # is the one measured (so the search's larger batches do not count in its peak memory).
    search = _side(
        "hf",
        model_dir,
        tokens,
        _DTYPE.value,
        [f"--peer_batch_sizes={','.join(_PEER_BATCHES.value)}"],
    )
    hf_r = _side(
        "hf", model_dir, tokens, _DTYPE.value, [f"--peer_batch_sizes={search['batch_size']}"]
    )
    hf_r["batch_size_search"] = {
        "tried": _PEER_BATCHES.value,
        "chosen": search["batch_size"],
        "tokens_per_second_in_search_run": search["tokens_per_second"],
    }
    kind = next((k for k in PEAK_FLOPS if k in hf_r["device"]), None)
    flops_per_token = None
    if kind:
        matmul, layers, width = _matmul_params(name, vocab)
        flops_per_token = 2 * matmul + 2 * layers * seq_len * width
        hf_r["mfu"] = hf_r["tokens_per_second"] * flops_per_token / PEAK_FLOPS[kind][_DTYPE.value]
    for jax_r in runs.values():
        jax_r["speedup_steady"] = jax_r["tokens_per_second"] / hf_r["tokens_per_second"]
        jax_r["speedup_process"] = (
            jax_r["process_tokens_per_second"] / hf_r["process_tokens_per_second"]
        )
        jax_r["peak_rss_ratio"] = jax_r["peak_rss_bytes"] / hf_r["peak_rss_bytes"]
        jax_r["perplexity_rel_diff"] = abs(jax_r["perplexity"] / hf_r["perplexity"] - 1)
        if jax_r["device_peak_bytes"] and hf_r["device_peak_bytes"]:
            jax_r["device_peak_ratio"] = jax_r["device_peak_bytes"] / hf_r["device_peak_bytes"]
        if flops_per_token:
            jax_r["mfu"] = (
                jax_r["tokens_per_second"] * flops_per_token / PEAK_FLOPS[kind][_DTYPE.value]
            )
    result = {
        "model": name,
        "seq_len": seq_len,
        "num_sequences": _NUM.value,
        "dtype": _DTYPE.value,
        "ppl_jax": runs,
        "hf_transformers": hf_r,
    }
    if flops_per_token:
        result["flops_per_token"] = flops_per_token
    if _COMPARE_BF16.value and _DTYPE.value == "float32":
        few = make_tokens(vocab, seq_len, min(_NUM.value, 4))
        f32 = _side("jax", model_dir, few, "float32", [f"--batch_size={_BATCH.value}"])
        bf16 = _side("jax", model_dir, few, "bfloat16", [f"--batch_size={_BATCH.value}"])
        result["bfloat16_vs_float32"] = {
            "num_tokens": f32["num_tokens"],
            "perplexity_float32": f32["perplexity"],
            "perplexity_bfloat16": bf16["perplexity"],
            "rel_diff": abs(bf16["perplexity"] / f32["perplexity"] - 1),
        }
    return result


def vocab_sweep() -> dict:
    os.makedirs(_WORK.value, exist_ok=True)
    out = {}
    for vocab in (32000, 256000):
        model_dir = make_model_dir("llama-small", vocab)
        tokens = make_tokens(vocab, _SEQ.value, _NUM.value)
        r = _side("jax", model_dir, tokens, "float32", [f"--batch_size={_BATCH.value}"])
        d = hf_config("llama-small", vocab).hidden_size
        r["embedding_bytes"] = 2 * vocab * d * 4  # input embedding + unembedding, float32
        out[vocab] = r
    small, big = out[32000], out[256000]
    growth = big["peak_rss_bytes"] - small["peak_rss_bytes"]
    beyond = growth - (big["embedding_bytes"] - small["embedding_bytes"])
    return {
        "model": "llama-small",
        "seq_len": _SEQ.value,
        "batch_size": _BATCH.value,
        "runs": {str(k): v for k, v in out.items()},
        "peak_rss_growth_beyond_embeddings": beyond / small["peak_rss_bytes"],
        "compiled_temp_bytes": {str(k): v["temp_bytes"] for k, v in out.items()},
    }


def _mb(x) -> str:
    return "-" if x is None else f"{x / 2**20:,.0f} MiB"


def print_table(r: dict) -> None:
    """One column per ppl_jax attention implementation, then the peer; ratios are against it."""
    h = r["hf_transformers"]
    runs = list(r["ppl_jax"].items())
    rows = [
        ("", *(f"ppl_jax {a}" for a, _ in runs), "transformers"),
        ("attention", *(j["attention"] for _, j in runs), "sdpa"),
        ("batch size", *(j["batch_size"] for _, j in runs), h["batch_size"]),
        (
            "tokens/s (steady)",
            *(f"{j['tokens_per_second']:,.0f} ({j['speedup_steady']:.2f}x)" for _, j in runs),
            f"{h['tokens_per_second']:,.0f}",
        ),
        (
            "tokens/s (whole process)",
            *(
                f"{j['process_tokens_per_second']:,.0f} ({j['speedup_process']:.2f}x)"
                for _, j in runs
            ),
            f"{h['process_tokens_per_second']:,.0f}",
        ),
        (
            "host share of the loop",
            *(f"{j['host_seconds'] / j['steady_seconds']:.1%}" for _, j in runs),
            "-",
        ),
        (
            "peak host RSS",
            *(f"{_mb(j['peak_rss_bytes'])} ({j['peak_rss_ratio']:.2f})" for _, j in runs),
            _mb(h["peak_rss_bytes"]),
        ),
        (
            "device peak memory",
            *(
                f"{_mb(j['device_peak_bytes'])} ({j.get('device_peak_ratio', float('nan')):.2f})"
                for _, j in runs
            ),
            _mb(h["device_peak_bytes"]),
        ),
        (
            "perplexity",
            *(f"{j['perplexity']:.4f} ({j['perplexity_rel_diff']:.1e})" for _, j in runs),
            f"{h['perplexity']:.4f}",
        ),
    ]
    if "flops_per_token" in r:
        rows.append(("MFU", *(f"{j['mfu']:.1%}" for _, j in runs), f"{h['mfu']:.1%}"))
    for row in rows:
        print(f"{row[0]:<26}" + "".join(f"{c!s:>24}" for c in row[1:]))
    if "bfloat16_vs_float32" in r:
        b = r["bfloat16_vs_float32"]
        print(
            f"bfloat16 vs float32 perplexity: {b['perplexity_bfloat16']:.4f} vs "
            f"{b['perplexity_float32']:.4f} (rel diff {b['rel_diff']:.1e}, "
            f"{b['num_tokens']} tokens)"
        )


def main(argv: list[str]) -> None:
    del argv
    if _SIDE.value:
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        if _SIDE.value == "jax":
            r = run_jax(
                _MODEL_DIR.value, _TOKENS.value, _DTYPE.value, _BATCH.value, _ATTENTION.value[0]
            )
        else:
            r = run_hf(
                _MODEL_DIR.value, _TOKENS.value, _DTYPE.value, [int(b) for b in _PEER_BATCHES.value]
            )
        print(json.dumps(r))
        return
    if _DATA_SCALE.value:
        bench_data.main(_OUT.value if _OUT.present else bench_data.DEFAULT_OUT)
        return
    result = vocab_sweep() if _VOCAB_SWEEP.value else compare()
    result["versions"] = _versions()
    with open(_OUT.value, "w", encoding="utf-8") as f:
        json.dump(result, f, indent=2)
    if _VOCAB_SWEEP.value:
        print(json.dumps({k: v for k, v in result.items() if k != "runs"}, indent=2))
    else:
        print_table(result)
    print(f"results: {_OUT.value}")


def _versions() -> dict:
    from importlib.metadata import version

    return {p: version(p) for p in ("jax", "jaxlib", "flax", "torch", "transformers")}


if __name__ == "__main__":
    app.run(main)
