"""Benchmark on one GPU (issue 23 item 5): a 1B Llama scoring one long window, and the packed
1B at 2,048 tokens with cuDNN; and, on any machine, the packing's padding on the same documents.

    python -m benchmarks.bench_long_gpu                         # both parts, on an H100
    python -m benchmarks.bench_long_gpu --part=long --lengths=131072,1048576
    python -m benchmarks.bench_long_gpu --part=packed --num_rows=256
    python -m benchmarks.bench_long_gpu --part=padding          # planning only, CPU, seconds

The model is the Llama 3.2 1B shape (16 layers, width 2048, 32 query heads over 8 key/value heads
of 64, MLP 8192, vocabulary 128,256, tied), randomly initialised, bfloat16, scored by ppl_jax's
`Scorer` (the vocabulary-blocked NLL; the per-token layers in chunks of `--token_chunk` tokens).

- `long`: one window of each length in `--lengths` (random token ids, one document), with each
  attention implementation of `--attention` (`xla`: flash attention in JAX; `cudnn`: cuDNN's
  flash attention, one segment per row). Reported: tokens/s of a step after compilation, the
  model FLOPs utilisation with attention counted, the device's peak memory, and the compiled
  step's temporaries.
- `packed`: documents of random lengths (1 to 2,048 tokens, log-uniform) packed into rows of
  2,048 (`eval.packing`, with `--length_buckets` row widths: the last batch may be narrower),
  cuDNN attention, against the same documents one per row (one width).
- `padding`: the same documents laid out as a run on one device does (no model,
  `ppl_jax.plans.planner.lay_out`), packed
  with 1, 4 and 8 length buckets and one per row. Reported: rows, batches, widths, the padding
  (positions of the batches that hold no token), its two parts (the free positions of the rows
  that hold windows, and the empty rows that fill the last batch), the most windows in a row, and
  the planning time.

MFU counts forward FLOPs per token = 2 x matmul parameters + attention `2 x 2 x L x d_attn x
c`, where `c` is the mean number of keys a token sees (`(T + 1) / 2` for one causal window: the
causal half is not counted) and `d_attn = heads x head width`; against the H100 SXM's 989
TFLOP/s dense bfloat16.
"""

from __future__ import annotations

import json
import time

from absl import app, flags

from benchmarks.shapes import LLAMA_1B

_PART = flags.DEFINE_enum("part", "both", ["both", "long", "packed", "padding"], "What to measure.")
_LENGTHS = flags.DEFINE_list("lengths", ["131072", "1048576"], "Window lengths (part long).")
_ATTENTION = flags.DEFINE_list("attention", ["xla", "cudnn"], "Implementations (part long).")
_TOKEN_CHUNK = flags.DEFINE_integer("token_chunk", 16384, "model.token_chunk of part long.")
_NUM_ROWS = flags.DEFINE_integer("num_rows", 256, "Rows of 2,048 tokens (part packed).")
_BATCH = flags.DEFINE_integer("batch_size", 32, "Rows per step (parts packed and padding).")
_BUCKETS = flags.DEFINE_integer(
    "length_buckets", 8, "Row widths the packed rows may use (part packed; eval.length_buckets)."
)
_OUT = flags.DEFINE_string("out", "bench_long_gpu.json", "Where to write the JSON results.")
_MODEL = flags.DEFINE_enum(
    "model", "llama-1b", ["llama-1b", "tiny"], "tiny: a small model to try the script on a CPU."
)

TINY = dict(LLAMA_1B, vocab_size=1024, embed_dim=64, num_layers=2, num_heads=4, num_kv_heads=2,
            head_dim=16, mlp_dim=128)  # fmt: skip


def _config() -> dict:
    return LLAMA_1B if _MODEL.value == "llama-1b" else TINY


# Dense bfloat16 peak of the SXM parts (as `benchmarks.bench.PEAK_FLOPS`).
PEAK_BF16 = {"H100": 989e12, "H200": 989e12}


def _peak_flops() -> float | None:
    import jax

    kind = jax.devices()[0].device_kind
    return next((v for k, v in PEAK_BF16.items() if k in kind), None)


