"""Benchmark: ppl_jax against llama.cpp's `llama-perplexity` on the same GGUF files.

    python -m benchmarks.bench_gguf_llamacpp export /tmp/demo/demo-f32.gguf
    llama-quantize /tmp/demo/demo-f32.gguf /tmp/demo/demo-Q4_0.gguf Q4_0        # llama.cpp's own
    llama-perplexity -m /tmp/demo/demo-Q4_0.gguf -f /tmp/demo/heldout.txt -c 512 -b 512
    python -m benchmarks.bench_gguf_llamacpp score /tmp/demo/demo-Q4_0.gguf /tmp/demo/heldout.txt

    # KL divergence of a quantized copy from its original, as `llama-perplexity` reports it
    python -m benchmarks.bench_gguf_llamacpp export /tmp/demo/demo-f16.gguf --dtype f16 --pad 256
    llama-quantize /tmp/demo/demo-f16.gguf /tmp/demo/demo-q4_k_m.gguf Q4_K_M
    llama-perplexity -m /tmp/demo/demo-f16.gguf -f /tmp/demo/heldout.txt -c 512 -t 2 \
        --kl-divergence-base /tmp/demo/base.kld
    llama-perplexity -m /tmp/demo/demo-q4_k_m.gguf -c 512 -t 2 \
        --kl-divergence-base /tmp/demo/base.kld --kl-divergence | tee /tmp/demo/kld.log
    python -m benchmarks.bench_gguf_llamacpp kl /tmp/demo/demo-f16.gguf \
        /tmp/demo/demo-q4_k_m.gguf /tmp/demo/heldout.txt --llamacpp /tmp/demo/kld.log

`export` writes ppl_jax's demo model (a 4-layer Llama trained on bytes) as a float32 GGUF file
the way llama.cpp's converter lays out a Llama (q and k rows permuted per head), with a
vocabulary of the 256 bytes (GPT-2's byte spelling, so that both tokenizers give the bytes as
ids; one merge of two bytes the text never holds, as llama.cpp needs the key), and the held-out
text beside it (the demo's held-out standard-library modules). `score` computes
`llama-perplexity`'s statistic with ppl_jax on a GGUF file: the ids cut into chunks of `--n_ctx`,
each chunk scored alone, the second half of its next-token predictions counted. llama.cpp is not
part of ppl_jax: build it yourself (docs/checkpoints.md gives the figures measured this way; the
KL comparison is in BENCHMARKS.md and benchmarks/LOG.md).

`export --dtype f16` writes the matrices in float16 (norms stay float32, as the converter's
`--outtype f16` does); `--pad 256` widens the model to widths that are multiples of 256 (the
demo's are 128 and 320, which `llama-quantize` cannot give K-quants of 256-value blocks), by zeros
that leave its function unchanged: embedding columns, q/k/v heads (with their kv heads, keeping
the grouping) and MLP units added as zeros, and the RMS norms' weights and epsilon rescaled for
the wider mean. `kl` scores a copy against its original in one pass of ppl_jax's step (the
reference-model path: `token_stats(..., reference=)`) on the chunks `llama-perplexity` scores,
and prints, in float64, every statistic of `llama-perplexity --kl-divergence`, beside
llama.cpp's own when given its log.
"""

from __future__ import annotations

import argparse
import math
import os
import re
import time

import gguf
import jax
import jax.numpy as jnp
import numpy as np

from ppl_jax.checkpoints import open_checkpoint, resolve_architecture
from ppl_jax.config import held_out_paths
from ppl_jax.config.defaults import DEFAULT_RULES
from ppl_jax.models.interface import weight_paths
from ppl_jax.runtime import mesh as mesh_lib
from ppl_jax.scoring import token_nll, token_stats
from ppl_jax.tokenizer.gguf import byte_alphabet

DEMO = os.path.join(os.path.dirname(os.path.dirname(__file__)), "ppl_jax", "demo", "checkpoint")


