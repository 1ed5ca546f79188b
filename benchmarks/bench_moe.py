"""Benchmark: the grouped MoE layer (`ppl_jax.models.layers.moe.dropless.moe_mlp`) against a dense
loop over all experts and against a dense SwiGLU MLP of the same active width, on this machine.

    python -m benchmarks.bench_moe                       # both shapes below, float32
    python -m benchmarks.bench_moe --shapes=qwen3 --tokens=8192 --repeats=5

Shapes (scaled to a 2-core CPU; routing as the families they are named after):
- `mixtral`: embed 512, 8 experts of width 1024, top 2 (active width 2048);
- `qwen3`: embed 512, 64 experts of width 128, top 8, `norm_topk_prob` (active width 1024).

Per shape, on the same random weights and `--tokens` random hidden states, float32, jitted, each
timed as the median of `--repeats` calls after one warm-up call (compilation excluded), the
three variants taking turns in each round:
- `grouped`: ppl_jax's dropless layer (routing, sort by expert, expert tiles on CPU, combine);
- `all experts`: the same routing, then every expert on every token (a loop over experts adding
  each weighted output; unselected experts weigh 0), as an implementation without grouping does;
- `dense`: one SwiGLU MLP of width top_k x expert width: the same active parameters per token;
- `narrow dense`: one SwiGLU MLP of the expert width on top_k x tokens rows: the same products
  as the grouped layer's, in one call without routing, gathers or loops; on a CPU, what a dot of
  the expert's width achieves bounds the grouped layer.
Tokens/s, and tokens/s x active parameters (the MLP weights a token passes through: 3 x embed x
width x top_k, plus the router) in G parameter-tokens/s, so that the grouped layer and the dense
MLP compare per active parameter. Writes the numbers as JSON to `--out`.
"""

from __future__ import annotations

import json
import time

import jax
import jax.numpy as jnp
import numpy as np
from absl import app, flags

from ppl_jax.models.layers.moe import dropless

SHAPES = {
    "mixtral": dict(embed=512, mlp=1024, experts=8, top_k=2, norm=True),
    "qwen3": dict(embed=512, mlp=128, experts=64, top_k=8, norm=True),
}
_SHAPES = flags.DEFINE_list("shapes", list(SHAPES), "Shapes to run.")
_TOKENS = flags.DEFINE_integer("tokens", 4096, "Tokens per call.")
_REPEATS = flags.DEFINE_integer("repeats", 5, "Timed calls per variant (median).")
_OUT = flags.DEFINE_string("out", "bench_moe_results.json", "Where to write the JSON results.")


def all_experts(x, router, gate, up, down, *, top_k, norm_topk_prob):
    """Every expert on every token, weighted by the routing (0 for unselected experts)."""
    weights, chosen = dropless.route(x, router, top_k, norm_topk_prob)
    num_experts = router.shape[1]
    per_expert = jnp.zeros((x.shape[0], num_experts), jnp.float32)
    per_expert = per_expert.at[jnp.arange(x.shape[0])[:, None], chosen].add(weights)

    def body(e, out):
        y = jnp.dot(jax.nn.silu(jnp.dot(x, gate[e])) * jnp.dot(x, up[e]), down[e])
        return out + per_expert[:, e, None] * y

    return jax.lax.fori_loop(0, num_experts, body, jnp.zeros(x.shape, jnp.float32))


def dense(x, gate, up, down):
    return jnp.dot(jax.nn.silu(jnp.dot(x, gate)) * jnp.dot(x, up), down)


def timed(calls: dict, repeats: int) -> dict[str, float]:
    """Median seconds per call of each jitted `fn(*args)` of `calls` (name -> (fn, args)), after a
    warm-up call each; the variants take turns in each round, so that other work on the machine
    slows them alike."""
    for fn, args in calls.values():
        jax.block_until_ready(fn(*args))
    times: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(repeats):
        for name, (fn, args) in calls.items():
            start = time.perf_counter()
            jax.block_until_ready(fn(*args))
            times[name].append(time.perf_counter() - start)
    return {name: float(np.median(t)) for name, t in times.items()}


def run_shape(name: str, tokens: int, repeats: int) -> dict:
    s = SHAPES[name]
    d, f, e, k = s["embed"], s["mlp"], s["experts"], s["top_k"]
    rng = np.random.default_rng(0)
    draw = lambda *shape: jnp.asarray(rng.standard_normal(shape) * shape[-2] ** -0.5, jnp.float32)  # noqa: E731
    x = draw(tokens, d) * d**0.5
    router, gate, up, down = draw(d, e), draw(e, d, f), draw(e, d, f), draw(e, f, d)
    kw = dict(top_k=k, norm_topk_prob=s["norm"])
    grouped_fn = jax.jit(lambda *a: dropless.moe_mlp(*a, **kw))
    all_fn = jax.jit(lambda *a: all_experts(*a, **kw))
    y_grouped = grouped_fn(x, router, gate, up, down)
    y_all = all_fn(x, router, gate, up, down)
    agreement = float(jnp.max(jnp.abs(y_grouped - y_all)) / jnp.max(jnp.abs(y_all)))
    dense_w = draw(d, k * f), draw(d, k * f), draw(k * f, d)
    args = (x, router, gate, up, down)
    calls = {"grouped": (grouped_fn, args), "all experts": (all_fn, args)}
    calls["dense"] = (jax.jit(dense), (x, *dense_w))
    calls["narrow dense"] = (jax.jit(dense), (jnp.tile(x, (k, 1)), gate[0], up[0], down[0]))
    seconds = timed(calls, repeats)
    active = {"grouped": 3 * d * f * k + d * e, "all experts": 3 * d * f * k + d * e}
    active["dense"] = active["narrow dense"] = 3 * d * f * k
    rows = {
        v: {
            "tokens_per_s": tokens / t,
            "g_param_tokens_per_s": tokens * active[v] / t / 1e9,
            "active_params": active[v],
        }
        for v, t in seconds.items()
    }
    return {"shape": s, "tokens": tokens, "max_rel_diff_grouped_vs_all": agreement, **rows}


def main(argv) -> None:
    del argv
    results = {
        "backend": jax.default_backend(),
        "devices": len(jax.devices()),
        "jax": jax.__version__,
    }
    for name in _SHAPES.value:
        results[name] = r = run_shape(name, _TOKENS.value, _REPEATS.value)
        print(
            f"{name} ({r['tokens']} tokens, grouped vs all-experts rel. diff "
            f"{r['max_rel_diff_grouped_vs_all']:.1e})"
        )
        for v in ("grouped", "all experts", "dense", "narrow dense"):
            print(
                f"  {v:12s} {r[v]['tokens_per_s']:10.0f} tokens/s "
                f"{r[v]['g_param_tokens_per_s']:7.2f} G param-tokens/s"
            )
        print(
            f"  grouped / all experts: {r['grouped']['tokens_per_s'] / r['all experts']['tokens_per_s']:.2f}x;"
            f" grouped / dense per active parameter: "
            f"{r['grouped']['g_param_tokens_per_s'] / r['dense']['g_param_tokens_per_s']:.2f}"
            f" (narrow dense / dense: "
            f"{r['narrow dense']['g_param_tokens_per_s'] / r['dense']['g_param_tokens_per_s']:.2f})"
        )
    with open(_OUT.value, "w", encoding="utf-8") as f:
        json.dump(results, f, indent=1)


if __name__ == "__main__":
    app.run(main)
