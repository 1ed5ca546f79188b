"""Benchmark: where llama.cpp's KL divergence departs from ppl_jax's, by rounding activations.

    python -m benchmarks.bench_llamacpp_products /tmp/demo/demo-f16.gguf \
        /tmp/demo/demo-q4_k_m.gguf /tmp/demo/heldout.txt --chunks 64 --rounding none
    python -m benchmarks.bench_llamacpp_products ... --rounding llamacpp
    llama-perplexity -m /tmp/demo/demo-f16.gguf -f /tmp/demo/heldout.txt -c 512 -t 2 --chunks 64 \
        -fa off -ctk f32 -ctv f32 --kl-divergence-base /tmp/demo/base64.kld   # then the copy's pass

A float32 NumPy forward of the demo Llama (the files of `bench_gguf_llamacpp export --pad 256`,
weights dequantized by ppl_jax's GGUF reader), independent of ppl_jax's model code, scoring
`llama-perplexity`'s chunks. With `--rounding none` every product multiplies the dequantized
weights by float32 activations, as ppl_jax does (this forward then gives ppl_jax's per-token
NLLs within about 1e-4). With `--rounding llamacpp` the input of each matrix product is rounded
as llama.cpp's CPU kernels round it before their dot products: to float16 for an F16 weight
(its `vec_dot_type`), to Q8_K blocks for a K-quant weight (per 256 values: the value of largest
magnitude `m` maps to -127, `q = min(127, round(-127 x / m))`, read back as `q * d` with
`d = 1 / (-127 / m)`, as ggml's `quantize_row_q8_K_ref` defines it). Attention itself stays
float32, as in `llama-perplexity -fa off -ctk f32 -ctv f32`. Prints `llama-perplexity
--kl-divergence`'s statistics (`bench_gguf_llamacpp.kl_statistics`).
"""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Callable

import numpy as np

from benchmarks.bench_gguf_llamacpp import _chunks, _restored, kl_statistics
from ppl_jax.models.interface import weight_paths
from ppl_jax.runtime import mesh as mesh_lib


def q8_k(x: np.ndarray) -> np.ndarray:
    """`x` (float32, last axis a multiple of 256) through Q8_K blocks and back."""
    blocks = x.reshape(-1, 256)
    peak = blocks[np.arange(len(blocks)), np.abs(blocks).argmax(axis=1)]
    out = np.zeros_like(blocks)
    nz = peak != 0
    iscale = np.float32(-127.0) / peak[nz]
    scale = np.float32(1.0) / iscale  # the block's stored `d`
    out[nz] = np.minimum(127, np.rint(iscale[:, None] * blocks[nz])) * scale[:, None]
    return out.reshape(x.shape)


def f16(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float16).astype(np.float32)


def none(x: np.ndarray) -> np.ndarray:
    return x


def _load(path: str) -> tuple[dict, dict[str, np.ndarray], dict]:
    ckpt, _, params = _restored(path, mesh_lib.make_mesh(-1, 1))
    p = {k: np.asarray(v, np.float32) for k, v in weight_paths(params).items()}
    return ckpt.description(), p, ckpt.quantization(None)["types"]


