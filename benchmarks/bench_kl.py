"""Benchmark: the accuracy and cost of KL(reference || model) per token (issue 19).

    python -m benchmarks.bench_kl

Accuracy: random logits `r` (normal, scale 3, vocabulary 50,257) and a model `l = r + noise`
whose scale gives a mean KL of about 1e-6, 1e-4 and 0.1; the per-token KL of
`ppl_jax.scoring.nll.token_stats` through the vocabulary-blocked scan (the model's logits made
exactly by a one-hot `hidden` times an unembedding holding them, so both sides score the same
float32 numbers) and through full logits, against float64 computed from the same float32 logits;
beside it the former float32 formula `E_p[r - l] - (logsumexp(r) - logsumexp(l))`.
Cost: `token_stats` of a Llama-shaped head (batch 4 x 256, d=512, vocabulary 32,768) without and
with a reference model, best of 8 interleaved runs.
"""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np

from ppl_jax.models import HiddenStates, Logits
from ppl_jax.scoring import nll


def kl_float64(r: np.ndarray, m: np.ndarray) -> np.ndarray:
    def log_softmax(x):
        x = x.astype(np.float64)
        top = x.max(-1, keepdims=True)
        return x - (top + np.log(np.exp(x - top).sum(-1, keepdims=True)))

    lr, lm = log_softmax(r), log_softmax(m)
    return (np.exp(lr) * (lr - lm)).sum(-1)


def kl_former(r: np.ndarray, m: np.ndarray) -> np.ndarray:
    def lse(x):
        top = x.max(-1)
        return top + np.log(np.exp(x - top[:, None]).sum(-1))

    p = np.exp(r - lse(r)[:, None])
    return (p * (r - m)).sum(-1, dtype=np.float32) - (lse(r) - lse(m))


def accuracy(n: int = 256, v: int = 50257) -> None:
    rng = np.random.default_rng(0)
    print("| mean KL (float64) | former float32: max abs error | blocked scan | full logits |")
    print("| ---: | ---: | ---: | ---: |")
    for sigma in (1.4e-3, 1.4e-2, 0.45):
        r = (rng.normal(size=(n, v)) * 3).astype(np.float32)
        m = (r + rng.normal(size=(n, v)) * sigma).astype(np.float32)
        want = kl_float64(r, m)
        targets = jnp.zeros((1, n), jnp.int32)
        blocked = nll.token_stats(
            HiddenStates(jnp.eye(n, dtype=jnp.float32)[None], jnp.asarray(m)),
            targets,
            reference=Logits(r[None]),
        ).kl[0]
        full = nll.token_stats(Logits(m[None]), targets, reference=Logits(r[None])).kl[0]
        errors = [
            np.abs(np.asarray(x, np.float64) - want).max() for x in (kl_former(r, m), blocked, full)
        ]
        print(f"| {want.mean():.3g} | " + " | ".join(f"{e:.1e}" for e in errors) + " |")


def cost(b: int = 4, t: int = 256, d: int = 512, v: int = 32768) -> None:
    rng = np.random.default_rng(0)
    h = jnp.asarray(rng.normal(size=(b, t, d)), jnp.float32)
    w = jnp.asarray(rng.normal(size=(d, v)) * 0.05, jnp.float32)
    w_ref = w + jnp.asarray(rng.normal(size=(d, v)) * 1e-4, jnp.float32)
    targets = jnp.asarray(rng.integers(0, v, size=(b, t)), jnp.int32)
    fns = {
        "without a reference": jax.jit(
            lambda h, w, w_ref, y: nll.token_stats(HiddenStates(h, w), y)
        ),
        "with a reference": jax.jit(
            lambda h, w, w_ref, y: nll.token_stats(
                HiddenStates(h, w), y, reference=HiddenStates(h, w_ref)
            )
        ),
    }
    best = {}
    for name, f in fns.items():
        jax.block_until_ready(f(h, w, w_ref, targets))
        best[name] = float("inf")
    for _ in range(8):
        for name, f in fns.items():
            t0 = time.perf_counter()
            jax.block_until_ready(f(h, w, w_ref, targets))
            best[name] = min(best[name], time.perf_counter() - t0)
    for name, seconds in best.items():
        print(f"{name}: {seconds * 1e3:.0f} ms, {b * t / seconds:,.0f} tokens/s")


if __name__ == "__main__":
    print(jax.devices()[0].device_kind)
    accuracy()
    cost()
