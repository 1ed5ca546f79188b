"""Benchmark: one long window split over the context axis (issue 23): memory per device and time
against the window's length.

    python -m benchmarks.bench_context                      # CPU, 8 fake devices
    python -m benchmarks.bench_context --lengths=8192,65536 --contexts=1,8 --time_up_to=65536

A small Llama-shaped model (random weights: vocabulary 32,000, width 256, 4 layers, 4 query heads
over 2 key/value heads of 64, MLP 768, 1,048,577 positions) scores one window of `T` tokens
(random ids) on a mesh of `N` devices along `context` (the first `N` of the process's devices;
`data` and `model` of size 1), with `model.context_attention` all-gather and ring, and the
per-token layers in chunks of `--token_chunk` tokens.

Memory per device is XLA's compiled memory analysis of the scoring step (`compiled
.memory_analysis()`: the step's temporaries, and its arguments: the params and the batch), the
per-device program of the SPMD partitioned step: on CPU the devices share one process, so their
host memory cannot be told apart. Time is the wall time of one step after compilation, measured
only up to `--time_up_to` tokens (attention's FLOPs grow as T^2: a 1M-token window of this model
is hours on 2 CPU cores), and on CPU the N fake devices share the machine's cores, so time does
not fall with N here. A full `[T, T]` float32 score matrix of one head, for scale, is `4 T^2`
bytes.
"""

from __future__ import annotations

import json
import os
import sys
import time

from absl import app, flags

_LENGTHS = flags.DEFINE_list(
    "lengths", ["8192", "32768", "131072", "524288", "1048576"], "Window lengths T (tokens)."
)
_CONTEXTS = flags.DEFINE_list("contexts", ["1", "2", "4", "8"], "Devices along context.")
_STRATEGIES = flags.DEFINE_list("strategies", ["all_gather", "ring"], "model.context_attention.")
_TOKEN_CHUNK = flags.DEFINE_integer("token_chunk", 8192, "model.token_chunk (0: all at once).")
_TIME_UP_TO = flags.DEFINE_integer("time_up_to", 32768, "Time a step only up to this T.")
_DEVICES = flags.DEFINE_integer("devices", 8, "Fake CPU devices (set before JAX starts).")
_OUT = flags.DEFINE_string("out", "bench_context.json", "Where to write the JSON results.")

MODEL = dict(
    vocab_size=32000,
    embed_dim=256,
    num_layers=4,
    num_heads=4,
    num_kv_heads=2,
    head_dim=64,
    mlp_dim=768,
    max_positions=1_048_577,
    tie_embeddings=False,
)


def measure(t: int, n: int, strategy: str, token_chunk: int, timed: bool) -> dict:
    import jax
    import jax.numpy as jnp
    import numpy as np

    from ppl_jax.config.defaults import DEFAULT_RULES
    from ppl_jax.models import registry
    from ppl_jax.models.llama import LlamaConfig
    from ppl_jax.runtime import mesh as mesh_lib
    from ppl_jax.scoring.scorer import Scorer, StepOptions

    model = registry.build(LlamaConfig(**MODEL).to_dict(), jnp.float32, "xla")
    mesh = mesh_lib.make_mesh(1, 1, devices=jax.devices()[:n], context=n)
    shardings = mesh_lib.param_shardings(
        model.abstract_params, model.logical_axes, mesh, DEFAULT_RULES
    )
    options = StepOptions(context_attention=strategy, token_chunk=token_chunk)
    scorer = Scorer(model, mesh, shardings, options)
    t0 = time.perf_counter()
    compiled = scorer.compiled(1, t + 1)
    compile_seconds = time.perf_counter() - t0
    memory = compiled.memory_analysis()
    result = {
        "tokens": t,
        "context": n,
        "context_attention": strategy,
        "token_chunk": token_chunk,
        "compile_seconds": compile_seconds,
        "temp_bytes": memory.temp_size_in_bytes,
        "argument_bytes": memory.argument_size_in_bytes,
        "output_bytes": memory.output_size_in_bytes,
        "score_matrix_bytes": 4 * t * t,
    }
    if timed:
        rng = np.random.default_rng(0)
        params = jax.device_put(
            jax.tree.map(
                lambda a: (0.05 * rng.standard_normal(a.shape)).astype(np.float32),
                model.abstract_params,
            ),
            shardings,
        )
        batch = {
            "tokens": rng.integers(0, MODEL["vocab_size"], (1, t + 1)).astype(np.int32),
            "target_mask": np.arange(t + 1)[None] > 0,
            "segment_ids": np.ones((1, t + 1), np.int32),
            "positions": np.arange(t + 1, dtype=np.int32)[None],
        }
        batch = {k: jax.device_put(v, scorer.batch_sharding) for k, v in batch.items()}
        jax.block_until_ready(compiled(params, batch))
        t0 = time.perf_counter()
        sums = jax.block_until_ready(compiled(params, batch))
        result["step_seconds"] = time.perf_counter() - t0
        result["tokens_per_second"] = t / result["step_seconds"]
        result["nll_per_token"] = float(np.asarray(sums.nll_sum).sum()) / t
    return result


def _mib(x: float) -> str:
    return f"{x / 2**20:,.1f}"


def table(rows: list[dict]) -> str:
    lines = [
        "| T | N | attention | temporaries MiB | arguments MiB | (temp + args) x N / T, bytes | "
        "step s | score matrix MiB |",
        "| ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        per_token = (r["temp_bytes"] + r["argument_bytes"]) * r["context"] / r["tokens"]
        step = f"{r['step_seconds']:.2f}" if "step_seconds" in r else "-"
        lines.append(
            f"| {r['tokens']:,} | {r['context']} | {r['context_attention']} | "
            f"{_mib(r['temp_bytes'])} | {_mib(r['argument_bytes'])} | {per_token:,.0f} | "
            f"{step} | {_mib(r['score_matrix_bytes'])} |"
        )
    return "\n".join(lines)


def main(argv: list[str]) -> None:
    del argv
    if "jax" not in sys.modules:
        os.environ["XLA_FLAGS"] = (
            os.environ.get("XLA_FLAGS", "")
            + f" --xla_force_host_platform_device_count={_DEVICES.value}"
        )
    rows = []
    for t in map(int, _LENGTHS.value):
        for n in map(int, _CONTEXTS.value):
            for strategy in _STRATEGIES.value:
                if n == 1 and strategy == "ring":
                    continue  # one device: nothing goes round
                r = measure(t, n, strategy, _TOKEN_CHUNK.value, t <= _TIME_UP_TO.value)
                rows.append(r)
                print(json.dumps(r), flush=True)
    with open(_OUT.value, "w", encoding="utf-8") as f:
        json.dump({"model": MODEL, "rows": rows}, f, indent=2)
    print(table(rows))


if __name__ == "__main__":
    app.run(main)
