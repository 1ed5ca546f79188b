"""Compiled device memory of a GGUF Q4_K_M model kept packed on the device against its bfloat16
copy, without a weight allocated (issue 37, item 3).

    python -m benchmarks.bench_quantized_memory                 # 8B at 8 x 2,048; 70B at 1 x 8,192
    python -m benchmarks.bench_quantized_memory --models=llama-8b --batch=8 --tokens=2048

The Llama 3.1 8B and 70B shapes (`benchmarks.shapes`) are built in bfloat16; their quantized
weights are laid out as llama.cpp's `Q4_K_M` lays them (`llama-quantize`'s
`llama_tensor_get_type`): `output.weight` Q6_K; `attn_v` and `ffn_down` Q6_K on the layers
`use_more_bits` picks (the first and last eighth, and every third between), else Q4_K; every other
matrix Q4_K (the embedding included); the norms float. Each becomes a `Packed` weight of those
blocks (`ppl_jax.models.layers.packed`), as `checkpoint.dequantize=auto` places a GGUF file's.
The `Scorer`'s step is lowered from the abstract params and batch and compiled on the first
device; XLA's memory analysis gives its arguments (params and batch) and temporaries. One JSON
line per (model, weights) and `--out` with them all.

With `--run=N` (the device check's `quantized` part, on a GPU) each step also runs N times on
random weights made on the device (valid blocks: random codes, every block's scales small
float16s), after one warm-up: tokens/s, MFU (forward FLOPs per token = 2 x matmul parameters +
the causal attention's `2 x 2 x layers x heads x head_dim x (T + 1) / 2`, against 989 TFLOP/s
dense bfloat16) and the device's peak memory (`memory_stats`, where the platform has it).
"""

from __future__ import annotations

import json
import time

from absl import app, flags

from benchmarks.shapes import LLAMA_8B

LLAMA_70B = dict(
    LLAMA_8B,
    embed_dim=8192,
    num_layers=80,
    num_heads=64,
    num_kv_heads=8,
    head_dim=128,
    mlp_dim=28672,
)
MODELS = {"llama-8b": (LLAMA_8B, 8, 2048), "llama-70b": (LLAMA_70B, 1, 8192)}

_MODELS = flags.DEFINE_list("models", list(MODELS), "Models to compile.")
_BATCH = flags.DEFINE_integer("batch", 0, "Rows per batch (0: the model's default).")
_TOKENS = flags.DEFINE_integer("tokens", 0, "Tokens per row (0: the model's default).")
_OUT = flags.DEFINE_string("out", "bench_quantized_memory.json", "Where to write the results.")
_SCHEMES = flags.DEFINE_list("schemes", ["Q4_K_M"], "Quantization schemes: Q4_K_M, Q8_0.")
_RUN = flags.DEFINE_integer(
    "run", 0, "Also run the step this many times on random weights (a GPU): tokens/s, MFU, memory."
)
_ATTENTION = flags.DEFINE_string("attention", "xla", "model.attention (cudnn on a GPU).")
PEAK_BF16 = {"H100": 989e12, "H200": 989e12}  # dense bfloat16, SXM (`benchmarks.bench`)


def more_bits(layer: int, layers: int) -> bool:
    """llama.cpp's `use_more_bits`: the layers whose `attn_v` and `ffn_down` Q4_K_M keeps Q6_K."""
    return layer < layers // 8 or layer >= 7 * layers // 8 or (layer - layers // 8) % 3 == 2


def q4_k_m_kind(name: str, layers: int) -> tuple[str, int] | None:
    """(block type, block axis of the model weight) of `name` in a Q4_K_M file, or None (float)."""
    if name.endswith("norm") or "norm" in name.split("/")[-1]:
        return None
    if name == "embedding":
        return "Q4_K", 1
    if name == "lm_head":
        return "Q6_K", 0
    layer = int(name.split("/")[1])
    leaf = name.split("/")[-1]
    kind = "Q6_K" if leaf in ("v", "down") and more_bits(layer, layers) else "Q4_K"
    return kind, 0  # `o` [heads, head_dim, embed]: blocks across heads and head_dim (span 2)