def _matmul_params() -> int:
    c = _config()
    d, hd = c["embed_dim"], c["head_dim"]
    attn = d * hd * (2 * c["num_heads"] + 2 * c["num_kv_heads"])
    return c["num_layers"] * (attn + 3 * d * c["mlp_dim"]) + c["vocab_size"] * d


def _flops_per_token(mean_keys: float) -> float:
    c = _config()
    d_attn = c["num_heads"] * c["head_dim"]
    return 2 * _matmul_params() + 2 * 2 * c["num_layers"] * d_attn * mean_keys


def _setup(attention: str, token_chunk: int = 0):
    import jax
    import jax.numpy as jnp

    from ppl_jax.config.defaults import DEFAULT_RULES
    from ppl_jax.models import LlamaConfig, registry
    from ppl_jax.runtime import mesh as mesh_lib
    from ppl_jax.scoring import Scorer, StepOptions

    model = registry.build(LlamaConfig(**_config()).to_dict(), jnp.bfloat16, attention)
    mesh = mesh_lib.make_mesh(1, 1, devices=jax.devices()[:1])
    shardings = mesh_lib.param_shardings(
        model.abstract_params, model.logical_axes, mesh, DEFAULT_RULES
    )
    key = jax.random.key(0)
    params = jax.jit(
        lambda k: jax.tree.map(
            lambda a: (0.02 * jax.random.normal(k, a.shape, jnp.float32)).astype(a.dtype),
            model.abstract_params,
        ),
        out_shardings=shardings,
    )(key)
    scorer = Scorer(model, mesh, shardings, StepOptions(token_chunk=token_chunk))
    return scorer, params


def _peak_bytes() -> int | None:
    import jax

    from ppl_jax.runtime.pathways import memory_stats

    return memory_stats(jax.devices()[0]).get("peak_bytes_in_use")


def long_window(t: int, attention: str) -> dict:
    import jax
    import numpy as np

    scorer, params = _setup(attention, _TOKEN_CHUNK.value)
    rng = np.random.default_rng(0)
    batch = {
        "tokens": rng.integers(0, _config()["vocab_size"], (1, t + 1)).astype(np.int32),
        "target_mask": np.arange(t + 1)[None] > 0,
        "segment_ids": np.ones((1, t + 1), np.int32),
        "positions": np.arange(t + 1, dtype=np.int32)[None],
    }
    batch = {k: jax.device_put(v, scorer.batch_sharding) for k, v in batch.items()}
    t0 = time.perf_counter()
    compiled = scorer.compiled(1, t + 1)
    jax.block_until_ready(compiled(params, batch))
    warm = time.perf_counter() - t0
    t0 = time.perf_counter()
    sums = jax.block_until_ready(compiled(params, batch))
    seconds = time.perf_counter() - t0
    rate = t / seconds
    peak = _peak_flops()
    return {
        "part": "long",
        "tokens": t,
        "attention": attention,
        "token_chunk": _TOKEN_CHUNK.value,
        "compile_and_first_step_seconds": warm,
        "step_seconds": seconds,
        "tokens_per_second": rate,
        "mfu": rate * _flops_per_token((t + 1) / 2) / peak if peak else None,
        "device_peak_bytes": _peak_bytes(),
        "temp_bytes": compiled.memory_analysis().temp_size_in_bytes,
        "nll_per_token": float(np.asarray(sums.nll_sum).sum()) / t,
        "device": jax.devices()[0].device_kind,
    }


def documents(num_rows: int, vocab_size: int, seq: int = 2048):
    """The packed part's documents: log-uniform lengths 2..`seq` (seed 1) until they hold
    `num_rows` rows of `seq` tokens, random token ids below `vocab_size`; as `Windows` of
    `seq_len = seq`, and their lengths."""
    import numpy as np

    from ppl_jax.plans import windows

    rng = np.random.default_rng(1)
    lengths = []
    while sum(lengths) < num_rows * seq:
        lengths.append(int(np.exp(rng.uniform(0, np.log(seq)))) + 1)
    lengths = np.minimum(lengths, seq + 1)
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    stream = rng.integers(0, vocab_size, int(lengths.sum())).astype(np.int32)
    return windows.make(stream, starts, lengths, np.ones(len(lengths)), seq), lengths


