"""Compiled memory and compile time of one long window, by depth and length, without running it.

    python -m benchmarks.bench_memory --lengths=131072 --layers=1,2,4,16
    python -m benchmarks.bench_memory --model=llama-8b --lengths=1048576 --layers=32

The step of ppl_jax's `Scorer` (the vocabulary-blocked NLL, `model.token_chunk` per-token chunks)
is lowered from abstract params and batches (nothing is allocated) and compiled for one window of
each length on the first device, and XLA's memory analysis of the compiled step is reported
(`temp_size_in_bytes`: the step's temporaries; `argument_size_in_bytes`: params and batch) with
the compile time. On a CPU this is the `xla` attention path's program; on a GPU, `--attention`
may name `cudnn` too. The models are the Llama 3.2 1B and Llama 3.1 8B shapes
(`benchmarks.shapes`), bfloat16, with `--layers` overriding the depth.

Prints one JSON line per (model, layers, length, attention) and writes them all to `--out`.
"""

from __future__ import annotations

import json
import time

from absl import app, flags

from benchmarks.shapes import LLAMA_1B, LLAMA_8B

MODELS = {"llama-1b": LLAMA_1B, "llama-8b": LLAMA_8B}

_MODEL = flags.DEFINE_enum("model", "llama-1b", list(MODELS), "The model's shape.")
_LAYERS = flags.DEFINE_list("layers", ["16"], "Depths to compile.")
_LENGTHS = flags.DEFINE_list("lengths", ["131072"], "Window lengths in tokens.")
_ATTENTION = flags.DEFINE_list("attention", ["xla"], "Attention implementations.")
_TOKEN_CHUNK = flags.DEFINE_integer("token_chunk", 16384, "model.token_chunk.")
_DTYPE = flags.DEFINE_enum("dtype", "bfloat16", ["bfloat16", "float32"], "The params' dtype.")
_OUT = flags.DEFINE_string("out", "bench_memory.json", "Where to write the JSON results.")


def compiled_memory(config: dict, t: int, attention: str, token_chunk: int, dtype: str) -> dict:
    """XLA's memory analysis and the compile time of the step for one window of `t` tokens."""
    import jax
    import jax.numpy as jnp

    from ppl_jax.config.defaults import DEFAULT_RULES
    from ppl_jax.models import LlamaConfig, registry
    from ppl_jax.runtime import mesh as mesh_lib
    from ppl_jax.scoring import Scorer, StepOptions

    model = registry.build(LlamaConfig(**config).to_dict(), jnp.dtype(dtype), attention)
    mesh = mesh_lib.make_mesh(1, 1, devices=jax.devices()[:1])
    shardings = mesh_lib.param_shardings(
        model.abstract_params, model.logical_axes, mesh, DEFAULT_RULES
    )
    scorer = Scorer(model, mesh, shardings, StepOptions(token_chunk=token_chunk))
    t0 = time.perf_counter()
    compiled = scorer.compiled(1, t + 1)
    seconds = time.perf_counter() - t0
    memory = compiled.memory_analysis()
    return {
        "tokens": t,
        "layers": config["num_layers"],
        "attention": attention,
        "dtype": dtype,
        "token_chunk": token_chunk,
        "compile_seconds": round(seconds, 2),
        "temp_bytes": memory.temp_size_in_bytes,
        "temp_gb": round(memory.temp_size_in_bytes / 1e9, 3),
        "argument_gb": round(memory.argument_size_in_bytes / 1e9, 3),
        "device": jax.devices()[0].device_kind,
    }


def main(argv: list[str]) -> None:
    del argv
    rows = []
    for layers in map(int, _LAYERS.value):
        config = dict(MODELS[_MODEL.value], num_layers=layers)
        for t in map(int, _LENGTHS.value):
            for attention in _ATTENTION.value:
                row = compiled_memory(config, t, attention, _TOKEN_CHUNK.value, _DTYPE.value)
                rows.append({"model": _MODEL.value, **row})
                print(json.dumps(rows[-1]), flush=True)
    with open(_OUT.value, "w", encoding="utf-8") as f:
        json.dump(rows, f, indent=2)


if __name__ == "__main__":
    app.run(main)