def _params(ckpt) -> dict[str, np.ndarray]:
    model = resolve_architecture(ckpt).model()
    mesh = mesh_lib.make_mesh(-1, 1)
    target = mesh_lib.param_targets(model.abstract_params, model.logical_axes, mesh,
                                    DEFAULT_RULES)[0]  # fmt: skip
    return {
        k: np.asarray(v, np.float32) for k, v in weight_paths(ckpt.restore(None, target)).items()
    }


def _padded(d: dict, p: dict[str, np.ndarray], pad: int) -> tuple[dict, dict[str, np.ndarray]]:
    """The same function at widths that are multiples of `pad`: zero embedding columns, zero
    heads (q and kv heads in the same ratio, so each old q head keeps its kv head), zero MLP
    units; RMS norms see `e / e'` of the old mean square, so their epsilon is scaled by it and
    their weights by `sqrt(e / e')`."""
    e, hd, heads, kv, f = (d[k] for k in ("embed_dim", "head_dim", "num_heads", "num_kv_heads",
                                          "mlp_dim"))  # fmt: skip
    e2, f2 = -(-e // pad) * pad, -(-f // pad) * pad
    k = next(k for k in range(1, pad + 1) if (heads * k * hd) % pad == 0)
    d = dict(d, embed_dim=e2, mlp_dim=f2, num_heads=heads * k, num_kv_heads=kv * k,
             norm_eps=d["norm_eps"] * e / e2)  # fmt: skip

    def zeros(x: np.ndarray, widths: dict[int, int]) -> np.ndarray:
        return np.pad(x, [(0, widths.get(a, n) - n) for a, n in enumerate(x.shape)])

    out = {}
    for name, x in p.items():
        part = name.rsplit("/", 1)[-1]
        if part.endswith("norm"):
            out[name] = zeros(x * np.float32(math.sqrt(e / e2)), {0: e2})
        elif name == "embedding":
            out[name] = zeros(x, {1: e2})
        elif part == "q":
            out[name] = zeros(x, {0: e2, 1: heads * k})
        elif part in ("k", "v"):
            out[name] = zeros(x, {0: e2, 1: kv * k})
        elif part == "o":
            out[name] = zeros(x, {0: heads * k, 2: e2})
        elif part in ("gate", "up"):
            out[name] = zeros(x, {0: e2, 1: f2})
        elif part == "down":
            out[name] = zeros(x, {0: f2, 1: e2})
        else:
            raise ValueError(f"the demo's weight {name} has no padding rule: add one")
    return d, out


def export(out: str, dtype: str = "f32", pad: int = 0) -> None:
    """The demo model as a GGUF file `out` (matrices in `dtype`, `f32` or `f16`; widths padded to
    multiples of `pad` when > 0), and `heldout.txt` beside it."""
    ckpt = open_checkpoint(DEMO)
    d, p = ckpt.description(), _params(ckpt)
    if pad:
        d, p = _padded(d, p, pad)
    e, hd = d["embed_dim"], d["head_dim"]
    matrix = np.float16 if dtype == "f16" else np.float32

    def permuted(x: np.ndarray) -> np.ndarray:  # [embed, heads, head_dim] -> GGUF's q or k
        pairs = np.stack([x[..., : hd // 2], x[..., hd // 2 :]], axis=-1).reshape(x.shape)
        return pairs.reshape(e, -1).T.astype(matrix)

    w = gguf.GGUFWriter(out, "llama")
    w.add_name("ppl_jax demo")
    w.add_file_type(1 if dtype == "f16" else 0)  # llama.cpp's LLAMA_FTYPE_MOSTLY_F16, ALL_F32
    for key, value in (("block_count", d["num_layers"]), ("context_length", d["max_positions"]),
                       ("embedding_length", e), ("feed_forward_length", d["mlp_dim"]),
                       ("head_count", d["num_heads"]), ("head_count_kv", d["num_kv_heads"]),
                       ("rope_freq_base", d["rope_theta"]), ("layer_norm_rms_eps", d["norm_eps"]),
                       ("key_length", hd), ("value_length", hd), ("rope_dimension_count", hd),
                       ("vocab_size", 256)):  # fmt: skip
        getattr(w, f"add_{key}")(value)
    spelling = byte_alphabet()
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list([spelling[b] for b in range(256)])
    w.add_token_types([1] * 256)
    w.add_token_merges([f"{spelling[0]} {spelling[1]}"])
    w.add_add_bos_token(False)
    w.add_tensor("token_embd.weight", p["embedding"].astype(matrix))
    w.add_tensor("output_norm.weight", p["final_norm"])
    for i in range(d["num_layers"]):
        layer = f"layers/{i}/"
        w.add_tensor(f"blk.{i}.attn_norm.weight", p[layer + "attn_norm"])
        w.add_tensor(f"blk.{i}.attn_q.weight", permuted(p[layer + "attn/q"]))
        w.add_tensor(f"blk.{i}.attn_k.weight", permuted(p[layer + "attn/k"]))
        w.add_tensor(f"blk.{i}.attn_v.weight", p[layer + "attn/v"].reshape(e, -1).T.astype(matrix))
        w.add_tensor(
            f"blk.{i}.attn_output.weight", p[layer + "attn/o"].reshape(-1, e).T.astype(matrix)
        )
        w.add_tensor(f"blk.{i}.ffn_norm.weight", p[layer + "mlp_norm"])
        for part in ("gate", "up", "down"):
            w.add_tensor(f"blk.{i}.ffn_{part}.weight", p[layer + f"mlp/{part}"].T.astype(matrix))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    text = "\n\n".join(open(f, encoding="utf-8").read() for f in held_out_paths().split(","))
    with open(os.path.join(os.path.dirname(out), "heldout.txt"), "w", encoding="utf-8") as f:
        f.write(text)
    print(f"{out}: {os.path.getsize(out):,} bytes; heldout.txt: {len(text.encode()):,} bytes")


def _chunks(text: str, n_ctx: int) -> np.ndarray:
    """`[chunks, n_ctx] int32`: the text's bytes as ids, cut as `llama-perplexity` cuts them."""
    ids = np.frombuffer(open(text, "rb").read(), np.uint8).astype(np.int32)
    return ids[: len(ids) // n_ctx * n_ctx].reshape(-1, n_ctx)


def _restored(path: str, mesh):
    ckpt = open_checkpoint(path)
    model = resolve_architecture(ckpt).model()
    target = mesh_lib.param_targets(model.abstract_params, model.logical_axes, mesh,
                                    DEFAULT_RULES)[0]  # fmt: skip
    return ckpt, model, ckpt.restore(None, target)


def score(path: str, text: str, n_ctx: int) -> None:
    """`llama-perplexity`'s statistic of the GGUF file `path` on `text` (bytes as ids)."""
    chunks = _chunks(text, n_ctx)
    ckpt, model, params = _restored(path, mesh_lib.make_mesh(-1, 1))
    positions = jnp.arange(n_ctx)[None]

    @jax.jit
    def nll(t):
        pos = jnp.broadcast_to(positions, t.shape)[:, :-1]
        return token_nll(model.apply(params, t[:, :-1], pos, jnp.ones_like(pos)), t[:, 1:])

    first = n_ctx // 2
    out = np.concatenate(
        [np.asarray(nll(jnp.asarray(chunks[i : i + 8])), np.float64)[:, first:]
         for i in range(0, len(chunks), 8)]
    )  # fmt: skip
    types = ckpt.quantization(None)["types"]
    print(f"{path}: {len(chunks)} chunks of {n_ctx}, {out.size:,} scored, "
          f"PPL = {np.exp(out.mean()):.6f} ({types})")  # fmt: skip


def _mean_unc(x: np.ndarray) -> tuple[float, float]:
    """Mean and its standard error `sqrt(var / (n - 1))`, var the population variance:
    `llama-perplexity`'s `mean_and_uncertainty`."""
    return float(x.mean()), float(math.sqrt(max(x.var(), 0.0) / (x.size - 1)))


def kl_statistics(nll: np.ndarray, nll_base: np.ndarray, kl: np.ndarray,
                  same_top: np.ndarray) -> dict[str, tuple[float, ...]]:  # fmt: skip
    """Every statistic `llama-perplexity --kl-divergence` prints, in float64, from per-token
    values over the scored tokens (each `[n]`): `nll`, `nll_base` (nats, the copy's and the
    original's -log p of the target), `kl` (nats, KL(original || copy)), `same_top` (bool).

    Returns label -> (value,) or (value, uncertainty), labelled (spaces collapsed) and scaled as
    llama.cpp prints them (Δp, same top p and the correlation in percent). Definitions from
    llama.cpp's tools/perplexity/perplexity.cpp (`kl_divergence`): uncertainties are standard
    errors, the ratio's from the covariance of the two NLLs; percentiles interpolate linearly
    between the sorted values at `fraction * (n - 1)`; Δp = p(target) - p_base(target).
    """
    nll, nll_base, kl = (np.asarray(x, np.float64) for x in (nll, nll_base, kl))
    n = nll.size
    (lq, uq), (lb, ub) = _mean_unc(nll), _mean_unc(nll_base)
    cov = float(np.mean(nll * nll_base) - lq * lb) / (n - 1)
    ppl, ppl_base = math.exp(lq), math.exp(lb)
    ln_ratio, ln_ratio_unc = lq - lb, math.sqrt(uq * uq + ub * ub - 2 * cov)
    rows: dict[str, tuple[float, ...]] = {
        "Mean PPL(Q)": (ppl, ppl * uq),
        "Mean PPL(base)": (ppl_base, ppl_base * ub),
        "Cor(ln(PPL(Q)), ln(PPL(base)))": (100 * cov / (uq * ub),),
        "Mean ln(PPL(Q)/PPL(base))": (ln_ratio, ln_ratio_unc),
        "Mean PPL(Q)/PPL(base)": (math.exp(ln_ratio), math.exp(ln_ratio) * ln_ratio_unc),
        "Mean PPL(Q)-PPL(base)": (ppl - ppl_base, math.sqrt(
            (ppl * uq) ** 2 + (ppl_base * ub) ** 2 - 2 * ppl * ppl_base * cov)),
        "Mean KLD": _mean_unc(kl),
    }  # fmt: skip
    kl_sorted = np.sort(kl)
    rows["Maximum KLD"] = (kl_sorted[-1],)
    for q in (99.9, 99.0, 95.0, 90.0):
        rows[f"{q:.1f}% KLD"] = (np.percentile(kl_sorted, q),)
    rows["Median KLD"] = (np.median(kl_sorted),)
    for q in (10.0, 5.0, 1.0, 0.1):
        rows[f"{q:.1f}% KLD"] = (np.percentile(kl_sorted, q),)
    rows["Minimum KLD"] = (kl_sorted[0],)
    dp = np.exp(-nll) - np.exp(-nll_base)
    rows["Mean Δp"] = tuple(100 * v for v in _mean_unc(dp))
    dp_sorted = np.sort(dp)
    rows["Maximum Δp"] = (100 * dp_sorted[-1],)
    for q in (99.9, 99.0, 95.0, 90.0, 75.0):
        rows[f"{q:.1f}% Δp"] = (100 * np.percentile(dp_sorted, q),)
    rows["Median Δp"] = (100 * np.median(dp_sorted),)
    for q in (25.0, 10.0, 5.0, 1.0, 0.1):
        rows[f"{q:.1f}% Δp"] = (100 * np.percentile(dp_sorted, q),)
    rows["Minimum Δp"] = (100 * dp_sorted[0],)
    mse, mse_unc = _mean_unc(dp * dp)
    rows["RMS Δp"] = (100 * math.sqrt(mse), 100 * 0.5 / math.sqrt(mse) * mse_unc)
    top = float(np.mean(same_top))
    rows["Same top p"] = (100 * top, 100 * math.sqrt(top * (1 - top) / (n - 1)))
    return rows


_ROW = re.compile(r"^\s*(.+?)\s*:\s*(-?[\d.]+)\s*%?\s*(?:±\s*(-?[\d.]+))?")


def llamacpp_statistics(log: str) -> dict[str, tuple[float, ...]]:
    """The final statistics of a `llama-perplexity --kl-divergence` log, label -> numbers."""
    rows = {}
    for line in open(log, encoding="utf-8", errors="replace"):
        m = _ROW.match(line)
        if m and ("KLD" in m[1] or "Δp" in m[1] or "PPL" in m[1] or m[1] == "Same top p"):
            rows[" ".join(m[1].split())] = tuple(float(v) for v in m.groups()[1:] if v is not None)
    return rows


def kl(base: str, copy: str, text: str, n_ctx: int, log: str | None) -> None:
    """`llama-perplexity --kl-divergence`'s statistics of GGUF file `copy` against `base` on
    `text`, from one pass of ppl_jax's scoring step over both models; beside llama.cpp's from
    its log `log` when given."""
    chunks = _chunks(text, n_ctx)
    mesh = mesh_lib.make_mesh(-1, 1)
    t0 = time.perf_counter()
    _, base_model, base_params = _restored(base, mesh)
    ckpt, model, params = _restored(copy, mesh)
    t_load = time.perf_counter() - t0
    first, batch = n_ctx // 2, 8

    @jax.jit
    def step(base_params, params, t):
        pos = jnp.broadcast_to(jnp.arange(n_ctx - 1), t[:, :-1].shape)
        seg = jnp.ones_like(pos)
        s = token_stats(model.apply(params, t[:, :-1], pos, seg), t[:, 1:],
                        reference=base_model.apply(base_params, t[:, :-1], pos, seg))  # fmt: skip
        return s.nll, s.reference_nll, s.kl, s.same_top1

    jax.block_until_ready(step(base_params, params, jnp.asarray(chunks[:batch])))  # compile
    t0 = time.perf_counter()
    parts = [step(base_params, params, jnp.asarray(chunks[i : i + batch]))
             for i in range(0, len(chunks), batch)]  # fmt: skip
    per_token = [np.concatenate([np.asarray(p[k])[:, first:] for p in parts]).ravel()
                 for k in range(4)]  # fmt: skip
    seconds = time.perf_counter() - t0
    ours = kl_statistics(*per_token)
    theirs = llamacpp_statistics(log) if log else {}
    types = ckpt.quantization(None)["types"]
    print(
        f"{copy} ({types}) against {base}: {len(chunks)} chunks of {n_ctx}, "
        f"{per_token[0].size:,} scored; ppl_jax: restore {t_load:.1f} s, both models over "
        f"{chunks.size:,} tokens in {seconds:.1f} s ({chunks.size / seconds:,.0f} tokens/s)"
    )
    print("| statistic | llama.cpp | ppl_jax |\n| --- | --- | --- |")

    def cell(v: tuple[float, ...] | None, places: int) -> str:
        return "" if v is None else " ± ".join(f"{x:.{places}f}" for x in v)

    for label, value in ours.items():  # the decimals llama.cpp prints
        places = 2 if label.startswith("Cor") else 3 if ("Δp" in label or "top" in label) else 6
        print(f"| {label} | {cell(theirs.get(label), places)} | {cell(value, places)} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    e = sub.add_parser("export")
    e.add_argument("out")
    e.add_argument("--dtype", choices=("f32", "f16"), default="f32")
    e.add_argument("--pad", type=int, default=0, help="widths to multiples of this (0: none)")
    s = sub.add_parser("score")
    s.add_argument("path")
    s.add_argument("text")
    s.add_argument("--n_ctx", type=int, default=512)
    k = sub.add_parser("kl")
    k.add_argument("base")
    k.add_argument("copy")
    k.add_argument("text")
    k.add_argument("--n_ctx", type=int, default=512)
    k.add_argument("--llamacpp", help="the log of `llama-perplexity --kl-divergence`")
    args = parser.parse_args()
    if args.command == "export":
        export(args.out, args.dtype, args.pad)
    elif args.command == "score":
        score(args.path, args.text, args.n_ctx)
    else:
        kl(args.base, args.copy, args.text, args.n_ctx, args.llamacpp)


if __name__ == "__main__":
    main()