def log_probs(d: dict, p: dict[str, np.ndarray], t: np.ndarray, rnd: Callable) -> np.ndarray:
    """`[B, T, V] float64` next-token log-probabilities of tokens `t [B, T]`, each product's input
    passed through `rnd`."""
    b, n = t.shape
    e, heads, kv, hd = d["embed_dim"], d["num_heads"], d["num_kv_heads"], d["head_dim"]
    eps = np.float32(d["norm_eps"])
    angles = np.arange(n)[:, None] / d["rope_theta"] ** (np.arange(0, hd, 2) / hd)
    cos, sin = (f(angles).astype(np.float32)[None, :, None] for f in (np.cos, np.sin))

    def rope(x):  # rotary halves, as ppl_jax and transformers apply them
        x1, x2 = x[..., : hd // 2], x[..., hd // 2 :]
        return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1)

    def norm(x, w):
        return x / np.sqrt(np.mean(x * x, -1, keepdims=True) + eps) * w

    def heads_first(x, h):
        return x.reshape(b, n, h, hd).transpose(0, 2, 1, 3)

    mask = np.triu(np.full((n, n), -np.inf, np.float32), 1)
    x = p["embedding"][t]
    for i in range(d["num_layers"]):
        w = {k.split("/", 2)[2]: v for k, v in p.items() if k.startswith(f"layers/{i}/")}
        h = rnd(norm(x, w["attn_norm"]))
        q = rope((h @ w["attn/q"].reshape(e, -1)).reshape(b, n, heads, hd))
        k = rope((h @ w["attn/k"].reshape(e, -1)).reshape(b, n, kv, hd))
        v = (h @ w["attn/v"].reshape(e, -1)).reshape(b, n, kv, hd)
        k, v = (np.repeat(a, heads // kv, axis=2).transpose(0, 2, 1, 3) for a in (k, v))
        s = q.transpose(0, 2, 1, 3) @ k.transpose(0, 1, 3, 2) / np.float32(math.sqrt(hd)) + mask
        s = np.exp(s - s.max(-1, keepdims=True))
        a = ((s / s.sum(-1, keepdims=True)) @ v).transpose(0, 2, 1, 3).reshape(b, n, -1)
        x = x + rnd(a) @ w["attn/o"].reshape(heads * hd, e)
        h = rnd(norm(x, w["mlp_norm"]))
        g, u = h @ w["mlp/gate"], h @ w["mlp/up"]
        x = x + rnd(g / (1 + np.exp(-g)) * u) @ w["mlp/down"]
    logits = (rnd(norm(x, p["final_norm"])) @ p["embedding"].T).astype(np.float64)
    top = logits.max(-1, keepdims=True)
    return logits - top - np.log(np.exp(logits - top).sum(-1, keepdims=True))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("base")
    parser.add_argument("copy")
    parser.add_argument("text")
    parser.add_argument("--n_ctx", type=int, default=512)
    parser.add_argument("--chunks", type=int, default=0, help="the first N chunks (0: all)")
    parser.add_argument("--rounding", choices=("none", "llamacpp"), default="none")
    args = parser.parse_args()
    chunks = _chunks(args.text, args.n_ctx)[: args.chunks or None]
    (db, pb, tb), (dq, pq, tq) = _load(args.base), _load(args.copy)

    def rounding(types: dict) -> Callable:  # F16 weights round to float16, K-quants to Q8_K
        if args.rounding == "none":
            return none
        return q8_k if any(t.endswith("_K") for t in types) else f16

    rb, rq = rounding(tb), rounding(tq)
    first, cols, t0 = args.n_ctx // 2, [[], [], [], []], time.perf_counter()
    for i in range(0, len(chunks), 8):
        c = chunks[i : i + 8]
        lb = log_probs(db, pb, c[:, :-1], rb)[:, first:]
        lq = log_probs(dq, pq, c[:, :-1], rq)[:, first:]
        target = c[:, first + 1 :, None]
        values = (-np.take_along_axis(lq, target, -1)[..., 0],
                  -np.take_along_axis(lb, target, -1)[..., 0],
                  (np.exp(lb) * (lb - lq)).sum(-1), lb.argmax(-1) == lq.argmax(-1))  # fmt: skip
        for col, value in zip(cols, values, strict=True):
            col.append(value.ravel())
    cols = [np.concatenate(c) for c in cols]
    seconds = time.perf_counter() - t0
    print(f"{args.copy} ({tq}; {rq.__name__}) against {args.base} ({tb}; {rb.__name__}): "
          f"{len(chunks)} chunks, {cols[0].size:,} scored, {seconds:.0f} s")  # fmt: skip
    for label, value in kl_statistics(*cols).items():
        print(f"| {label} | {' ± '.join(f'{x:.6f}' for x in value)} |")


if __name__ == "__main__":
    main()