def packed(pack: bool) -> dict:
    import jax
    import numpy as np

    from ppl_jax.plans import plan_layout, windows

    scorer, params = _setup("cudnn" if jax.default_backend() == "gpu" else "xla")
    wins, lengths = documents(_NUM_ROWS.value, _config()["vocab_size"])
    buckets = _BUCKETS.value if pack else 1
    layout = plan_layout(wins, _BATCH.value, pack=pack, num_buckets=buckets)
    few = min(64, len(lengths))
    warm = windows.make(wins.tokens, wins.starts[:few], lengths[:few], np.ones(few), 2048)
    scorer.score(params, warm, plan_layout(warm, _BATCH.value, pack=pack))
    totals = scorer.score(params, wins, layout)
    rate = totals.num_tokens / totals.scoring_seconds
    # Keys per token: a document of n tokens gives its i-th token i keys.
    mean_keys = float(np.sum(lengths * (lengths + 1) / 2) / np.sum(lengths))
    peak = _peak_flops()
    return {
        "part": "packed",
        "packing": pack,
        "length_buckets": buckets,
        "rows": len(layout.rows),
        "widths": sorted(set(layout.widths)),
        "documents": len(lengths),
        "padding_fraction": layout.padding_fraction,
        "scored_tokens": totals.num_tokens,
        "tokens_per_second": rate,
        "mfu": rate * _flops_per_token(mean_keys) / peak if peak else None,
        "device_peak_bytes": _peak_bytes(),
        "device": jax.devices()[0].device_kind,
    }


def padding(pack: bool, buckets: int) -> dict:
    """The layout of the packed part's documents, planned alone (no model, any machine)."""
    import numpy as np

    from ppl_jax.plans import BatchSpec
    from ppl_jax.plans.planner import lay_out

    wins, lengths = documents(_NUM_ROWS.value, _config()["vocab_size"])
    t0 = time.perf_counter()
    spec = BatchSpec(batch_size=_BATCH.value, packing=pack, length_buckets=buckets)
    layout = lay_out(wins, spec, rows_multiple=1)  # as a run on one device lays them out
    seconds = time.perf_counter() - t0
    b = layout.batch_size
    positions = b * sum(layout.widths)
    row_widths = np.repeat(layout.widths, b)[: len(layout.rows)]  # the rows that hold windows
    tokens = int(wins.row_lengths().sum())
    return {
        "part": "padding",
        "packing": pack,
        "length_buckets": buckets,
        "documents": len(lengths),
        "tokens": tokens,
        "rows": len(layout.rows),
        "least_rows": -(-tokens // (wins.seq_len + 1)),
        "batches": layout.num_batches,
        "widths": sorted(set(layout.widths)),
        "padding_fraction": layout.padding_fraction,
        # The two parts of it, as shares of all positions: free positions in the rows that hold
        # windows, and the empty rows that fill the last batch.
        "row_padding_fraction": (int(row_widths.sum()) - tokens) / positions,
        "empty_rows": layout.num_batches * b - len(layout.rows),
        "empty_row_fraction": (positions - int(row_widths.sum())) / positions,
        "max_segments": layout.max_segments,
        "planning_seconds": seconds,
    }


def main(argv: list[str]) -> None:
    del argv
    rows = []
    if _PART.value in ("both", "long"):
        for t in map(int, _LENGTHS.value):
            for attention in _ATTENTION.value:
                rows.append(long_window(t, attention))
                print(json.dumps(rows[-1]), flush=True)
    if _PART.value in ("both", "packed"):
        for pack in (True, False):
            rows.append(packed(pack))
            print(json.dumps(rows[-1]), flush=True)
    if _PART.value == "padding":
        for pack, buckets in ((True, 1), (True, 4), (True, 8), (False, 1)):
            rows.append(padding(pack, buckets))
            print(json.dumps(rows[-1]), flush=True)
    with open(_OUT.value, "w", encoding="utf-8") as f:
        json.dump({"model": _config(), "rows": rows}, f, indent=2)


if __name__ == "__main__":
    app.run(main)