def packed_model(model, layers: int, scheme: str = "Q4_K_M"):
    """`model` with its matrices as `scheme`'s `Packed` weights (`Q4_K_M`: `q4_k_m_kind`;
    `Q8_0`: every matrix Q8_0, as llama.cpp's Q8_0 files store them)."""
    import dataclasses

    import jax
    import jax.numpy as jnp
    import numpy as np

    from ppl_jax.checkpoints.quantized import ggml
    from ppl_jax.models.interface import nest_weights, weight_paths
    from ppl_jax.models.layers.packed import Layout, Packed

    flat = weight_paths(model.abstract_params)
    for name, leaf in flat.items():
        found = q4_k_m_kind(name, layers)
        if found is None:
            continue
        kind, axis = found
        kind = kind if scheme == "Q4_K_M" else scheme
        block, block_bytes = ggml.BLOCKS[kind]
        span = 1
        if name.endswith("/o"):  # [heads, head_dim, embed]: along head_dim, or across heads too
            axis, span = (1, 1) if leaf.shape[1] % block == 0 else (0, 2)
        layout = Layout(ggml.dequantize, kind, axis, block, block_bytes, tuple(leaf.shape),
                        np.dtype(leaf.dtype).name, span)  # fmt: skip
        flat[name] = Packed(jax.ShapeDtypeStruct(layout.packed_shape, jnp.uint8), layout)
    return dataclasses.replace(model, abstract_params=nest_weights(flat))


# Byte offsets of each block type's float16 scales (`d`, and `dmin` where it has one), llama.cpp's
# block layouts: set to 2^-10 so that random codes dequantize to finite, small weights.
SCALES = {"Q4_K": (0, 2), "Q6_K": (208,)}


def random_params(abstract, seed: int = 0):
    """Random weights of the abstract params on the default device: floats N(0, 0.02^2), packed
    weights random codes with small scales."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from ppl_jax.models.layers import packed

    half = np.frombuffer(np.float16(2**-10).tobytes(), np.uint8)
    leaves, tree = jax.tree.flatten(abstract, is_leaf=packed.is_packed)
    keys = jax.random.split(jax.random.key(seed), len(leaves))
    out = []
    for key, leaf in zip(keys, leaves, strict=True):
        if packed.is_packed(leaf):
            data = jax.random.bits(key, leaf.layout.packed_shape, jnp.uint8)
            for at in SCALES[leaf.layout.kind]:
                data = data.at[..., at : at + 2].set(jnp.asarray(half))
            out.append(leaf.with_data(data))
        else:
            out.append((0.02 * jax.random.normal(key, leaf.shape)).astype(leaf.dtype))
    return jax.tree.unflatten(tree, out)


def matmul_params(config: dict) -> int:
    d, hd = config["embed_dim"], config["head_dim"]
    attn = d * hd * (2 * config["num_heads"] + 2 * config["num_kv_heads"])
    return config["num_layers"] * (attn + 3 * d * config["mlp_dim"]) + config["vocab_size"] * d


def timed(step, model, config: dict, batch: int, tokens: int, repeats: int) -> dict:
    """`repeats` runs of the compiled `step` on random weights: tokens/s, MFU, peak memory."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    params = random_params(model.abstract_params)
    rng = np.random.default_rng(0)
    shape = (batch, tokens + 1)
    data = {
        "tokens": jnp.asarray(rng.integers(0, config["vocab_size"], shape), jnp.int32),
        "target_mask": jnp.ones(shape, jnp.bool_),
        "segment_ids": jnp.ones(shape, jnp.int32),
        "positions": jnp.broadcast_to(jnp.arange(tokens + 1, dtype=jnp.int32), shape),
    }
    jax.block_until_ready(step(params, data))
    t0 = time.perf_counter()
    for _ in range(repeats):
        jax.block_until_ready(step(params, data))
    seconds = (time.perf_counter() - t0) / repeats
    rate = batch * tokens / seconds
    flops = 2 * matmul_params(config) + 2 * 2 * config["num_layers"] * (
        config["num_heads"] * config["head_dim"] * (tokens + 1) / 2
    )
    kind = jax.devices()[0].device_kind
    peak = next((v for k, v in PEAK_BF16.items() if k in kind), None)
    stats = getattr(jax.devices()[0], "memory_stats", lambda: None)() or {}
    return {
        "step_seconds": round(seconds, 4),
        "tokens_per_second": round(rate),
        "mfu": round(rate * flops / peak, 4) if peak else None,
        "peak_device_gb": round(stats["peak_bytes_in_use"] / 1e9, 3)
        if "peak_bytes_in_use" in stats
        else None,
    }


def compiled(model, batch: int, tokens: int) -> dict:
    import jax

    from ppl_jax.config.defaults import DEFAULT_RULES
    from ppl_jax.models.layers import packed
    from ppl_jax.runtime import mesh as mesh_lib
    from ppl_jax.scoring import Scorer, StepOptions

    mesh = mesh_lib.make_mesh(1, 1, devices=jax.devices()[:1])
    shardings = mesh_lib.param_shardings(
        model.abstract_params, model.logical_axes, mesh, DEFAULT_RULES
    )
    scorer = Scorer(model, mesh, shardings, StepOptions())
    t0 = time.perf_counter()
    step = scorer.compiled(batch, tokens + 1)
    seconds = time.perf_counter() - t0
    memory = step.memory_analysis()
    return step, {
        "compile_seconds": round(seconds, 1),
        "packed_gb": round(packed.packed_bytes(model.abstract_params) / 1e9, 3),
        "argument_gb": round(memory.argument_size_in_bytes / 1e9, 3),
        "temp_gb": round(memory.temp_size_in_bytes / 1e9, 3),
        "total_gb": round((memory.argument_size_in_bytes + memory.temp_size_in_bytes) / 1e9, 3),
        "device": jax.devices()[0].device_kind,
    }


def main(argv: list[str]) -> None:
    del argv
    import jax.numpy as jnp

    from ppl_jax.models import LlamaConfig, registry

    rows = []
    for name in _MODELS.value:
        config, batch, tokens = MODELS[name]
        batch, tokens = _BATCH.value or batch, _TOKENS.value or tokens
        model = registry.build(LlamaConfig(**config).to_dict(), jnp.bfloat16, _ATTENTION.value)
        layers = config["num_layers"]
        d, f, v = config["embed_dim"], config["mlp_dim"], config["vocab_size"]
        layer_floats = 2 * (d * config["num_heads"] * config["head_dim"] * 2
                            + d * config["num_kv_heads"] * config["head_dim"] * 2 + 3 * d * f)  # fmt: skip
        variants = [("bfloat16", model)] + [
            (f"{s} packed", packed_model(model, layers, s)) for s in _SCHEMES.value
        ]
        for weights, m in variants:
            step, memory = compiled(m, batch, tokens)
            row = {"model": name, "weights": weights, "batch": batch, "tokens": tokens,
                   "one_layer_bf16_gb": round(layer_floats / 1e9, 3),
                   "head_bf16_gb": round(2 * d * v / 1e9, 3), **memory}  # fmt: skip
            if _RUN.value:
                row.update(timed(step, m, config, batch, tokens, _RUN.value))
            rows.append(row)
            print(json.dumps(row), flush=True)
    with open(_OUT.value, "w", encoding="utf-8") as out:
        json.dump(rows, out, indent=2)


if __name__ == "__main__":
    app.run(main)
